"""One GPU: peak arithmetic and memory bandwidth from datasheets, and the time it takes per
micro-batch (measured, or FLOPs over peak x utilization) and per optimizer step (memory traffic
over bandwidth, or measured).

One table keyed by a normalized name; `lookup_gpu` maps what `nvidia-smi --query-gpu=name`
prints (or a short name a user types) to a row. An unknown or ambiguous name gives `None` and a
warning, never a borrowed number.

Figures are *dense* (no structured sparsity): where a datasheet prints only the "with sparsity"
tensor figure (marked * on the sheet), the dense figure is half of it, as the sheet's footnote
says. GeForce cards are listed with FP32 accumulate, which mixed-precision training uses
(torch.autocast matmuls accumulate in FP32); their FP16-accumulate figure is twice as high.
TFLOP/s = 1e12 FLOP/s; GB/s = 1e9 B/s.
"""
from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topoprof.errors import InputError

PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. `None` where the hardware has no such unit (V100/T4 have no BF16)."""

    name: str
    bf16_tensor_tflops: float | None
    fp16_tensor_tflops: float | None
    fp32_tflops: float
    memory_bandwidth_gbps: float
    source: str
    compute_capability: tuple[int, int] | None = None  # (major, minor), `_COMPUTE_CAPABILITY`

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak for the training precision: bf16/fp16 tensor cores, or plain FP32."""
        return {
            "bf16": self.bf16_tensor_tflops,
            "fp16": self.fp16_tensor_tflops,
            "fp32": self.fp32_tflops,
        }[precision]


_V100_SHEET = ("NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/"
               "volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")
_A100_SHEET = ("NVIDIA A100 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
               "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H100_SHEET = ("NVIDIA H100 datasheet (BF16/FP16 printed with sparsity; dense = half), "
               "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_H200_PAGE = ("NVIDIA H200 product page/datasheet (BF16/FP16 printed with sparsity; dense = half), "
              "https://www.nvidia.com/en-us/data-center/h200/")

