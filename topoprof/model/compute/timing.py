"""One GPU's time per micro-batch (measured, priced from the model's own ops, or FLOPs over
peak x utilization) and per optimizer step (memory traffic over bandwidth, or measured): the
`Compute` a prediction takes, and `compute_times` that turns it into seconds.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topoprof.errors import InputError
from topoprof.model.compute.datasheet import PRECISIONS, GpuSpec, NamedGpu, named_gpu
from topoprof.model.compute.modelled import ModelledCompute

# Backward ~= 2x forward: C ~= 6N per token = 2N forward + 4N backward (Kaplan et al. 2020,
# "Scaling Laws for Neural Language Models", §2.1).
DEFAULT_BACKWARD_FRACTION = 2 / 3

# Datasheet peak x utilization is only a what-if for a GPU that is not here (on a GPU the compute
# is measured). The share of peak a training step reaches spans more than an order of magnitude,
# so the what-if is a range, never one number:
#  - 3 %: the lowest share an eager bf16 training loop (fp32 master weights, fused AdamW) reached
#    on one H100 80GB HBM3 for GPT-2-small, GPT-2-medium and BERT-base shapes at 1 to 16
#    sequences x 1024 tokens per micro-batch (21 % its highest): small models and micro-batches
#    leave the GPU waiting on kernel launches and memory;
#  - 52 %: the best sustained share reported for large-model training, Megatron-LM's 163 of
#    312 TFLOP/s per A100 (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
#    Clusters Using Megatron-LM", SC'21).
UTILIZATION_RANGE = (0.03, 0.52)

UTILIZATION_BASIS = ("3 % (an eager bf16 loop of GPT-2/BERT shapes on one H100) to 52 % (Megatron-LM's best, "
                     "Narayanan et al. 2021)")

# Where one number is needed (a table row, a sweep): the middle of the range on a log scale.
DEFAULT_UTILIZATION = math.sqrt(UTILIZATION_RANGE[0] * UTILIZATION_RANGE[1])

STATE_BYTES = 4  # fp32 parameters and optimizer state

# Optimizer memory traffic per parameter, in fp32 words besides the gradient read: AdamW reads
# param, exp_avg, exp_avg_sq and writes all three (7 x 4 B with an fp32 grad; torch/optim/
# adamw.py, adam.py foreach/fused kernels approach this); SGD with momentum reads and writes
# param and momentum_buffer; plain SGD reads and writes param (torch/optim/sgd.py).
OPTIMIZER_STATE_WORDS = {"adamw": 6, "adam": 6, "sgd_momentum": 4, "sgd": 2}

MEMORY_UNKNOWN_NOTE = "memory bandwidth unknown: DDP bucket copies and fp16 casts count as 0 s"

# Without a measured optimizer time or a memory bandwidth to estimate it, T_opt is taken as 0:
# the step times then exclude the optimizer, which the echo and a warning say.
OPTIMIZER_UNKNOWN_SOURCE = "unknown: assumed 0 s; give --optimizer-time or --gpu"

OPTIMIZER_UNKNOWN_NOTE = ("optimizer time unknown: assumed 0 s, so step times exclude the "
                          "optimizer step; give --optimizer-time SECONDS (measured) or --gpu NAME")

# FSDP's own work per group as `validate` measures it (the Compute fields of the same names)
FSDP_OVERHEAD_KEYS = ("fsdp_forward_overhead_s", "fsdp_backward_overhead_s", "fsdp_backward_no_sync_overhead_s",
                      "fsdp_unshard_overhead_s")

CALIBRATION_KEYS = ("micro_batch_time_s", "optimizer_time_s", "backward_fraction",
                    "compute_slowdown_during_comm", "comm_slowdown_during_compute",
                    "memory_bandwidth_gbps", "ddp_overhead_s", "comm_slowdown_by_size",
                    "ddp_copy_bandwidth_gbps", "ddp_kernel_s", "rank_speed_spread", "rank_jitter",
                    "rank_spread_world_size", *FSDP_OVERHEAD_KEYS, "fsdp_optimizer_time_s")


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise InputError(message)


@dataclass(frozen=True)
class Compute:
    """Per-GPU compute: measured, from FLOPs and a datasheet, or from a calibration."""

    micro_batch_time_s: float | None = None  # forward + backward of one micro-batch
    gpu: str | None = None  # a name for the datasheet table (peak FLOP/s, memory bandwidth)
    precision: str = "bf16"
    peak_tflops: float | None = None  # overrides the datasheet peak
    utilization: float | None = None  # None = DEFAULT_UTILIZATION (an assumption)
    backward_fraction: float | None = None  # None = DEFAULT_BACKWARD_FRACTION
    optimizer: str = "adamw"
    optimizer_time_s: float | None = None
    memory_bandwidth_gbps: float | None = None  # overrides the datasheet figure
    compute_slowdown_during_comm: float = 1.0  # backward runs 1/x as fast while comm is in flight
    comm_slowdown_during_compute: float = 1.0  # an all-reduce runs 1/x as fast beside backward
    # The same factor measured at several all-reduce sizes ((bytes, factor), by size): beside
    # compute a small all-reduce loses more than a large one. When given, it decides per size.
    comm_slowdown_by_size: tuple[tuple[float, float], ...] = ()
    dp_thread_overhead_s: float = 0.0  # DataParallel's per-micro-batch Python-thread/GIL cost
    # DDP's own compute per micro-batch (its forward and gradient hooks, nothing communicated),
    # measured by `topoprof validate`: the same micro-batch through DDP inside no_sync() minus
    # through the bare module. 0 unless measured.
    ddp_overhead_s: float = 0.0
    # The rate of DDP's bucket copies (their traffic, `ddp_copy_bytes`, over their measured time:
    # a synced micro-batch through a hook that communicates nothing, less the same inside
    # no_sync()). None: the copies run at memory_bandwidth_gbps.
    ddp_copy_bandwidth_gbps: float | None = None
    # DDP's fixed cost per kernel its reducer launches (topoprof.model.ddp.gpu_costs), measured; None:
    # on a known GPU the cited what-if range, elsewhere counted in the measured copies or 0.
    ddp_kernel_s: float | None = None
    # The ranks' spread, measured by `validate` (topoprof.model.ddp.gpu_costs.straggler_wait_s): the
    # standard deviation of their persistent speeds, None when not measured; of one micro-batch's
    # time around its rank's level; both as shares of the micro-batch; and how many ranks' slowest
    # the measured compute already is.
    rank_speed_spread: float | None = None
    rank_jitter: float = 0.0
    rank_spread_world_size: int = 1
    gpu_memory_gb: float | None = None  # the GPU's memory (NVML, or given); None: from `gpu`'s datasheet
    # FSDP's own work on the compute stream (its hooks, the all-gather's and the reduce-scatter's
    # buffer copies, the gradient views), measured by `validate` through collectives that
    # communicate nothing (topoprof.model.fsdp.timeline.FsdpOverhead): per group per forward, per synced
    # backward, per backward under no_sync, per all-gather again in backward. None: not measured
    # (the buffer copies are priced from memory bandwidth instead, the hooks not at all).
    fsdp_forward_overhead_s: float | None = None
    fsdp_backward_overhead_s: float | None = None
    fsdp_backward_no_sync_overhead_s: float | None = None
    fsdp_unshard_overhead_s: float | None = None
    # The optimizer step on FSDP's shards, measured (it runs on DTensors); None: T_opt / shards.
    fsdp_optimizer_time_s: float | None = None
    calibrated: tuple[str, ...] = ()  # fields that came from a calibration, for the report
    origins: tuple[tuple[str, str], ...] = ()  # (field, where it was measured) for the report
    # Compute priced from the model's own ops (`topoprof.model.compute.roofline`): forward + backward per
    # micro-batch at the (fast, middle, slow) end of its cited ranges, with its basis, backward
    # share and details. It is the compute where nothing measured it and no utilization is given
    # (a what-if range, not the datasheet's 3-52 %); beside a measured time it is shown, with the gap.
    modelled: ModelledCompute | None = None
    # `gpu` with its datasheet row, looked up once here for everything that prices or sizes by it
    named: NamedGpu | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "named", named_gpu(self.gpu))
        for name in ("micro_batch_time_s", "peak_tflops", "memory_bandwidth_gbps", "ddp_copy_bandwidth_gbps"):
            value = getattr(self, name)
            _need(value is None or value > 0, f"{name} must be > 0, got {value}")
        # 0 is a legitimate optimizer time: a measurement floor, or a what-if without it
        _need(self.optimizer_time_s is None or self.optimizer_time_s >= 0,
              f"optimizer_time_s must be >= 0, got {self.optimizer_time_s}")
        _need(self.dp_thread_overhead_s >= 0,
              f"dp_thread_overhead_s must be >= 0, got {self.dp_thread_overhead_s}")
        _need(self.ddp_overhead_s >= 0, f"ddp_overhead_s must be >= 0, got {self.ddp_overhead_s}")
        for name in ("ddp_kernel_s", "rank_speed_spread", *FSDP_OVERHEAD_KEYS, "fsdp_optimizer_time_s"):
            value = getattr(self, name)
            _need(value is None or value >= 0, f"{name} must be >= 0, got {value}")
        _need(self.rank_jitter >= 0, f"rank_jitter must be >= 0, got {self.rank_jitter}")
        _need(isinstance(self.rank_spread_world_size, int) and self.rank_spread_world_size >= 1,
              f"rank_spread_world_size must be an integer >= 1, got {self.rank_spread_world_size}")
        _need(self.utilization is None or 0 < self.utilization <= 1,
              f"utilization must be in (0, 1], got {self.utilization}")
        _need(self.backward_fraction is None or 0 < self.backward_fraction < 1,
              f"backward_fraction must be in (0, 1), got {self.backward_fraction}")
        seconds = self.modelled.seconds if self.modelled is not None else None
        _need(seconds is None or (len(seconds) == 3 and 0 < seconds[0] <= seconds[1] <= seconds[2]),
              f"modelled seconds must be (fast, middle, slow) > 0 in that order, got {seconds}")
        _need(self.compute_slowdown_during_comm >= 1, "compute_slowdown_during_comm must be "
              f">= 1, got {self.compute_slowdown_during_comm}")
        _need(self.comm_slowdown_during_compute >= 1, "comm_slowdown_during_compute must be "
              f">= 1, got {self.comm_slowdown_during_compute}")
        _need(all(size > 0 and factor >= 1 for size, factor in self.comm_slowdown_by_size),
              f"comm_slowdown_by_size needs sizes > 0 and factors >= 1, got {self.comm_slowdown_by_size}")
        object.__setattr__(self, "comm_slowdown_by_size",
                           tuple(sorted((float(a), float(b)) for a, b in self.comm_slowdown_by_size)))
        _need(self.precision in PRECISIONS,
              f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        _need(self.optimizer in OPTIMIZER_STATE_WORDS, "optimizer must be one of "
              f"{', '.join(OPTIMIZER_STATE_WORDS)}, got {self.optimizer!r}")

    @classmethod
    def from_calibration(cls, calibration: Mapping[str, float], **kwargs: Any) -> Compute:
        """Numbers measured by `topoprof validate` (keys CALIBRATION_KEYS); kwargs add the rest."""
        unknown = sorted(set(calibration) - set(CALIBRATION_KEYS))
        _need(not unknown, f"unknown calibration keys {unknown}; "
              f"valid: {', '.join(CALIBRATION_KEYS)}")
        values = {**kwargs, **calibration, "calibrated": tuple(sorted(calibration))}
        if "rank_spread_world_size" in calibration:  # JSON may carry it as a float
            values["rank_spread_world_size"] = int(calibration["rank_spread_world_size"])
        return cls(**values)

    def origin(self, name: str) -> str:
        return dict(self.origins).get(name) or ("calibration" if name in self.calibrated else "given")


@dataclass(frozen=True)
class ComputeTimes:
    micro_batch_s: float
    backward_s: float
    optimizer_s: float
    memory_bandwidth_gbps: float | None
    echo: dict[str, tuple[Any, str]]  # value and where it came from
    warnings: tuple[str, ...]


def _gpu(compute: Compute, notes: list[str]) -> GpuSpec | None:
    """The datasheet row of the GPU predicted for; where it has none, the note saying why."""
    named = compute.named
    if named is None:
        return None
    if named.why is not None:
        notes.append(named.why)
    return named.row


MODELLED_SOURCE = "what-if from the model's own ops"


def uses_modelled(comp: Compute) -> bool:
    """The compute is the roofline's range: nothing measured it and no utilization is given."""
    return comp.micro_batch_time_s is None and comp.utilization is None and comp.modelled is not None


