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
from topoprof.model.ddp import DdpSetting, ddp_timeline, hiding_threshold
from topoprof.model.results import (BucketSummary, GlobalBatchOption, HideThreshold,
                                    InputValue, Prediction, Range, StrategyResult,
                                    SweepPoint, Unavailable)
from topoprof.errors import InputError
from topoprof.model.compute import (MEMORY_UNKNOWN_NOTE, UTILIZATION_RANGE, Compute, compute_times,
                                    utilization_is_assumed)
from topoprof.model.presets import Layout, get_preset, synthetic_layout

STRATEGIES = ("single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only",
              "ddp_fp16_compress")
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

    def __post_init__(self) -> None:
        _need(self.grad_bytes in (2, 4), f"grad_bytes must be 2 or 4, got {self.grad_bytes}")
        _need(self.param_bytes in (2, 4), f"param_bytes must be 2 or 4, got {self.param_bytes}")
        _need(self.micro_batch_size >= 1,
              f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        _need(self.tokens_per_micro_batch is None or self.tokens_per_micro_batch >= 1,
              f"tokens_per_micro_batch must be >= 1, got {self.tokens_per_micro_batch}")
        _need(self.dp_output_bytes >= 0,
              f"dp_output_bytes must be >= 0, got {self.dp_output_bytes}")
        if self.layout.unit == "image":  # FLOPs per image: a micro-batch is micro_batch_size images
            _need(self.tokens_per_micro_batch in (None, self.micro_batch_size),
                  f"tokens_per_micro_batch({self.tokens_per_micro_batch}) of an image model is its "
                  f"micro_batch_size({self.micro_batch_size}) images")
            object.__setattr__(self, "tokens_per_micro_batch", self.micro_batch_size)
        ddp_bucket_limits(self.bucket_cap_mb)  # validates

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

    def __post_init__(self) -> None:
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
class Resolved:
    """The numbers the strategies need; `echo` says where each came from."""

    inputs: ModelInputs
    micro_batch_s: float
    backward_s: float
    optimizer_s: float
    memory_bandwidth_gbps: float | None
    echo: dict[str, tuple[Any, str]]
    warnings: tuple[str, ...]


def resolve(inputs: ModelInputs) -> Resolved:
    work, cl = inputs.workload, inputs.cluster
    times = compute_times(inputs.compute, work.layout.params, work.layout.train_flops_per_token,
                          work.tokens_per_micro_batch, work.grad_bytes, unit=work.layout.unit)
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
                                else "default 0: outputs assumed small (a loss)")}
    # one GPU has no DDP buckets to copy: the memory-bandwidth caveat does not concern it
    notes = tuple(w for w in times.warnings if cl.world_size > 1 or w != MEMORY_UNKNOWN_NOTE)
    return Resolved(inputs, times.micro_batch_s, times.backward_s, times.optimizer_s,
                    times.memory_bandwidth_gbps, echo, notes)


def ddp_setting(res: Resolved) -> DdpSetting:
    work, compute = res.inputs.workload, res.inputs.compute
    return DdpSetting(res.backward_s, work.layout.params, work.grad_bytes, res.memory_bandwidth_gbps,
                      compute.compute_slowdown_during_comm, compute.comm_slowdown_during_compute,
                      compute.comm_slowdown_by_size, work.gradient_as_bucket_view,
                      compute.ddp_copy_bandwidth_gbps)


def ddp_exposed_s(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel,
                  fp16_compress: bool = False) -> float:
    """E per synced micro-batch (`topoprof.model.ddp`)."""
    return ddp_timeline(ddp_setting(res), buckets, comm, fp16_compress).exposed_s


# How many micro-batches of a step all-reduce, per DDP strategy (of k).
def _synced(mode: str, k: int) -> int:
    return 1 if mode == "ddp_no_sync" else k


