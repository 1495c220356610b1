"""Every strategy's predicted step for a job (`predict`), and what changing it would gain:
`sweep` over K and shapes, `hide_threshold`, `fixed_global_batch`.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from topoprof.errors import InputError
from topoprof.model.comm.collectives import LinkUnknown
from topoprof.model.strategies.fsdp_costs import fsdp_costs_by_part, hsdp_levels
from topoprof.model.strategies.job import Cluster, ModelInputs
from topoprof.model.strategies.resolve import resolve_ends
from topoprof.model.strategies.results import (
    BucketSummary,
    GlobalBatchOption,
    HideThreshold,
    InputValue,
    Prediction,
    SweepPoint,
    Unavailable,
)
from topoprof.model.strategies.steps import (
    ASSUMPTIONS,
    ONE_GPU_REASON,
    STRATEGIES,
    ddp_costs_by_part,
    ddp_pieces,
    dp_comm_s,
    step_times,
    strategy_results,
)


def predict(inputs: ModelInputs, parts: bool = True) -> Prediction:
    """Every strategy's step time; `dataclasses.asdict(prediction)` is the JSON. `parts`: DDP's
    and FSDP's costs part by part, HSDP's levels and DDP's hiding threshold too (more timelines
    each), for the payload; a caller that reads the strategies alone leaves them out."""
    res, slow_res, fast_res = resolve_ends(inputs)
    comm, buckets = inputs.cluster.comm, res.buckets
    pieces = {"micro_batch_s": res.micro_batch_s, "backward_s": res.backward_s,
              "optimizer_s": res.optimizer_s}
    hide: HideThreshold | Unavailable | None = Unavailable(ONE_GPU_REASON) if parts else None
    exposed = None
    if inputs.cluster.gpus > 1:  # DDP's and DP's pieces only where they apply
        e, e16, hide = ddp_pieces(res, comm, threshold=parts)
        pieces["ddp_exposed_s"], pieces["ddp_fp16_exposed_s"], exposed = e, e16, (e, e16)
    nominal = step_times(res, comm, exposed)
    slow_comm, fast_comm = comm.bounds() or (comm, comm)
    bounds = None
    if slow_res is not res or slow_comm is not comm:
        bounds = (step_times(slow_res, slow_comm), step_times(fast_res, fast_comm))
    first, cap = res.bucket_limits
    summary = BucketSummary(len(buckets), tuple(b.size_bytes for b in buckets),
                            tuple(b.ready_fraction for b in buckets), first, cap)
    if inputs.cluster.gpus > 1 and inputs.cluster.nodes == 1:
        pieces["dp_comm_s"] = dp_comm_s(res, comm)
    echo = {name: InputValue(*pair) for name, pair in res.echo.items()}
    costs, fsdp, hsdp = {}, {}, None
    if parts and inputs.cluster.gpus > 1:
        costs = ddp_costs_by_part(res, (slow_res, fast_res), buckets, (comm, slow_comm, fast_comm))
        fsdp = fsdp_costs_by_part(res, (slow_res, fast_res), (comm, slow_comm, fast_comm))
        hsdp = hsdp_levels(res, comm)
    return Prediction(strategy_results(res, nominal, bounds), pieces, echo, summary, ASSUMPTIONS,
                      res.warnings, costs, fsdp, hsdp, hide)


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
                strategies = predict(with_shape(inputs, nodes, gpus, k), parts=False).strategies
            except LinkUnknown as err:  # a shape whose links nobody described: not invented
                strategies = {name: Unavailable(str(err)) for name in STRATEGIES}
            points.append(SweepPoint(nodes, gpus, nodes * gpus, k, strategies))
    return tuple(points)


def fixed_global_batch(inputs: ModelInputs, global_batch_samples: int,
                       shapes: Iterable[tuple[int, int]], strategy: str = "ddp_no_sync"
                       ) -> tuple[GlobalBatchOption, ...]:
    """The same global batch on each shape, k = global / (micro_batch_size x world_size):
    does fewer GPUs with more accumulation beat more GPUs? Fastest first."""
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
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
        strategies = predict(with_shape(inputs, nodes, gpus, k), parts=False).strategies
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