# name: (bf16 dense TFLOP/s, fp16 dense TFLOP/s, fp32 TFLOP/s, memory GB/s, source)
_TABLE: dict[str, tuple[float | None, float | None, float, float, str]] = {
    # V100: "Tensor Performance" 125 (SXM2) / 112 (PCIe) TFLOPS fp16; no bf16; HBM2 900 GB/s.
    "v100-sxm2": (None, 125.0, 15.7, 900.0, _V100_SHEET),
    "v100-pcie": (None, 112.0, 14.0, 900.0, _V100_SHEET),
    # A100: BF16/FP16 tensor 312 dense; FP32 19.5; 40GB 1,555 GB/s, 80GB SXM 2,039, 80GB PCIe 1,935.
    "a100-sxm4-40gb": (312.0, 312.0, 19.5, 1555.0, _A100_SHEET),
    "a100-sxm4-80gb": (312.0, 312.0, 19.5, 2039.0, _A100_SHEET),
    "a100-pcie-40gb": (312.0, 312.0, 19.5, 1555.0, _A100_SHEET),
    "a100-pcie-80gb": (312.0, 312.0, 19.5, 1935.0, _A100_SHEET),
    # H100 SXM: BF16 1,979* -> 989.5 dense; FP32 67; 3.35 TB/s. PCIe: 1,513* -> 756.5; 51; 2 TB/s.
    "h100-sxm": (989.5, 989.5, 67.0, 3350.0, _H100_SHEET),
    "h100-pcie": (756.5, 756.5, 51.0, 2000.0, _H100_SHEET),
    # H100 NVL: BF16 1,671* -> 835.5 dense; FP32 60; 3.9 TB/s.
    "h100-nvl": (835.5, 835.5, 60.0, 3900.0, _H100_SHEET),
    # H200 SXM: BF16 1,979* -> 989.5 dense; FP32 67; 4.8 TB/s.
    "h200-sxm": (989.5, 989.5, 67.0, 4800.0, _H200_PAGE),
    # H200 NVL: BF16 1,671* -> 835.5 dense; FP32 60; 4.8 TB/s.
    "h200-nvl": (835.5, 835.5, 60.0, 4800.0, _H200_PAGE),
    # L40S: BF16/FP16 tensor 362.05 dense (733* sparse); FP32 91.6; GDDR6 864 GB/s.
    "l40s": (362.05, 362.05, 91.6, 864.0,
             "NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    # A10: BF16/FP16 tensor 125 dense (250*); FP32 31.2; 600 GB/s.
    "a10": (125.0, 125.0, 31.2, 600.0,
            "NVIDIA A10 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
            "Data-Center/a10/pdf/a10-datasheet.pdf"),
    # L4: BF16/FP16 tensor 242* -> 121 dense; FP32 30.3; 300 GB/s.
    "l4": (121.0, 121.0, 30.3, 300.0,
           "NVIDIA L4 datasheet, https://resources.nvidia.com/en-us-data-center-overview/"
           "l4-gpu-datasheet"),
    # T4: "Mixed Precision (FP16/FP32) 65 TFLOPS"; FP32 8.1; "320+ GB/s"; no bf16.
    "t4": (None, 65.0, 8.1, 320.0,
           "NVIDIA T4 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
           "Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    # RTX 4090: FP16/BF16 tensor with FP32 accumulate 165.2 dense; FP32 82.6; 1,008 GB/s.
    "rtx-4090": (165.2, 165.2, 82.6, 1008.0,
                 "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A, Table 2 "
                 "(GeForce RTX 4090)"),
    # RTX 3090: FP16/BF16 tensor with FP32 accumulate 71 dense; FP32 35.6; 936 GB/s.
    "rtx-3090": (71.0, 71.0, 35.6, 936.0,
                 "NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0, Table 9 "
                 "(GeForce RTX 3090)"),
}

# CUDA compute capability of each row (NVIDIA, "CUDA GPUs - Compute Capability",
# https://developer.nvidia.com/cuda-gpus): V100 7.0, T4 7.5, A100 8.0, A10 and RTX 30xx 8.6,
# L4, L40S and RTX 40xx 8.9, H100 and H200 9.0. It names the NVLink generation, whose per-link
# rate NCCL keys by it (`topoprof.topology.constants.NVLINK_GBPS_BY_SM`).
_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "v100-sxm2": (7, 0), "v100-pcie": (7, 0),
    "a100-sxm4-40gb": (8, 0), "a100-sxm4-80gb": (8, 0), "a100-pcie-40gb": (8, 0), "a100-pcie-80gb": (8, 0),
    "h100-sxm": (9, 0), "h100-pcie": (9, 0), "h100-nvl": (9, 0),
    "h200-sxm": (9, 0), "h200-nvl": (9, 0),
    "l40s": (8, 9), "a10": (8, 6), "l4": (8, 9), "t4": (7, 5),
    "rtx-4090": (8, 9), "rtx-3090": (8, 6),
}

# GPU memory in GB (1e9 B) per row, from the same datasheets: V100 16 or 32 (the name printed by
# the driver says which; a bare "v100-sxm2" is taken as the smaller), A100 40/80, H100 SXM and
# PCIe 80, H100 NVL 94, H200 141, L40S 48, A10 24, L4 24, T4 16, RTX 4090 24, RTX 3090 24.
_MEMORY_GB: dict[str, float] = {
    "v100-sxm2": 16, "v100-pcie": 16, "a100-sxm4-40gb": 40, "a100-sxm4-80gb": 80, "a100-pcie-40gb": 40,
    "a100-pcie-80gb": 80, "h100-sxm": 80, "h100-pcie": 80, "h100-nvl": 94, "h200-sxm": 141, "h200-nvl": 141,
    "l40s": 48, "a10": 24, "l4": 24, "t4": 16, "rtx-4090": 24, "rtx-3090": 24,
}


def gpu_memory_gb(name: str) -> tuple[float, str] | None:
    """(GB, basis) of a GPU named as `lookup_gpu` takes it: the size in the name when it has one
    ("Tesla V100-SXM2-32GB"), else the datasheet row's; None for an unknown name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = lookup_gpu(name)
    if spec is None:
        return None
    sized = re.search(r"(\d+)gb", normalize_gpu_name(name))
    if sized:
        return float(sized.group(1)), f"{sized.group(1)} GB in the name {name!r}"
    note = " (the smaller of its sizes: give the full name, e.g. V100-SXM2-32GB)" if spec.name.startswith("v100") else ""
    return float(_MEMORY_GB[spec.name]), f"{spec.name} datasheet{note}"


# Normalized `nvidia-smi --query-gpu=name` strings (and common short names) -> table key.
# The names are the ones the driver prints, e.g. "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB".
_ALIASES: dict[str, str] = {
    "v100-sxm2-16gb": "v100-sxm2", "v100-sxm2-32gb": "v100-sxm2",
    "v100-pcie-16gb": "v100-pcie", "v100-pcie-32gb": "v100-pcie",
    "a100-pcie-80gb": "a100-pcie-80gb", "a100-80gb-pcie": "a100-pcie-80gb",
    "h100-80gb-hbm3": "h100-sxm", "h100-sxm5-80gb": "h100-sxm",
    "h200": "h200-sxm", "h200-141gb-hbm3e": "h200-sxm",
    "l40-s": "l40s",
}


def normalize_gpu_name(name: str) -> str:
    """'NVIDIA GeForce RTX 4090' -> 'rtx-4090'; 'Tesla V100-SXM2-32GB' -> 'v100-sxm2-32gb'."""
    text = name.strip().lower()
    text = re.sub(r"^(nvidia\s+)?(tesla\s+|geforce\s+)?", "", text)
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def known_gpus() -> tuple[str, ...]:
    return tuple(sorted(_TABLE))


def lookup_gpu(name: str) -> GpuSpec | None:
    """The table row for `name`, or None with a warning (unknown or ambiguous name)."""
    key = normalize_gpu_name(name)
    key = _ALIASES.get(key, key)
    if key in _TABLE:
        return GpuSpec(key, *_TABLE[key], compute_capability=_COMPUTE_CAPABILITY[key])
    candidates = [k for k in _TABLE if k.startswith(key + "-")] if key else []
    if candidates:
        warnings.warn(f"GPU name {name!r} is ambiguous: one of {', '.join(candidates)}",
                      stacklevel=2)
    else:
        warnings.warn(f"GPU {name!r} is not in the datasheet table (known: "
                      f"{', '.join(known_gpus())}); give the figures explicitly", stacklevel=2)
    return None


# ---- One GPU's time per micro-batch and per optimizer step -------------------------------

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
CALIBRATION_KEYS = ("micro_batch_time_s", "optimizer_time_s", "backward_fraction",
                    "compute_slowdown_during_comm", "comm_slowdown_during_compute",
                    "memory_bandwidth_gbps", "ddp_overhead_s", "comm_slowdown_by_size",
                    "ddp_copy_bandwidth_gbps", "ddp_kernel_s", "rank_speed_spread", "rank_jitter",
                    "rank_spread_world_size", "fsdp_forward_overhead_s", "fsdp_backward_overhead_s",
                    "fsdp_backward_no_sync_overhead_s", "fsdp_unshard_overhead_s", "fsdp_optimizer_time_s")


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
    # DDP's fixed cost per kernel its reducer launches (topoprof.model.ddp_gpu), measured; None:
    # on a known GPU the cited what-if range, elsewhere counted in the measured copies or 0.
    ddp_kernel_s: float | None = None
    # The ranks' spread, measured by `validate` (topoprof.model.ddp_gpu.straggler_wait_s): the
    # standard deviation of their persistent speeds, None when not measured; of one micro-batch's
    # time around its rank's level; both as shares of the micro-batch; and how many ranks' slowest
    # the measured compute already is.
    rank_speed_spread: float | None = None
    rank_jitter: float = 0.0
    rank_spread_world_size: int = 1
    gpu_memory_gb: float | None = None  # the GPU's memory (NVML, or given); None: from `gpu`'s datasheet
    # FSDP's own work on the compute stream (its hooks, the all-gather's and the reduce-scatter's
    # buffer copies, the gradient views), measured by `validate` through collectives that
    # communicate nothing (topoprof.model.fsdp.FsdpOverhead): per group per forward, per synced
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
    # Compute priced from the model's own ops (`topoprof.model.roofline`): forward + backward per
    # micro-batch at the (fast, middle, slow) end of its cited ranges, with its basis, backward
    # share and details. It is the compute where nothing measured it and no utilization is given
    # (a what-if range, not the datasheet's 3-52 %); beside a measured time it is shown, with the gap.
    modelled_s: tuple[float, float, float] | None = None
    modelled_basis: str = ""
    modelled_backward_fraction: float | None = None
    modelled_detail: dict | None = None

    def __post_init__(self) -> None:
        for name in ("micro_batch_time_s", "peak_tflops", "memory_bandwidth_gbps", "ddp_copy_bandwidth_gbps"):
            value = getattr(self, name)
            _need(value is None or value > 0, f"{name} must be > 0, got {value}")
        # 0 is a legitimate optimizer time: a measurement floor, or a what-if without it
        _need(self.optimizer_time_s is None or self.optimizer_time_s >= 0,
              f"optimizer_time_s must be >= 0, got {self.optimizer_time_s}")
        _need(self.dp_thread_overhead_s >= 0,
              f"dp_thread_overhead_s must be >= 0, got {self.dp_thread_overhead_s}")
        _need(self.ddp_overhead_s >= 0, f"ddp_overhead_s must be >= 0, got {self.ddp_overhead_s}")
        for name in ("ddp_kernel_s", "rank_speed_spread", "fsdp_forward_overhead_s", "fsdp_backward_overhead_s",
                     "fsdp_backward_no_sync_overhead_s", "fsdp_unshard_overhead_s", "fsdp_optimizer_time_s"):
            value = getattr(self, name)
            _need(value is None or value >= 0, f"{name} must be >= 0, got {value}")
        _need(self.rank_jitter >= 0, f"rank_jitter must be >= 0, got {self.rank_jitter}")
        _need(isinstance(self.rank_spread_world_size, int) and self.rank_spread_world_size >= 1,
              f"rank_spread_world_size must be an integer >= 1, got {self.rank_spread_world_size}")
        _need(self.utilization is None or 0 < self.utilization <= 1,
              f"utilization must be in (0, 1], got {self.utilization}")
        _need(self.backward_fraction is None or 0 < self.backward_fraction < 1,
              f"backward_fraction must be in (0, 1), got {self.backward_fraction}")
        _need(self.modelled_s is None or (len(self.modelled_s) == 3 and 0 < self.modelled_s[0] <= self.modelled_s[1]
                                          <= self.modelled_s[2]),
              f"modelled_s must be (fast, middle, slow) seconds > 0 in that order, got {self.modelled_s}")
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

    def comm_slowdown_at(self, size_bytes: float) -> float:
        return slowdown_at(self.comm_slowdown_by_size, self.comm_slowdown_during_compute, size_bytes)


def slowdown_at(points: tuple[tuple[float, float], ...], default: float, size_bytes: float) -> float:
    """A slowdown measured at several sizes ((bytes, factor), by size), for `size_bytes`:
    interpolated in log size between them, the nearest one's beyond them; `default` without them."""
    if not points:
        return default
    if size_bytes <= points[0][0]:
        return points[0][1]
    for (s0, f0), (s1, f1) in zip(points, points[1:]):
        if size_bytes <= s1:
            w = math.log(size_bytes / s0) / math.log(s1 / s0) if s1 > s0 else 1.0
            return f0 + w * (f1 - f0)
    return points[-1][1]


@dataclass(frozen=True)
class ComputeTimes:
    micro_batch_s: float
    backward_s: float
    optimizer_s: float
    memory_bandwidth_gbps: float | None
    echo: dict[str, tuple[Any, str]]  # value and where it came from
    warnings: tuple[str, ...]
    gpu_key: str | None = None  # the datasheet row of the GPU predicted for, when known


def _gpu(compute: Compute, notes: list[str]) -> GpuSpec | None:
    if compute.gpu is None:
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = lookup_gpu(compute.gpu)
    notes.extend(str(w.message) for w in caught)
    return spec


MODELLED_SOURCE = "what-if from the model's own ops"


def uses_modelled(comp: Compute) -> bool:
    """The compute is the roofline's range: nothing measured it and no utilization is given."""
    return comp.micro_batch_time_s is None and comp.utilization is None and comp.modelled_s is not None


def _micro_batch_s(comp: Compute, spec: GpuSpec | None, flops_per_token: float,
                   tokens: int | None, echo: dict, unit: str = "token", end: str | None = None) -> float:
    if comp.micro_batch_time_s is not None:
        source = f"measured ({comp.origin('micro_batch_time_s')})"
        echo["micro_batch_time_s"] = (comp.micro_batch_time_s, source)
        if comp.modelled_s is not None:  # measured beats modelled; the gap checks the what-if
            fast, middle, slow = comp.modelled_s
            gap = comp.micro_batch_time_s / middle - 1
            inside = "inside" if fast <= comp.micro_batch_time_s <= slow else "outside"
            echo["micro_batch_time_modelled_s"] = ([fast, middle, slow], (
                f"{MODELLED_SOURCE} (not used: measured beats modelled): {comp.modelled_basis}; the measured "
                f"time is {gap:+.0%} of its middle, {inside} its range"))
            echo["compute_model"] = (comp.modelled_detail, "topoprof.model.roofline over the model's op trace")
        return comp.micro_batch_time_s
    if uses_modelled(comp):
        fast, middle, slow = comp.modelled_s
        seconds = {None: middle, "fast": fast, "slow": slow}[end]
        echo["micro_batch_time_s"] = (seconds, f"the middle of the {MODELLED_SOURCE}: {comp.modelled_basis}")
        echo["micro_batch_time_range_s"] = ((fast, slow), f"{MODELLED_SOURCE}: {comp.modelled_basis}")
        echo["compute_model"] = (comp.modelled_detail, "topoprof.model.roofline over the model's op trace")
        return seconds
    peak, peak_src = comp.peak_tflops, "given"
    if peak is None and spec is not None:
        peak = spec.peak_tflops(comp.precision)
        peak_src = f"{spec.name} {comp.precision} dense: {spec.source}"
        _need(peak is not None, f"{spec.name} has no {comp.precision} tensor cores; "
              "choose another precision")
    _need(peak is not None and tokens is not None, "compute per micro-batch: give "
          "micro_batch_time_s, or tokens_per_micro_batch with a known gpu or peak_tflops")
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
                 echo: dict, notes: list[str]) -> float:
    if comp.optimizer_time_s is not None:
        source = f"measured ({comp.origin('optimizer_time_s')})"
        echo["optimizer_time_s"] = (comp.optimizer_time_s, source)
        return comp.optimizer_time_s
    if bandwidth is None:  # nothing to estimate it from: assume 0 and say so (echo, warning)
        echo["optimizer_time_s"] = (0.0, OPTIMIZER_UNKNOWN_SOURCE)
        notes.append(OPTIMIZER_UNKNOWN_NOTE)
        return 0.0
    per_param = OPTIMIZER_STATE_WORDS[comp.optimizer] * STATE_BYTES + grad_bytes
    seconds = per_param * params / (bandwidth * 1e9)
    echo["optimizer_time_s"] = (seconds, f"{comp.optimizer}: {per_param} B/param of memory "
                                f"traffic x {params} params / {bandwidth} GB/s")
    return seconds


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
    echo["memory_bandwidth_gbps"] = (bandwidth, bw_src)
    c = _micro_batch_s(comp, spec, flops_per_token, tokens, echo, unit, end)
    if comp.backward_fraction is not None:
        fraction, source = comp.backward_fraction, comp.origin("backward_fraction")
    elif uses_modelled(comp) and comp.modelled_backward_fraction is not None:
        fraction, source = comp.modelled_backward_fraction, f"the backward's share of the {MODELLED_SOURCE} (middle)"
    else:
        fraction = DEFAULT_BACKWARD_FRACTION
        source = "default: backward = 2x forward (Kaplan et al. 2020 §2.1)"
    echo["backward_fraction"] = (fraction, source)
    t_opt = _optimizer_s(comp, params, grad_bytes, bandwidth, echo, notes)
    slowdown = comp.compute_slowdown_during_comm
    comm_slow = comp.comm_slowdown_during_compute
    echo["comm_slowdown_during_compute"] = (comm_slow, "default: no interference" if comm_slow == 1
                                            else comp.origin("comm_slowdown_during_compute"))
    echo["compute_slowdown_during_comm"] = (slowdown, "default: no interference" if slowdown == 1
                                            else comp.origin("compute_slowdown_during_comm"))
    return ComputeTimes(c, fraction * c, t_opt, bandwidth, echo, tuple(notes),
                        spec.name if spec is not None else None)