def step_components(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel, mode: str) -> dict[str, float]:
    """A DDP strategy's step in the parts a timeline shows: compute (forward and backward, with
    DDP's hooks and what communication slows it), the communication left exposed after backward
    (the tail of the all-reduces and the bucket copies), the optimizer. They add up to the step."""
    k = res.inputs.accumulation_steps
    timeline = ddp_timeline(ddp_setting(res), buckets, comm, fp16_compress=mode == "ddp_fp16_compress")
    overlap, n = timeline.overlap, _synced(mode, k)
    slowed = overlap.backward_end_s - res.backward_s  # what backward lost to the all-reduces
    # Half the copies' traffic runs inside backward (each gradient into its bucket as it is
    # ready), half after the last all-reduce (the buckets back into the gradients), where a
    # timeline shows them: in compute and in the exposed tail.
    tail = max(0.0, overlap.comm_end_s - overlap.backward_end_s) + timeline.copies_s / 2
    return {"compute": k * (res.micro_batch_s + res.inputs.compute.ddp_overhead_s) + n * (slowed + timeline.copies_s / 2),
            "exposed_comm": n * tail, "optimizer": res.optimizer_s}


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
    out: dict[str, tuple[float, float] | str] = {
        "single": (k * c + t_opt, 0.0),
        "ddp_synced": (k * (cd + e) + t_opt, k * e),
        "ddp_no_sync": (k * cd + e + t_opt, e),
        # _post_forward calls reducer.prepare_for_backward whenever require_backward_grad_sync
        # is True during forward; no_sync() around backward alone then changes nothing.
        "ddp_no_sync_backward_only": (k * (cd + e) + t_opt, k * e),
        "ddp_fp16_compress": (k * (cd + e16) + t_opt, k * e16),
    }
    if res.inputs.cluster.nodes > 1:
        out["dp"] = "DataParallel is single-process, single-node"
    else:
        d = dp_comm_s(res, comm)
        out["dp"] = (k * (c + d + res.inputs.compute.dp_thread_overhead_s) + t_opt, k * d)
    return out


FORMULAS = {
    "single": "k*c + T_opt (one GPU)",
    "dp": "k*(c + broadcast(params) + gather(outputs) + reduce(grads) + thread_overhead) + T_opt",
    "ddp_synced": "k*(c + o + E) + T_opt",
    "ddp_no_sync": "k*(c + o) + E + T_opt",
    "ddp_no_sync_backward_only": "k*(c + o + E) + T_opt, the same as ddp_synced",
    "ddp_fp16_compress": "k*(c + o + E_fp16) + T_opt",
}
ASSUMPTIONS = (
    "gradients become ready in reverse forward order; a tensor's share of backward is its "
    "matmul FLOPs (embedding lookups, norms, biases ~0; attention score FLOPs left out)",
    "DDP buckets are the ones rebuilt after the first iteration (gradient-ready order); the "
    "first iteration (one bucket per dtype) and buffer broadcasts are not modelled",
    "bucket all-reduces run one at a time in bucket order: start_j = max(ready_j, end_{j-1})",
    "bucket copy traffic (4G bytes, 2G with gradient_as_bucket_view) is fully exposed",
    "DDP's optimizer step on each GPU takes T_opt, as on one GPU",
    "DataParallel: input scatter and the flatten/unflatten copies of broadcast_coalesced and "
    "reduce_add_coalesced not modelled; output gather = dp_output_bytes per GPU; "
    "Python-thread/GIL cost = dp_thread_overhead_s (both 0 unless given)",
)


def _samples(res: Resolved, name: str) -> int:
    gpus = 1 if name == "single" else res.inputs.cluster.world_size
    return res.inputs.workload.micro_batch_size * res.inputs.accumulation_steps * gpus


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
    return out


def predict(inputs: ModelInputs) -> Prediction:
    """Every strategy's step time; `dataclasses.asdict(prediction)` is the JSON."""
    res = resolve(inputs)
    comm = inputs.cluster.comm
    buckets = ddp_buckets(inputs.workload.layout, inputs.workload.grad_bytes,
                          inputs.workload.bucket_cap_mb)
    nominal = step_times(res, buckets, comm)
    slow_comm, fast_comm = comm.bounds() or (comm, comm)
    slow_res = fast_res = res
    if utilization_is_assumed(inputs.compute):  # a datasheet what-if: the utilization's whole range
        low, high = UTILIZATION_RANGE
        slow_res = resolve(replace(inputs, compute=replace(inputs.compute, utilization=low)))
        fast_res = resolve(replace(inputs, compute=replace(inputs.compute, utilization=high)))
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
    return Prediction(_assemble(res, nominal, bounds), pieces, echo, summary, ASSUMPTIONS,
                      res.warnings)


def with_shape(inputs: ModelInputs, nodes: int, gpus_per_node: int,
               accumulation_steps: int | None = None) -> ModelInputs:
    """The same job on another shape: the comm model re-derived for it (`CommModel.at_shape`)."""
    comm = inputs.cluster.comm.at_shape(nodes, gpus_per_node)
    k = accumulation_steps if accumulation_steps is not None else inputs.accumulation_steps
    return replace(inputs, cluster=Cluster(comm, nodes, gpus_per_node), accumulation_steps=k)


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
    backward_at_floor, floor = hiding_threshold(ddp_setting(res), buckets, inputs.cluster.comm)
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
    return GlobalBatchOption(nodes, gpus, n, k, result.step_time_s, result.samples_per_s,
                             result.samples_per_s / n, None, name)