def _echo_compute_model(modelled: ModelledCompute, echo: dict) -> None:
    """What pricing the model's ops found, beside the seconds echoed from it."""
    echo["compute_model"] = (modelled.detail.echoed(), "topoprof.model.compute.roofline over the model's op trace")


def _micro_batch_s(comp: Compute, spec: GpuSpec | None, flops_per_token: float,
                   tokens: int | None, echo: dict, unit: str = "token", end: str | None = None) -> float:
    if comp.micro_batch_time_s is not None:
        source = f"measured ({comp.origin('micro_batch_time_s')})"
        echo["micro_batch_time_s"] = (comp.micro_batch_time_s, source)
        if comp.modelled is not None:  # measured beats modelled; the gap checks the what-if
            fast, middle, slow = comp.modelled.seconds
            gap = comp.micro_batch_time_s / middle - 1
            inside = "inside" if fast <= comp.micro_batch_time_s <= slow else "outside"
            echo["micro_batch_time_modelled_s"] = ([fast, middle, slow], (
                f"{MODELLED_SOURCE} (not used: measured beats modelled): {comp.modelled.basis}; the measured "
                f"time is {gap:+.0%} of its middle, {inside} its range"))
            _echo_compute_model(comp.modelled, echo)
        return comp.micro_batch_time_s
    if uses_modelled(comp):
        assert comp.modelled is not None
        fast, middle, slow = comp.modelled.seconds
        seconds = {None: middle, "fast": fast, "slow": slow}[end]
        echo["micro_batch_time_s"] = (seconds, f"the middle of the {MODELLED_SOURCE}: {comp.modelled.basis}")
        echo["micro_batch_time_range_s"] = ((fast, slow), f"{MODELLED_SOURCE}: {comp.modelled.basis}")
        _echo_compute_model(comp.modelled, echo)
        return seconds
    peak, peak_src = comp.peak_tflops, "given"
    if peak is None and spec is not None:
        peak = spec.peak_tflops(comp.precision)
        peak_src = f"{spec.name} {comp.precision} dense: {spec.source}"
        _need(peak is not None, f"{spec.name} has no {comp.precision} tensor cores; "
              "choose another precision")
    _need(peak is not None and tokens is not None, "compute per micro-batch: give "
          "micro_batch_time_s, or tokens_per_micro_batch with a known gpu or peak_tflops")
    assert peak is not None and tokens is not None
    util = comp.utilization if comp.utilization is not None else DEFAULT_UTILIZATION
    flops = flops_per_token * tokens
    seconds = flops / (peak * 1e12 * util)
    per = (f"6 x matmul params x {tokens} tokens" if unit == "token" else
           f"{flops_per_token:.4g} forward + backward per {unit} x {tokens} {unit}s")
    echo["micro_batch_time_s"] = (seconds, f"{flops:.4g} FLOPs ({per}) / ({peak} TFLOP/s x utilization {util:.3g})")
    echo["peak_tflops"] = (peak, peak_src)
    if comp.utilization is not None:
        echo["utilization"] = (util, "given")
    else:
        low, high = UTILIZATION_RANGE
        echo["utilization"] = (util, "an assumption, not a measurement: the middle (log scale) of the what-if range "
                               f"{UTILIZATION_BASIS}")
        echo["micro_batch_time_range_s"] = ((flops / (peak * 1e12 * high), flops / (peak * 1e12 * low)),
                                            f"datasheet what-if: peak x utilization from {UTILIZATION_BASIS}")
    return seconds


