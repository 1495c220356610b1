"""Predicted time of one optimizer step for DataParallel, DDP and their accumulation variants.

Per micro-batch each GPU computes c = T_fwd + T_bwd; a step is k micro-batches then the
optimizer, T_opt. DDP overlaps all-reduce with backward through buckets (`topoprof.model.buckets`).
Build `ModelInputs` from `Workload`, `Compute` and `Cluster`, then call `predict`; `sweep`,
`hide_threshold` and `fixed_global_batch` answer "what would changing this gain me".
The README section "How the model works" states each formula with its source.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from topoprof.model.buckets import Bucket, ddp_bucket_limits, ddp_buckets
from topoprof.model.comm import CommModel, HierarchicalComm, LinkUnknown
from topoprof.model.dataparallel import dataparallel_comm_s
from topoprof.model.ddp import DdpSetting, copies_traffic_s, ddp_timeline, hiding_threshold
from topoprof.model import ddp_gpu
from topoprof.model import fsdp
from topoprof.model.results import (BucketSummary, DdpCost, GlobalBatchOption, HideThreshold,
                                    InputValue, Memory, Prediction, Range, StrategyResult,
                                    SweepPoint, Unavailable)
from topoprof.errors import InputError
from topoprof.model.compute import (MEMORY_UNKNOWN_NOTE, UTILIZATION_RANGE, Compute, compute_times,
                                    uses_modelled, utilization_is_assumed)
from topoprof.model.presets import Layout, get_preset, synthetic_layout

DDP_STRATEGIES = ("single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only",
                  "ddp_fp16_compress")
STRATEGIES = DDP_STRATEGIES + fsdp.FSDP_STRATEGIES
# Backends whose collectives block the calling thread and whose reduce-scatter is an all-reduce
# (topoprof.model.fsdp): gloo. NCCL's run on streams beside the compute.
BLOCKING_BACKENDS = ("gloo",)
BACKENDS = ("nccl", "gloo")
# Why DP and DDP have no prediction on one GPU. Not "DDP with 0 s of communication": torch
# would run it, but nobody chooses it, and it would only repeat `single` plus bucket copies.
ONE_GPU_REASON = "one GPU: nothing to all-reduce; see `single`"


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise InputError(message)


@dataclass(frozen=True)
class Workload:
    """What is trained: parameter layout, dtypes, batch, DDP bucket options."""

    layout: Layout
    grad_bytes: int = 4  # 4 under torch.autocast (fp32 params), 2 for pure bf16/fp16
    param_bytes: int = 4  # what DataParallel's replicate broadcasts per parameter
    micro_batch_size: int = 1  # samples per GPU per micro-batch
    # per GPU; for the FLOPs estimate. An image model's (layout.unit "image") is its micro_batch_size.
    tokens_per_micro_batch: int | None = None
    bucket_cap_mb: float | None = None  # None = torch default (25 MiB, first bucket 1 MiB)
    gradient_as_bucket_view: bool = False
    dp_output_bytes: int = 0  # per GPU, gathered to GPU 0 by DataParallel (0 = a small loss)
    activation_memory_gb: float | None = None  # per GPU per micro-batch, when the user knows it
    # One GPU's memory by phase over a timed step of this model (probes/user_model.py), if any
    measured_memory: dict | None = None
    # FSDP's MixedPrecisionPolicy: bytes per all-gathered parameter (param_dtype; None: the
    # parameters' own, param_bytes) and per reduced gradient (reduce_dtype; None: param_dtype's,
    # as torch reduces in the compute dtype then, _fsdp_api.py MixedPrecisionPolicy)
    fsdp_param_bytes: int | None = None
    fsdp_reduce_bytes: int | None = None
    fsdp_unit: str | None = None  # the module whose children are FSDP's groups (None: by block name)

    def __post_init__(self) -> None:
        _need(self.grad_bytes in (2, 4), f"grad_bytes must be 2 or 4, got {self.grad_bytes}")
        _need(self.param_bytes in (2, 4), f"param_bytes must be 2 or 4, got {self.param_bytes}")
        _need(self.micro_batch_size >= 1,
              f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        _need(self.tokens_per_micro_batch is None or self.tokens_per_micro_batch >= 1,
              f"tokens_per_micro_batch must be >= 1, got {self.tokens_per_micro_batch}")
        _need(self.dp_output_bytes >= 0,
              f"dp_output_bytes must be >= 0, got {self.dp_output_bytes}")
        _need(self.activation_memory_gb is None or self.activation_memory_gb >= 0,
              f"activation memory must be >= 0 GB, got {self.activation_memory_gb}")
        if self.layout.unit == "image":  # FLOPs per image: a micro-batch is micro_batch_size images
            _need(self.tokens_per_micro_batch in (None, self.micro_batch_size),
                  f"tokens_per_micro_batch({self.tokens_per_micro_batch}) of an image model is its "
                  f"micro_batch_size({self.micro_batch_size}) images")
            object.__setattr__(self, "tokens_per_micro_batch", self.micro_batch_size)
        ddp_bucket_limits(self.bucket_cap_mb)  # validates
        for name in ("fsdp_param_bytes", "fsdp_reduce_bytes"):
            value = getattr(self, name)
            _need(value is None or value in (2, 4), f"{name} must be 2 or 4, got {value}")

    @property
    def fsdp_bytes(self) -> tuple[int, int]:
        """(all-gather, reduce-scatter) bytes per element under FSDP's MixedPrecisionPolicy."""
        param = self.fsdp_param_bytes or self.param_bytes
        return param, self.fsdp_reduce_bytes or param

    @classmethod
    def from_preset(cls, name: str, image_size: int | None = None, **kwargs: Any) -> Workload:
        """A preset's workload; `image_size` for a vision preset only (`presets.get_preset`)."""
        return cls(get_preset(name, image_size), **kwargs)

    @classmethod
    def from_params(cls, params: int, **kwargs: Any) -> Workload:
        return cls(synthetic_layout(params), **kwargs)


