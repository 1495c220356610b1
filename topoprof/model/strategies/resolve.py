"""A job's inputs turned into the numbers the strategies need, each with where it came from:
the compute per micro-batch, backward and optimizer times, DDP's GPU costs; where an input
is a what-if range, its middle or the end that makes steps slow or fast.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from topoprof.model.comm.collectives import CommModel
from topoprof.model.compute.datasheet import SM_COUNT
from topoprof.model.compute.roofline_terms import COPY_BANDWIDTH_BASIS, COPY_BANDWIDTH_SHARE
from topoprof.model.compute.timing import (
    FSDP_OVERHEAD_KEYS,
    MEMORY_UNKNOWN_NOTE,
    UTILIZATION_RANGE,
    compute_times,
    uses_modelled,
    utilization_is_assumed,
)
from topoprof.model.ddp.buckets import Bucket, ddp_bucket_limits, ddp_buckets
from topoprof.model.ddp.gpu_costs import (
    GPU_SPEED_SPREAD_BASIS,
    KERNEL_COST_BASIS,
    KERNEL_COST_RANGE_S,
    NCCL_MAX_CHANNELS,
    geometric_middle,
    gpu_speed_spread_range,
    nccl_sm_slowdown_range,
)
from topoprof.model.fsdp.gpu_costs import HOST_STEP_COST_BASIS, HOST_STEP_COST_RANGE_S
from topoprof.model.fsdp.plan import describe_plan
from topoprof.model.strategies.job import BLOCKING_BACKENDS, ModelInputs
from topoprof.model.strategies.memory import JobMemory, job_memory


@dataclass(frozen=True)
class GpuCosts:
    """What DDP costs on a GPU beyond its all-reduces (`topoprof.model.ddp.gpu_costs`), as resolved for
    one end of the what-if ranges: measured values where `validate` measured them."""

    kernel_s: float = 0.0           # per kernel DDP's reducer launches
    compute_slowdown: float = 1.0   # backward beside an all-reduce
    speed_spread: float = 0.0       # the ranks' persistent speed spread, share of compute
    jitter: float = 0.0             # one micro-batch's spread around its rank's level, share of compute
    spread_basis: int = 1           # ranks whose slowest the compute already is
    fsdp_host_step_s: float = 0.0   # one step of FSDP's hooks on the host (topoprof.model.fsdp.gpu_costs)
    copy_share: float = 1.0         # of the memory bandwidth, DDP's and FSDP's copies (a datasheet's: a range)
    fsdp_hooks_hidden: bool = False # the host ahead of the device throughout: FSDP's hooks cost the step nothing


# Which end of a what-if range each resolution takes: the nominal middle, or the end that makes
# steps slow or fast.
ENDS = (None, "slow", "fast")


def _pick(rng: tuple[float, float], end: str | None) -> float:
    low, high = rng
    return {None: geometric_middle(low, high), "slow": high, "fast": low}[end]


def _rings(comm: CommModel) -> int:
    """Rings NCCL runs at once over the intra-node links (1 unless the comm model knows more)."""
    intra = getattr(comm, "intra", None) or comm
    return int(getattr(intra, "rings", 1) or 1)


def _gpu_costs(inputs: ModelInputs, end: str | None) -> tuple[GpuCosts, dict[str, tuple[Any, str]], list[str]]:
    """(the costs, where each came from, notes): each part measured where a calibration has it;
    else, on a GPU the datasheet table knows, its cited what-if range (`end` picks the middle or
    an end); else not priced, with a note."""
    comp, n = inputs.compute, inputs.cluster.gpus
    row = comp.named.row if comp.named is not None else None
    gpu_key = row.name if row is not None else None  # the datasheet row of the GPU predicted
    on_gpu = gpu_key is not None
    echo: dict[str, tuple[Any, str]] = {}
    notes: list[str] = []
    ranges: dict[str, tuple[float, float]] = {}
    kernel = comp.ddp_kernel_s
    if kernel is not None:
        echo["ddp_kernel_s"] = (kernel, comp.origin("ddp_kernel_s"))
    elif on_gpu and comp.ddp_copy_bandwidth_gbps is None:  # measured copies already hold it
        ranges["ddp_kernel_s"] = KERNEL_COST_RANGE_S
        kernel = _pick(KERNEL_COST_RANGE_S, end)
        echo["ddp_kernel_s"] = (kernel, f"what-if range {KERNEL_COST_BASIS}")
    slowdown = comp.compute_slowdown_during_comm
    measured_slowdown = slowdown != 1.0 or "compute_slowdown_during_comm" in comp.calibrated
    if not measured_slowdown and on_gpu and n > 1 and gpu_key in SM_COUNT:
        sms, rings = SM_COUNT[gpu_key], _rings(inputs.cluster.comm)
        ranges["compute_slowdown_during_comm"] = nccl_sm_slowdown_range(sms, rings)
        slowdown = _pick(ranges["compute_slowdown_during_comm"], end)
        echo["compute_slowdown_during_comm"] = (slowdown, (
            f"what-if range 1-{ranges['compute_slowdown_during_comm'][1]:.3f}: NCCL's kernels hold "
            f"{min(NCCL_MAX_CHANNELS, 2 * rings)} of {sms} SMs while an all-reduce runs "
            "(2 channels per ring, src/graph/connect.cc)"))
    spread = comp.rank_speed_spread
    if spread is not None:
        echo["rank_speed_spread"] = (spread, comp.origin("rank_speed_spread"))
        echo["rank_jitter"] = (comp.rank_jitter, comp.origin("rank_jitter"))
    elif on_gpu:
        ranges["rank_speed_spread"] = gpu_speed_spread_range()
        spread = _pick(ranges["rank_speed_spread"], end)
        echo["rank_speed_spread"] = (spread, f"what-if range {ranges['rank_speed_spread'][0]:.2%}-"
                                     f"{ranges['rank_speed_spread'][1]:.2%} per GPU: {GPU_SPEED_SPREAD_BASIS}")
    if not on_gpu and n > 1 and (comp.ddp_kernel_s is None or spread is None) and comp.ddp_copy_bandwidth_gbps is None:
        notes.append(DDP_GPU_UNPRICED_NOTE)
    host_step, copy_share, hidden = 0.0, 1.0, False
    if on_gpu and n > 1 and comp.memory_bandwidth_gbps is None:  # the datasheet's figure, not a measured one
        ranges["copy_bandwidth_share"] = COPY_BANDWIDTH_SHARE
        copy_share = {None: geometric_middle(*COPY_BANDWIDTH_SHARE), "slow": COPY_BANDWIDTH_SHARE[0],
                      "fast": COPY_BANDWIDTH_SHARE[1]}[end]
        echo["copy_bandwidth_share"] = (copy_share, f"what-if range {COPY_BANDWIDTH_BASIS}: DDP's and FSDP's copies")
    if on_gpu and n > 1 and not fsdp_own_work_measured(comp):  # measured, it holds the hooks and copies
        ranges["fsdp_host_step_s"] = HOST_STEP_COST_RANGE_S
        host_step = _pick(HOST_STEP_COST_RANGE_S, end)
        echo["fsdp_host_step_s"] = (host_step, f"what-if range {HOST_STEP_COST_BASIS}")
        # measured or given compute says nothing of how far the host runs ahead: the hooks count
        # whole, but at the fast end the host is ahead throughout (none of them on the step)
        hidden = end == "fast" and not uses_modelled(comp)
    if ranges:
        echo["ddp_gpu_ranges"] = ({k: list(v) for k, v in ranges.items()},
                                  "what-if ranges (topoprof.model.ddp.gpu_costs, topoprof.model.fsdp.gpu_costs)")
    return GpuCosts(kernel or 0.0, slowdown, spread or 0.0, comp.rank_jitter, comp.rank_spread_world_size, host_step,
                    copy_share, hidden), echo, notes


def fsdp_own_work_measured(comp) -> bool:
    """Whether validate measured FSDP's own work per group (the calibration's fsdp_*_overhead_s)."""
    return any(getattr(comp, key) is not None for key in FSDP_OVERHEAD_KEYS)


DDP_GPU_UNPRICED_NOTE = ("DDP's per-kernel cost and the slowest rank's wait are not priced: no GPU named and no "
                         "calibration measured them (give --gpu NAME or --calibration FILE)")


@dataclass(frozen=True)
class Resolved:
    """The numbers the strategies need; `echo` says where each came from."""

    inputs: ModelInputs
    micro_batch_s: float
    backward_s: float
    optimizer_s: float
    memory_bandwidth_gbps: float | None
    echo: dict[str, tuple[Any, str]]
    warnings: tuple[str, ...]
    memory: JobMemory
    buckets: tuple[Bucket, ...]  # DDP's, in the order their gradients become ready
    bucket_limits: tuple[int, int]  # DDP's first bucket's cap and every other's, bytes
    gpu: GpuCosts = GpuCosts()
    what_if: bool = False  # some input is a range: predictions have bounds


def resolve(inputs: ModelInputs, end: str | None = None, middle: Resolved | None = None) -> Resolved:
    """The numbers of `inputs`; where an input is a what-if range, its middle, or with
    `end` = "slow"/"fast" the end that makes steps slowest/fastest. `middle`: the job resolved
    already, whose memory and DDP buckets no end of a range changes."""
    if end is not None and utilization_is_assumed(inputs.compute) and not uses_modelled(inputs.compute):
        low, high = UTILIZATION_RANGE
        inputs = replace(inputs, compute=replace(inputs.compute, utilization=low if end == "slow" else high))
    work, cl = inputs.workload, inputs.cluster
    gpu, gpu_echo, gpu_notes = _gpu_costs(inputs, end)
    fsdp_echo = _fsdp_echo(inputs)
    memory = middle.memory if middle is not None else job_memory(inputs)
    times = compute_times(inputs.compute, work.layout.params, work.layout.train_flops_per_token,
                          work.tokens_per_micro_batch, work.grad_bytes, unit=work.layout.unit, end=end)
    buckets = middle.buckets if middle is not None else ddp_buckets(work.layout, work.grad_bytes, work.bucket_cap_mb)
    first, cap = ddp_bucket_limits(work.bucket_cap_mb)
    default_cap = work.bucket_cap_mb is None
    dp_overhead = inputs.compute.dp_thread_overhead_s
    given = ("grad_bytes", "param_bytes", "micro_batch_size", "tokens_per_micro_batch",
             "gradient_as_bucket_view")
    sources = {"micro_batch_size": work.micro_batch_source}
    echo = {**times.echo, **{name: (getattr(work, name), sources.get(name, "given")) for name in given},
            **({"tokens_per_micro_batch": (work.tokens_per_micro_batch, "images: micro_batch_size (an image "
                                           "model's FLOPs are per image)")} if work.layout.unit == "image" else {}),
            "model": (work.layout.name, work.layout.source),
            "params": (work.layout.params, work.layout.source),
            "accumulation_steps": (inputs.accumulation_steps, "given"),
            "world_size": (cl.world_size, "nodes x gpus_per_node"), "nodes": (cl.nodes, "given"),
            "gpus_per_node": (cl.gpus_per_node, "given"),
            "comm": (cl.comm.describe(), cl.comm.source),
            "bucket_cap_bytes": (cap, "torch default 25 MiB" if default_cap else "given"),
            "first_bucket_cap_bytes": (first, "dist._DEFAULT_FIRST_BUCKET_BYTES" if default_cap
                                       else "= bucket_cap when bucket_cap_mb is given (torch)"),
            "dp_thread_overhead_s": (dp_overhead, "given" if dp_overhead
                                     else "default 0: GIL contention not modelled unless given"),
            "ddp_overhead_s": (inputs.compute.ddp_overhead_s,
                               inputs.compute.origin("ddp_overhead_s") if inputs.compute.ddp_overhead_s
                               else "default 0: DDP's hooks cost nothing unless measured"),
            "ddp_copy_bandwidth_gbps": (inputs.compute.ddp_copy_bandwidth_gbps,
                                        inputs.compute.origin("ddp_copy_bandwidth_gbps")
                                        if inputs.compute.ddp_copy_bandwidth_gbps
                                        else "default: the bucket copies run at the memory bandwidth"),
            "dp_output_bytes": (work.dp_output_bytes, "given" if work.dp_output_bytes
                                else "default 0: outputs assumed small (a loss)"),
            **fsdp_echo,
            "activation_memory_gb": (None if memory.count.activations is None else memory.count.activations / 1e9,
                                     memory.count.source),
            "gpu_memory_gb": (memory.capacity_gb, memory.capacity_source), **gpu_echo}
    notes_list = [*times.warnings, *gpu_notes]
    # one GPU has no DDP buckets to copy: the memory-bandwidth caveat does not concern it
    notes = tuple(w for w in notes_list if cl.gpus > 1 or w not in (MEMORY_UNKNOWN_NOTE, DDP_GPU_UNPRICED_NOTE))
    what_if = utilization_is_assumed(inputs.compute) or "ddp_gpu_ranges" in echo
    return Resolved(inputs, times.micro_batch_s, times.backward_s, times.optimizer_s,
                    times.memory_bandwidth_gbps, echo, notes, memory, buckets, (first, cap), gpu, what_if)


def resolve_ends(inputs: ModelInputs) -> tuple[Resolved, Resolved, Resolved]:
    """(the middle, the slow end, the fast end) of `inputs`' what-if ranges (`resolve`); each end
    is the middle where no input is a range. The job's memory and buckets are derived once: no end
    changes them."""
    res = resolve(inputs)
    if not res.what_if:
        return res, res, res
    return res, resolve(inputs, "slow", res), resolve(inputs, "fast", res)


def _fsdp_echo(inputs: ModelInputs) -> dict[str, tuple[Any, str]]:
    """FSDP's inputs beside DDP's: its groups, MixedPrecisionPolicy's bytes, the backend."""
    work, comp, cl = inputs.workload, inputs.compute, inputs.cluster
    param, reduce = work.fsdp_bytes
    out: dict[str, tuple[Any, str]] = {
        "fsdp_param_bytes": (param, "given (MixedPrecisionPolicy.param_dtype)" if work.fsdp_param_bytes
                             else "the parameters' own dtype (no param_dtype)"),
        "fsdp_reduce_bytes": (reduce, "given (MixedPrecisionPolicy.reduce_dtype)" if work.fsdp_reduce_bytes
                              else "param_dtype's (no reduce_dtype: torch reduces in the compute dtype)"),
        "backend": (cl.backend, "gloo: every collective blocks and a reduce-scatter is an all-reduce"
                    if cl.backend in BLOCKING_BACKENDS else "NCCL: collectives on streams beside compute")}
    if isinstance(work.fsdp, str):
        out["fsdp_groups"] = (None, work.fsdp)
    else:
        out["fsdp_groups"] = (describe_plan(work.fsdp), f"fully_shard per "
                              f"{'child of ' + work.fsdp_unit if work.fsdp_unit else 'block'}, then the root")
    for key in (*FSDP_OVERHEAD_KEYS, "fsdp_optimizer_time_s"):
        if getattr(comp, key) is not None:
            out[key] = (getattr(comp, key), comp.origin(key))
    return out