def utilization_is_assumed(comp: Compute) -> bool:
    """Compute from a datasheet with no measured time and no given utilization: a what-if range."""
    return comp.micro_batch_time_s is None and comp.utilization is None


def _optimizer_s(comp: Compute, params: int, grad_bytes: int, bandwidth: float | None,
                 echo: dict, notes: list[str], end: str | None = None) -> float:
    if comp.optimizer_time_s is not None:
        source = f"measured ({comp.origin('optimizer_time_s')})"
        echo["optimizer_time_s"] = (comp.optimizer_time_s, source)
        return comp.optimizer_time_s
    profiled = comp.modelled.detail.optimizer if uses_modelled(comp) and comp.modelled is not None else None
    if profiled:  # a what-if priced from a device profile: its optimizer's rate and host cost per tensor
        per_param = OPTIMIZER_STATE_WORDS[comp.optimizer] * STATE_BYTES + grad_bytes
        # at an end of the what-if: the rate's and the host cost's ends that make the step fast, or slow
        rates, hosts = sorted(profiled.bytes_per_s), sorted(profiled.host_per_tensor_s)
        rate, host = ((rates[1], hosts[0]) if end == "fast" else (rates[0], hosts[1]) if end == "slow"
                      else (math.sqrt(math.prod(rates)), math.sqrt(math.prod(hosts))))
        seconds = profiled.tensors * host + per_param * params / rate
        echo["optimizer_time_s"] = (seconds, f"{comp.optimizer}: {profiled.tensors} tensors x {host * 1e6:.3g} us + "
                                             f"{per_param} B/param x {params} params / {rate / 1e9:.4g} GB/s, from the "
                                             f"device profile ({profiled.basis})")
        return seconds
    if bandwidth is None:  # nothing to estimate it from: assume 0 and say so (echo, warning)
        echo["optimizer_time_s"] = (0.0, OPTIMIZER_UNKNOWN_SOURCE)
        notes.append(OPTIMIZER_UNKNOWN_NOTE)
        return 0.0
    per_param = OPTIMIZER_STATE_WORDS[comp.optimizer] * STATE_BYTES + grad_bytes
    seconds = per_param * params / (bandwidth * 1e9)
    echo["optimizer_time_s"] = (seconds, f"{comp.optimizer}: {per_param} B/param of memory "
                                f"traffic x {params} params / {bandwidth} GB/s")
    return seconds