@dataclass(frozen=True)
class Cluster:
    comm: CommModel
    nodes: int = 1
    gpus_per_node: int = 1
    world_size: int | None = None  # optional; checked against nodes * gpus_per_node
    backend: str = "nccl"  # what runs the collectives: gloo blocks (topoprof.model.fsdp)

    def __post_init__(self) -> None:
        _need(self.backend in BACKENDS, f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        _need(self.nodes >= 1 and self.gpus_per_node >= 1, f"nodes({self.nodes}) and "
              f"gpus_per_node({self.gpus_per_node}) must be >= 1")
        n = self.nodes * self.gpus_per_node
        _need(self.world_size is None or self.world_size == n, f"world_size({self.world_size}) "
              f"!= nodes({self.nodes}) * gpus_per_node({self.gpus_per_node})")
        _need(self.comm.world_size == n, f"comm model world_size({self.comm.world_size}) != "
              f"nodes({self.nodes}) * gpus_per_node({self.gpus_per_node})")
        if isinstance(self.comm, HierarchicalComm):
            _need(self.comm.nodes == self.nodes,
                  f"comm model nodes({self.comm.nodes}) != nodes({self.nodes})")
        object.__setattr__(self, "world_size", n)


@dataclass(frozen=True)
class ModelInputs:
    workload: Workload
    compute: Compute
    cluster: Cluster
    accumulation_steps: int = 1

    def __post_init__(self) -> None:
        _need(isinstance(self.accumulation_steps, int) and self.accumulation_steps >= 1,
              f"accumulation_steps must be an integer >= 1, got {self.accumulation_steps}")


@dataclass(frozen=True)
class GpuCosts:
    """What DDP costs on a GPU beyond its all-reduces (`topoprof.model.ddp_gpu`), as resolved for
    one end of the what-if ranges: measured values where `validate` measured them."""

    kernel_s: float = 0.0           # per kernel DDP's reducer launches
    compute_slowdown: float = 1.0   # backward beside an all-reduce
    speed_spread: float = 0.0       # the ranks' persistent speed spread, share of compute
    jitter: float = 0.0             # one micro-batch's spread around its rank's level, share of compute
    spread_basis: int = 1           # ranks whose slowest the compute already is


# Which end of a what-if range each resolution takes: the nominal middle, or the end that makes
# steps slow or fast.
ENDS = (None, "slow", "fast")


def _pick(rng: tuple[float, float], end: str | None) -> float:
    low, high = rng
    return {None: ddp_gpu.geometric_middle(low, high), "slow": high, "fast": low}[end]


def _rings(comm: CommModel) -> int:
    """Rings NCCL runs at once over the intra-node links (1 unless the comm model knows more)."""
    intra = getattr(comm, "intra", None) or comm
    return int(getattr(intra, "rings", 1) or 1)


def _gpu_costs(inputs: ModelInputs, gpu_key: str | None, end: str | None,
               echo: dict, notes: list[str]) -> GpuCosts:
    """Each part measured where a calibration has it; else, on a GPU the datasheet table knows,
    its cited what-if range (`end` picks the middle or an end); else not priced, with a note."""
    comp, n = inputs.compute, inputs.cluster.world_size
    on_gpu = gpu_key is not None
    ranges: dict[str, tuple[float, float]] = {}
    kernel = comp.ddp_kernel_s
    if kernel is not None:
        echo["ddp_kernel_s"] = (kernel, comp.origin("ddp_kernel_s"))
    elif on_gpu and comp.ddp_copy_bandwidth_gbps is None:  # measured copies already hold it
        ranges["ddp_kernel_s"] = ddp_gpu.KERNEL_COST_RANGE_S
        kernel = _pick(ddp_gpu.KERNEL_COST_RANGE_S, end)
        echo["ddp_kernel_s"] = (kernel, f"what-if range {ddp_gpu.KERNEL_COST_BASIS}")
    slowdown = comp.compute_slowdown_during_comm
    measured_slowdown = slowdown != 1.0 or "compute_slowdown_during_comm" in comp.calibrated
    if not measured_slowdown and on_gpu and n > 1 and gpu_key in ddp_gpu.SM_COUNT:
        sms, rings = ddp_gpu.SM_COUNT[gpu_key], _rings(inputs.cluster.comm)
        ranges["compute_slowdown_during_comm"] = ddp_gpu.nccl_sm_slowdown_range(sms, rings)
        slowdown = _pick(ranges["compute_slowdown_during_comm"], end)
        echo["compute_slowdown_during_comm"] = (slowdown, (
            f"what-if range 1-{ranges['compute_slowdown_during_comm'][1]:.3f}: NCCL's kernels hold "
            f"{min(ddp_gpu.NCCL_MAX_CHANNELS, 2 * rings)} of {sms} SMs while an all-reduce runs "
            "(2 channels per ring, src/graph/connect.cc)"))
    spread = comp.rank_speed_spread
    if spread is not None:
        echo["rank_speed_spread"] = (spread, comp.origin("rank_speed_spread"))
        echo["rank_jitter"] = (comp.rank_jitter, comp.origin("rank_jitter"))
    elif on_gpu:
        ranges["rank_speed_spread"] = ddp_gpu.gpu_speed_spread_range()
        spread = _pick(ranges["rank_speed_spread"], end)
        echo["rank_speed_spread"] = (spread, f"what-if range {ranges['rank_speed_spread'][0]:.2%}-"
                                     f"{ranges['rank_speed_spread'][1]:.2%} per GPU: {ddp_gpu.GPU_SPEED_SPREAD_BASIS}")
    if not on_gpu and n > 1 and (comp.ddp_kernel_s is None or spread is None) and comp.ddp_copy_bandwidth_gbps is None:
        notes.append(DDP_GPU_UNPRICED_NOTE)
    if ranges:
        echo["ddp_gpu_ranges"] = ({k: list(v) for k, v in ranges.items()}, "what-if ranges (topoprof.model.ddp_gpu)")
    return GpuCosts(kernel or 0.0, slowdown, spread or 0.0, comp.rank_jitter, comp.rank_spread_world_size)


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
    gpu: GpuCosts = GpuCosts()
    what_if: bool = False  # some input is a range: predictions have bounds


def resolve(inputs: ModelInputs, end: str | None = None) -> Resolved:
    """The numbers of `inputs`; where an input is a what-if range, its middle, or with
    `end` = "slow"/"fast" the end that makes steps slowest/fastest."""
    if end is not None and utilization_is_assumed(inputs.compute) and not uses_modelled(inputs.compute):
        low, high = UTILIZATION_RANGE
        inputs = replace(inputs, compute=replace(inputs.compute, utilization=low if end == "slow" else high))
    work, cl = inputs.workload, inputs.cluster
    times = compute_times(inputs.compute, work.layout.params, work.layout.train_flops_per_token,
                          work.tokens_per_micro_batch, work.grad_bytes, unit=work.layout.unit, end=end)
    first, cap = ddp_bucket_limits(work.bucket_cap_mb)
    default_cap = work.bucket_cap_mb is None
    dp_overhead = inputs.compute.dp_thread_overhead_s
    given = ("grad_bytes", "param_bytes", "micro_batch_size", "tokens_per_micro_batch",
             "gradient_as_bucket_view")
    echo = {**times.echo, **{name: (getattr(work, name), "given") for name in given},
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
            **_fsdp_echo(inputs), **_memory_echo(inputs)}
    notes_list = list(times.warnings)
    gpu = _gpu_costs(inputs, times.gpu_key, end, echo, notes_list)
    # one GPU has no DDP buckets to copy: the memory-bandwidth caveat does not concern it
    notes = tuple(w for w in notes_list if cl.world_size > 1 or w not in (MEMORY_UNKNOWN_NOTE, DDP_GPU_UNPRICED_NOTE))
    what_if = utilization_is_assumed(inputs.compute) or "ddp_gpu_ranges" in echo
    return Resolved(inputs, times.micro_batch_s, times.backward_s, times.optimizer_s,
                    times.memory_bandwidth_gbps, echo, notes, gpu, what_if)


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
    try:
        out["fsdp_groups"] = (fsdp.describe_plan(fsdp.fsdp_plan(work.layout, work.fsdp_unit)),
                              f"fully_shard per {'child of ' + work.fsdp_unit if work.fsdp_unit else 'block'}, then the root")
    except InputError as err:
        out["fsdp_groups"] = (None, str(err))
    for key in ("fsdp_forward_overhead_s", "fsdp_backward_overhead_s", "fsdp_backward_no_sync_overhead_s",
                "fsdp_unshard_overhead_s", "fsdp_optimizer_time_s"):
        if getattr(comp, key) is not None:
            out[key] = (getattr(comp, key), comp.origin(key))
    return out


def ddp_setting(res: Resolved, buckets: tuple[Bucket, ...] = ()) -> DdpSetting:
    work, compute = res.inputs.workload, res.inputs.compute
    kernels = ddp_gpu.ddp_kernels(len(work.layout.tensors), len(buckets), work.gradient_as_bucket_view)
    return DdpSetting(res.backward_s, work.layout.params, work.grad_bytes, res.memory_bandwidth_gbps,
                      res.gpu.compute_slowdown, compute.comm_slowdown_during_compute,
                      compute.comm_slowdown_by_size, work.gradient_as_bucket_view,
                      compute.ddp_copy_bandwidth_gbps, kernels * res.gpu.kernel_s)


def ddp_exposed_s(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel,
                  fp16_compress: bool = False) -> float:
    """E per synced micro-batch (`topoprof.model.ddp`)."""
    return ddp_timeline(ddp_setting(res, buckets), buckets, comm, fp16_compress).exposed_s


def straggler_s(res: Resolved, syncs: int) -> float:
    """What a step of `syncs` syncs waits for its slowest rank (`ddp_gpu.straggler_wait_s`)."""
    n, k = res.inputs.cluster.world_size, res.inputs.accumulation_steps
    g = res.gpu
    if n == 1 or (g.speed_spread == 0 and g.jitter == 0):
        return 0.0
    return ddp_gpu.straggler_wait_s(n, res.micro_batch_s, k, syncs, g.speed_spread, g.jitter * res.micro_batch_s,
                                    g.spread_basis)


# How many micro-batches of a step all-reduce, per DDP strategy (of k).
def _synced(mode: str, k: int) -> int:
    return 1 if mode == "ddp_no_sync" else k


def step_components(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel, mode: str) -> dict[str, float]:
    """A DDP strategy's step in the parts a timeline shows: compute (forward and backward, with
    DDP's hooks and what communication slows it), the communication left exposed after backward
    (the tail of the all-reduces and the bucket copies), the optimizer. They add up to the step."""
    k = res.inputs.accumulation_steps
    if mode in fsdp.FSDP_STRATEGIES:
        step = fsdp_strategy_step(res, comm, mode)
        if isinstance(step, str):
            raise InputError(f"{mode}: {step}")
        return {"compute": step.compute_s + fsdp_wait_s(res, comm), "exposed_comm": step.exposed_comm_s,
                "optimizer": step.optimizer_s}
    timeline = ddp_timeline(ddp_setting(res, buckets), buckets, comm, fp16_compress=mode == "ddp_fp16_compress")
    overlap, n = timeline.overlap, _synced(mode, k)
    slowed = overlap.backward_end_s - res.backward_s  # what backward lost to the all-reduces
    # Half the copies' traffic runs inside backward (each gradient into its bucket as it is
    # ready), half after the last all-reduce (the buckets back into the gradients), where a
    # timeline shows them: in compute and in the exposed tail.
    tail = max(0.0, overlap.comm_end_s - overlap.backward_end_s) + timeline.copies_s / 2
    # waiting for the slowest rank counts as compute, as validate measures it (rotations.step_parts)
    return {"compute": k * (res.micro_batch_s + res.inputs.compute.ddp_overhead_s) + n * (slowed + timeline.copies_s / 2)
            + straggler_s(res, n),
            "exposed_comm": n * tail, "optimizer": res.optimizer_s}


def fsdp_setting(res: Resolved) -> fsdp.FsdpSetting:
    """The FSDP timeline's inputs: compute split by the backward fraction, MixedPrecisionPolicy's
    bytes, the backend's blocking and reduce-scatter behaviour, FSDP's measured own work."""
    work, comp, cl = res.inputs.workload, res.inputs.compute, res.inputs.cluster
    param_bytes, reduce_bytes = work.fsdp_bytes
    measured = (comp.fsdp_forward_overhead_s, comp.fsdp_backward_overhead_s, comp.fsdp_backward_no_sync_overhead_s,
                comp.fsdp_unshard_overhead_s)
    overhead = None if all(v is None for v in measured) else fsdp.FsdpOverhead(*(v or 0.0 for v in measured))
    blocking = cl.backend in BLOCKING_BACKENDS
    return fsdp.FsdpSetting(res.micro_batch_s - res.backward_s, res.backward_s, param_bytes, reduce_bytes,
                            res.memory_bandwidth_gbps, blocking=blocking, reduce_scatter_as_allreduce=blocking,
                            overhead=overhead,
                            compute_slowdown=1.0 if blocking else res.gpu.compute_slowdown,
                            comm_slowdown=1.0 if blocking else comp.comm_slowdown_during_compute)


def fsdp_strategy_step(res: Resolved, comm: CommModel, name: str) -> fsdp.FsdpStep | str:
    """One FSDP strategy's step (`topoprof.model.fsdp`), or why it does not apply here."""
    mode, cl, work = fsdp.MODES[name], res.inputs.cluster, res.inputs.workload
    if cl.world_size == 1:
        return ONE_GPU_REASON
    if mode.hsdp and cl.nodes == 1:
        return fsdp.HSDP_ONE_NODE_REASON
    try:
        plan = fsdp.fsdp_plan(work.layout, work.fsdp_unit)
    except InputError as err:
        return str(err)
    setting = fsdp_setting(res)
    try:
        if mode.hsdp:
            shard, replicate = comm.at_shape(1, cl.gpus_per_node), comm.at_shape(cl.nodes, 1)
        else:
            shard, replicate = comm, None
    except LinkUnknown as err:
        return str(err)
    coll = fsdp.collective_times(plan, setting, shard, replicate)
    shards = fsdp.shard_degree(mode, cl.world_size, cl.gpus_per_node)
    comp = res.inputs.compute
    t_opt = comp.fsdp_optimizer_time_s if comp.fsdp_optimizer_time_s is not None else res.optimizer_s / shards
    return fsdp.fsdp_step(plan, setting, coll, mode, res.inputs.accumulation_steps, t_opt)


def fsdp_wait_s(res: Resolved, comm: CommModel) -> float:
    """What an FSDP step waits for its slowest rank beyond its collectives' own: every micro-batch
    meets the others at its all-gathers, synced or not (W_k). On a blocking backend whose FSDP
    collectives validate measured between stretches of compute, the wait is in them already."""
    measured = bool(getattr(comm, "curve", lambda _: ())("all_gather"))
    if res.inputs.cluster.backend in BLOCKING_BACKENDS and measured:
        return 0.0
    return straggler_s(res, res.inputs.accumulation_steps)


def fsdp_step_times(res: Resolved, comm: CommModel) -> dict[str, tuple[float, float] | str]:
    """(step_time_s, comm_exposed_s) per FSDP strategy, with the slowest rank's wait (fsdp_wait_s)."""
    out: dict[str, tuple[float, float] | str] = {}
    wait = fsdp_wait_s(res, comm)
    for name in fsdp.FSDP_STRATEGIES:
        step = fsdp_strategy_step(res, comm, name)
        out[name] = step if isinstance(step, str) else (step.step_s + wait, step.exposed_comm_s)
    return out


def dp_comm_s(res: Resolved, comm: CommModel) -> float:
    work = res.inputs.workload
    return dataparallel_comm_s(comm, [t.numel for t in work.layout.tensors], work.param_bytes,
                               work.grad_bytes, work.dp_output_bytes)


def step_times(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel
               ) -> dict[str, tuple[float, float] | str]:
    """(step_time_s, comm_exposed_s) per strategy, or why it does not apply."""
    k, c, t_opt = res.inputs.accumulation_steps, res.micro_batch_s, res.optimizer_s
    if res.inputs.cluster.world_size == 1:
        return {name: (k * c + t_opt, 0.0) if name == "single" else ONE_GPU_REASON
                for name in STRATEGIES}
    e = ddp_exposed_s(res, buckets, comm)
    e16 = ddp_exposed_s(res, buckets, comm, fp16_compress=True)
    cd = c + res.inputs.compute.ddp_overhead_s  # a micro-batch through DDP's hooks
    # the slowest rank: waited for at every sync, k per step synced, once with no_sync
    w_synced, w_once = straggler_s(res, k), straggler_s(res, 1)
    out: dict[str, tuple[float, float] | str] = {
        "single": (k * c + t_opt, 0.0),
        "ddp_synced": (k * (cd + e) + w_synced + t_opt, k * e),
        "ddp_no_sync": (k * cd + e + w_once + t_opt, e),
        # _post_forward calls reducer.prepare_for_backward whenever require_backward_grad_sync
        # is True during forward; no_sync() around backward alone then changes nothing.
        "ddp_no_sync_backward_only": (k * (cd + e) + w_synced + t_opt, k * e),
        "ddp_fp16_compress": (k * (cd + e16) + w_synced + t_opt, k * e16),
    }
    if res.inputs.cluster.nodes > 1:
        out["dp"] = "DataParallel is single-process, single-node"
    else:  # DataParallel's reduce onto GPU 0 waits for every GPU's backward, every micro-batch
        d = dp_comm_s(res, comm)
        out["dp"] = (k * (c + d + res.inputs.compute.dp_thread_overhead_s) + w_synced + t_opt, k * d)
    out.update(fsdp_step_times(res, comm))
    return out


FORMULAS = {
    "single": "k*c + T_opt (one GPU)",
    "dp": "k*(c + broadcast(params) + gather(outputs) + reduce(grads) + thread_overhead) + W_k + T_opt",
    "ddp_synced": "k*(c + o + E) + W_k + T_opt",
    "ddp_no_sync": "k*(c + o) + E + W_1 + T_opt",
    "ddp_no_sync_backward_only": "k*(c + o + E) + W_k + T_opt, the same as ddp_synced",
    "ddp_fp16_compress": "k*(c + o + E_fp16) + W_k + T_opt",
    # FSDP: F = one micro-batch's timeline (topoprof.model.fsdp): forward and backward compute,
    # FSDP's own work per group, the collectives it leaves exposed
    "fsdp_full_shard": "k*F_sync(all-gather in forward and again in backward, reduce-scatter per group) + W_k + T_opt/n",
    "fsdp_full_shard_no_sync": "(k-1)*F_nosync + F_sync: no reduce-scatter until the last micro-batch; + W_k + T_opt/n",
    "fsdp_shard_grad_op": "k*F_sync(all-gather in forward only, reduce-scatter per group) + W_k + T_opt/n",
    "fsdp_shard_grad_op_no_sync": "(k-1)*F_nosync + F_sync, no backward all-gather; + W_k + T_opt/n",
    "hsdp": "k*F_sync(shard in a node; + all-reduce across nodes per group) + W_k + T_opt/gpus_per_node",
    "hsdp_no_sync": "(k-1)*F_nosync + F_sync, HSDP; + W_k + T_opt/gpus_per_node",
}
ASSUMPTIONS = (
    "gradients become ready in reverse forward order; a tensor's share of backward is its "
    "matmul FLOPs (embedding lookups, norms, biases ~0; attention score FLOPs left out)",
    "DDP buckets are the ones rebuilt after the first iteration (gradient-ready order); the "
    "first iteration (one bucket per dtype) and buffer broadcasts are not modelled",
    "bucket all-reduces run one at a time in bucket order: start_j = max(ready_j, end_{j-1})",
    "bucket copy traffic (4G bytes, 2G with gradient_as_bucket_view) and DDP's kernels (2 per gradient, 1 with "
    "gradient_as_bucket_view, 1 per bucket) are fully exposed",
    "W_s: a step with s syncs waits for its slowest rank at each (topoprof.model.ddp_gpu.straggler_wait_s)",
    "DDP's optimizer step on each GPU takes T_opt, as on one GPU",
    "DataParallel: input scatter and the flatten/unflatten copies of broadcast_coalesced and "
    "reduce_add_coalesced not modelled; output gather = dp_output_bytes per GPU; "
    "Python-thread/GIL cost = dp_thread_overhead_s (both 0 unless given)",
    "FSDP: one group per block and the root with the rest (topoprof.model.fsdp); all-gathers and "
    "reduce-scatters one at a time in issue order on one process group, all-gathers prefetched one group "
    "ahead, HSDP's all-reduce on a stream of its own; the root not resharded after forward (torch's default)",
    "FSDP: the host issues work ahead of the GPU (its hooks' CPU time is not on the GPU's path) unless "
    "validate measured FSDP's own work per group; buffer copies (all-gather copy-out, reduce-scatter "
    "copy-in) at memory bandwidth otherwise; per-parameter padding to a multiple of the shard count, the "
    "no_sync gradient accumulation in reduce_dtype and the optimizer's DTensor cost not modelled",
    "FSDP on gloo: every collective blocks the host thread and a reduce-scatter is an all-reduce of the "
    "whole buffer (ProcessGroupGloo.cpp reduce_scatter_tensor_coalesced)",
)


# What DDP adds to one synced micro-batch, part by part: (what it scales with, where it comes from).
DDP_COST_PARTS = {
    "allreduce_tail": ("bytes of the buckets ready last, over the link's bus bandwidth",
                       "the bucket all-reduces not hidden behind backward (reducer.cpp launches buckets in order)"),
    "backward_slowed": ("the time the all-reduces overlap backward",
                        "compute slowed while an all-reduce runs: on GPUs NCCL's kernels hold 2 SMs per ring "
                        "(src/enqueue.cc, src/graph/connect.cc), on CPU ranks gloo's threads share the cores"),
    "ddp_kernels": ("gradient tensors and buckets",
                    "a copy into and out of its bucket per gradient, an all-reduce launch per bucket (reducer.cpp)"),
    "copy_traffic": ("gradient bytes over memory bandwidth", "4G bytes of bucket copies, 2G with gradient_as_bucket_view"),
    "ddp_hooks": ("micro-batches", "DDP's forward and autograd hooks, measured by validate (0 unless measured)"),
    "slowest_rank": ("ranks (the expected maximum of that many) and compute per micro-batch",
                     "every sync waits for the slowest rank (topoprof.model.ddp_gpu.straggler_wait_s)"),
}


def ddp_cost_parts(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel) -> dict[str, float]:
    """What DDP adds to one synced micro-batch over one GPU's compute, in DDP_COST_PARTS."""
    setting = ddp_setting(res, buckets)
    overlap = ddp_timeline(setting, buckets, comm).overlap
    return {"allreduce_tail": max(0.0, overlap.comm_end_s - overlap.backward_end_s),
            "backward_slowed": overlap.backward_end_s - res.backward_s,
            "ddp_kernels": setting.kernels_s, "copy_traffic": copies_traffic_s(setting),
            "ddp_hooks": res.inputs.compute.ddp_overhead_s,
            "slowest_rank": straggler_s(res, res.inputs.accumulation_steps) / res.inputs.accumulation_steps}


def ddp_one_gpu_s(inputs: ModelInputs, end: str | None = None) -> float:
    """A micro-batch through DDP on one rank (torch runs its reducer and a one-rank all-reduce
    there too): compute plus DDP's hooks, kernels and copy traffic, no link and no other rank.
    `end` as for `resolve`: the what-if's middle, or its slow or fast end."""
    res = resolve(inputs, end)
    buckets = ddp_buckets(inputs.workload.layout, inputs.workload.grad_bytes, inputs.workload.bucket_cap_mb)
    setting = ddp_setting(res, buckets)
    return res.micro_batch_s + inputs.compute.ddp_overhead_s + setting.kernels_s + copies_traffic_s(setting)


def _ddp_costs(nominal: Resolved, ends: tuple[Resolved, Resolved], buckets: tuple[Bucket, ...],
               comms: tuple[CommModel, CommModel, CommModel]) -> dict[str, DdpCost]:
    middle = ddp_cost_parts(nominal, buckets, comms[0])
    slow = ddp_cost_parts(ends[0], buckets, comms[1])
    fast = ddp_cost_parts(ends[1], buckets, comms[2])
    out = {}
    for name, value in middle.items():
        lo, hi = sorted((fast[name], slow[name]))
        rng = None if hi - lo <= 1e-12 * max(1.0, hi) else (lo, hi)
        out[name] = DdpCost(value, rng, *DDP_COST_PARTS[name])
    return out


def _samples(res: Resolved, name: str) -> int:
    gpus = 1 if name == "single" else res.inputs.cluster.world_size
    return res.inputs.workload.micro_batch_size * res.inputs.accumulation_steps * gpus


def _activations(inputs: ModelInputs) -> tuple[float | None, str]:
    """Activation bytes per micro-batch on one GPU, and where the figure comes from."""
    from topoprof.model import memory
    from topoprof.model.presets import PRESET_DEPTH

    work = inputs.workload
    if work.activation_memory_gb is not None:
        return work.activation_memory_gb * memory.GB, "given (--activation-memory)"
    traced = ((inputs.compute.modelled_detail or {}).get("memory") or {}).get("activations_bytes")
    if traced is not None:  # the model's own autograd graph, at the shape and dtypes priced
        shape = inputs.compute.modelled_detail.get("shape", "the traced shape")
        return traced, (f"counted from the op trace at {shape}: the tensors alive after its forward, "
                        "which the backward reads (autocast's weight copies not included)")
    layers = PRESET_DEPTH.get(work.layout.name)
    if layers and work.tokens_per_micro_batch:
        hidden = work.layout.tensors[0].shape[-1]  # the token embedding's width
        counted = memory.transformer_activations(layers, hidden, work.tokens_per_micro_batch,
                                                 inputs.compute.precision)
        return counted, (f"counted: 34 B x {work.tokens_per_micro_batch} tokens x {hidden} hidden x {layers} layers"
                         " (Korthikanti et al. 2022 Eq. 1, no stored attention scores)")
    return None, "unknown: give --activation-memory GB"


def _gpu_memory(comp: Compute) -> tuple[float | None, str]:
    from topoprof.model.compute import gpu_memory_gb

    if comp.gpu_memory_gb is not None:
        return comp.gpu_memory_gb, comp.origin("gpu_memory_gb")
    found = gpu_memory_gb(comp.gpu) if comp.gpu else None
    return found if found else (None, "unknown: give --gpu NAME or --gpu-memory GB")


def _memory_echo(inputs: ModelInputs) -> dict[str, tuple[Any, str]]:
    """The memory inputs (activations, the GPU's memory) as every input is echoed."""
    activations, act_source = _activations(inputs)
    return {"activation_memory_gb": (None if activations is None else activations / 1e9, act_source),
            "gpu_memory_gb": _gpu_memory(inputs.compute)}


def memory_by_strategy(res: Resolved, names) -> dict[str, Memory]:
    """Each strategy's memory per GPU, counted (topoprof.model.memory), and whether it fits."""
    from topoprof.model import memory

    work, cl = res.inputs.workload, res.inputs.cluster
    activations, _ = _activations(res.inputs)
    capacity, _ = _gpu_memory(res.inputs.compute)
    model = memory.MemoryModel(
        work.layout.params, param_bytes=work.grad_bytes, grad_bytes=work.grad_bytes, optimizer=_optimizer_name(res.inputs.compute.optimizer),
        world_size=cl.world_size, gpus_per_node=cl.gpus_per_node,
        gradient_as_bucket_view=work.gradient_as_bucket_view,
        largest_group_params=largest_group_params(work.layout, work.fsdp_unit),
        fsdp_param_bytes=work.fsdp_bytes[0], fsdp_reduce_bytes=work.fsdp_bytes[1],
        activations=activations)
    measured, basis = _measured_memory(work, model), "counted"
    if measured is not None:
        model, basis = measured
    out = {}
    for name in names:
        held = memory.holding(name, model)
        if held is None:
            continue
        f = memory.fit(held, None if capacity is None else capacity * memory.GB)
        parts = {"params": held.params, "grads": held.grads, "optimizer": held.optimizer, "buckets": held.buckets,
                 "unsharded": held.unsharded, "activations": held.activations}
        out[name] = Memory({k: None if v is None else v / memory.GB for k, v in parts.items()},
                           held.total / memory.GB, basis, capacity, f.fits, f.reason)
    return out


def _measured_memory(work: Workload, counted):
    """`counted` with the bytes one GPU measured per phase in place of the counted ones: weights,
    gradients and optimizer state as bytes per parameter (so that sharding and DDP's buckets apply
    to them as to counted ones), the activations as measured; None without a measurement."""
    from dataclasses import replace as changed

    from topoprof.model import memory

    m = work.measured_memory
    if not m or work.layout.params <= 0:
        return None
    n = work.layout.params
    per = lambda key: max(0.0, m[key]) / n  # noqa: E731
    model = changed(counted, param_bytes=per("params_bytes"), grad_bytes=per("grads_bytes"),
                    optimizer_state_bytes=per("optimizer_bytes"), activations=max(0.0, m["activations_bytes"]))
    return model, (f"measured on {m['device']} (torch.cuda.memory_allocated before and after each phase of a "
                   f"timed step; its peak {m['peak_bytes'] / memory.GB:.1f} GB)")


def _optimizer_name(name: str) -> str:
    from topoprof.model.memory import OPTIMIZER_STATES

    return name if name in OPTIMIZER_STATES else "adamw"


def largest_group_params(layout, unit: str | None = None) -> int:
    """The largest FSDP group's parameters (`fsdp.fsdp_plan`: one group per block, the rest in
    the root group); the whole model where no block is found."""
    try:
        return max(g.numel for g in fsdp.fsdp_plan(layout, unit).groups)
    except InputError:
        return layout.params


def _assemble(res: Resolved, nominal: dict, bounds: tuple[dict, dict] | None
              ) -> dict[str, StrategyResult | Unavailable]:
    synced = nominal["ddp_synced"]
    synced_rate = None if isinstance(synced, str) else _samples(res, "ddp_synced") / synced[0]
    out: dict[str, StrategyResult | Unavailable] = {}
    for name in STRATEGIES:
        if isinstance(nominal[name], str):
            out[name] = Unavailable(nominal[name])
            continue
        step, exposed = nominal[name]
        samples = _samples(res, name)
        rng = None
        if bounds is not None:
            (hi, e_hi), (lo, e_lo) = bounds[0][name], bounds[1][name]
            rng = Range((lo, hi), (e_lo, e_hi), (samples / hi, samples / lo))
        speedup = None if synced_rate is None else samples / step / synced_rate
        out[name] = StrategyResult(step, exposed, samples, samples / step, speedup, rng,
                                   FORMULAS[name])
    memory = memory_by_strategy(res, [n for n, r in out.items() if isinstance(r, StrategyResult)])
    # nothing is ranked against a strategy that does not fit
    unranked = getattr(memory.get("ddp_synced"), "fits", None) is False
    return {n: replace(r, memory=memory.get(n), **({"speedup_vs_ddp_synced": None} if unranked else {}))
            if isinstance(r, StrategyResult) else r for n, r in out.items()}


def predict(inputs: ModelInputs) -> Prediction:
    """Every strategy's step time; `dataclasses.asdict(prediction)` is the JSON."""
    res = resolve(inputs)
    comm = inputs.cluster.comm
    buckets = ddp_buckets(inputs.workload.layout, inputs.workload.grad_bytes,
                          inputs.workload.bucket_cap_mb)
    nominal = step_times(res, buckets, comm)
    slow_comm, fast_comm = comm.bounds() or (comm, comm)
    slow_res = fast_res = res
    if res.what_if:  # a what-if: every uncertain input at the end that makes steps slow, or fast
        slow_res, fast_res = resolve(inputs, "slow"), resolve(inputs, "fast")
    bounds = None
    if slow_res is not res or slow_comm is not comm:
        bounds = (step_times(slow_res, buckets, slow_comm), step_times(fast_res, buckets, fast_comm))
    first, cap = ddp_bucket_limits(inputs.workload.bucket_cap_mb)
    summary = BucketSummary(len(buckets), tuple(b.size_bytes for b in buckets),
                            tuple(b.ready_fraction for b in buckets), first, cap)
    pieces = {"micro_batch_s": res.micro_batch_s, "backward_s": res.backward_s,
              "optimizer_s": res.optimizer_s}
    if inputs.cluster.world_size > 1:  # DDP's and DP's pieces only where they apply
        pieces["ddp_exposed_s"] = ddp_exposed_s(res, buckets, comm)
        pieces["ddp_fp16_exposed_s"] = ddp_exposed_s(res, buckets, comm, fp16_compress=True)
    if inputs.cluster.world_size > 1 and inputs.cluster.nodes == 1:
        pieces["dp_comm_s"] = dp_comm_s(res, comm)
    echo = {name: InputValue(*pair) for name, pair in res.echo.items()}
    costs = {}
    if inputs.cluster.world_size > 1:
        costs = _ddp_costs(res, (slow_res, fast_res), buckets, (comm, slow_comm, fast_comm))
    return Prediction(_assemble(res, nominal, bounds), pieces, echo, summary, ASSUMPTIONS,
                      res.warnings, costs)


def with_shape(inputs: ModelInputs, nodes: int, gpus_per_node: int,
               accumulation_steps: int | None = None) -> ModelInputs:
    """The same job on another shape: the comm model re-derived for it (`CommModel.at_shape`)."""
    comm = inputs.cluster.comm.at_shape(nodes, gpus_per_node)
    k = accumulation_steps if accumulation_steps is not None else inputs.accumulation_steps
    return replace(inputs, cluster=Cluster(comm, nodes, gpus_per_node, backend=inputs.cluster.backend),
                   accumulation_steps=k)


def sweep(inputs: ModelInputs, accumulation_steps: Iterable[int] = range(1, 33),
          shapes: Iterable[tuple[int, int]] | None = None) -> tuple[SweepPoint, ...]:
    """Every strategy over k and over (nodes, gpus_per_node) shapes (default: the input's)."""
    cl = inputs.cluster
    points = []
    for nodes, gpus in shapes if shapes is not None else [(cl.nodes, cl.gpus_per_node)]:
        for k in accumulation_steps:
            try:
                strategies = predict(with_shape(inputs, nodes, gpus, k)).strategies
            except LinkUnknown as err:  # a shape whose links nobody described: not invented
                strategies = {name: Unavailable(str(err)) for name in STRATEGIES}
            points.append(SweepPoint(nodes, gpus, nodes * gpus, k, strategies))
    return tuple(points)


def hide_threshold(inputs: ModelInputs) -> HideThreshold | Unavailable:
    if inputs.cluster.world_size == 1:
        return Unavailable(ONE_GPU_REASON)
    res = resolve(inputs)
    work = inputs.workload
    buckets = ddp_buckets(work.layout, work.grad_bytes, work.bucket_cap_mb)
    backward_at_floor, floor = hiding_threshold(ddp_setting(res, buckets), buckets, inputs.cluster.comm)
    # copies do not depend on c; the pipeline part is scaled from backward to c
    threshold = backward_at_floor * res.micro_batch_s / res.backward_s
    now = ddp_exposed_s(res, buckets, inputs.cluster.comm)
    return HideThreshold(res.micro_batch_s, now, floor, threshold, res.micro_batch_s >= threshold)


def fixed_global_batch(inputs: ModelInputs, global_batch_samples: int,
                       shapes: Iterable[tuple[int, int]], strategy: str = "ddp_no_sync"
                       ) -> tuple[GlobalBatchOption, ...]:
    """The same global batch on each shape, k = global / (micro_batch_size x world_size):
    does fewer GPUs with more accumulation beat more GPUs? Fastest first."""
    _need(strategy in STRATEGIES, f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    mbs = inputs.workload.micro_batch_size
    options = []
    for nodes, gpus in shapes:
        n = nodes * gpus
        k, rest = divmod(global_batch_samples, mbs * n)
        if rest or k < 1:
            options.append(GlobalBatchOption(nodes, gpus, n, None, None, None, None,
                           f"global batch({global_batch_samples}) is not micro_batch_size({mbs})"
                           f" * world_size({n}) * an integer k"))
            continue
        options.append(_option_at(inputs, nodes, gpus, k, strategy))
    return tuple(sorted(options, key=lambda o: (o.step_time_s is None, o.step_time_s or 0.0)))


def _option_at(inputs: ModelInputs, nodes: int, gpus: int, k: int, strategy: str
               ) -> GlobalBatchOption:
    """One shape of `fixed_global_batch`. On one GPU, where DDP does not apply, the option is
    `single`: one GPU accumulating is what "fewer GPUs" ends at."""
    n = nodes * gpus
    try:
        strategies = predict(with_shape(inputs, nodes, gpus, k)).strategies
    except LinkUnknown as err:  # a shape whose links nobody described: not invented
        return GlobalBatchOption(nodes, gpus, n, k, None, None, None, str(err))
    name = "single" if n == 1 and isinstance(strategies[strategy], Unavailable) else strategy
    result = strategies[name]
    if isinstance(result, Unavailable):
        return GlobalBatchOption(nodes, gpus, n, k, None, None, None, result.reason, name)
    if result.memory is not None and result.memory.fits is False:  # never offered as an option
        return GlobalBatchOption(nodes, gpus, n, k, None, None, None, result.memory.reason, name)
    return GlobalBatchOption(nodes, gpus, n, k, result.step_time_s, result.samples_per_s,
                             result.samples_per_s / n, None, name)