def _backward_fraction(comp: Compute) -> tuple[float, str]:
    """Backward's share of a micro-batch, and where it comes from."""
    if comp.backward_fraction is not None:
        return comp.backward_fraction, comp.origin("backward_fraction")
    if uses_modelled(comp) and comp.modelled is not None and comp.modelled.backward_fraction is not None:
        return comp.modelled.backward_fraction, f"the backward's share of the {MODELLED_SOURCE} (middle)"
    return DEFAULT_BACKWARD_FRACTION, "default: backward = 2x forward (Kaplan et al. 2020 §2.1)"


def compute_times(comp: Compute, params: int, flops_per_token: float, tokens: int | None,
                  grad_bytes: int, unit: str = "token", end: str | None = None) -> ComputeTimes:
    """c, T_bwd, T_opt and memory bandwidth, each echoed with its source; `tokens` of `unit`
    (a Layout's: "token", or "image" for an image model) per micro-batch. `end` ("fast" or
    "slow") takes the modelled compute at that end of its range; None, its middle."""
    notes: list[str] = []
    echo: dict[str, tuple[Any, str]] = {}
    spec = _gpu(comp, notes)
    bandwidth, bw_src = comp.memory_bandwidth_gbps, "given"
    if bandwidth is None and spec is not None:
        bandwidth, bw_src = spec.memory_bandwidth_gbps, f"{spec.name}: {spec.source}"
    if bandwidth is None:
        bw_src = "unknown: DDP bucket copies and fp16 casts count as 0 s"
        notes.append(MEMORY_UNKNOWN_NOTE)
    # the backward's share and the optimizer read nothing of the micro-batch's time: found first,
    # echoed after it
    fraction, fraction_source = _backward_fraction(comp)
    optimizer_echo: dict[str, tuple[Any, str]] = {}
    t_opt = _optimizer_s(comp, params, grad_bytes, bandwidth, optimizer_echo, notes, end)
    echo["memory_bandwidth_gbps"] = (bandwidth, bw_src)
    c = _micro_batch_s(comp, spec, flops_per_token, tokens, echo, unit, end)
    echo["backward_fraction"] = (fraction, fraction_source)
    echo.update(optimizer_echo)
    slowdown = comp.compute_slowdown_during_comm
    comm_slow = comp.comm_slowdown_during_compute
    echo["comm_slowdown_during_compute"] = (comm_slow, "default: no interference" if comm_slow == 1
                                            else comp.origin("comm_slowdown_during_compute"))
    echo["compute_slowdown_during_comm"] = (slowdown, "default: no interference" if slowdown == 1
                                            else comp.origin("compute_slowdown_during_comm"))
    return ComputeTimes(c, fraction * c, t_opt, bandwidth, echo, tuple(notes))
