"""The answer wanted first: for each strategy and activation checkpointing mode, the largest
micro-batch that fits in the GPU's memory (the memory count at each size, `strategies.memory`);
the fastest combination that fits (strategy, mode, micro-batch) where the compute at each size and
mode can be priced, a strategy whose step is a lower bound (`steps.lower_bounds`) named apart
rather than ranked; what each mode costs in time (its recompute) and what no_sync costs in memory.

A micro-batch here is `micro_batch_size` sequences of the same length (the tokens given over the
micro-batch given); K stays as given, so a larger micro-batch is a larger global batch, and
samples per second compare them. A size fits when the top of its memory range does
(`topoprof.model.memory.holding.fit`). The search doubles the size while it fits, then bisects.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from topoprof.model.strategies.job import ModelInputs
from topoprof.model.strategies.memory import job_memory, memory_by_strategy
from topoprof.model.strategies.model_plan import ModelPlan
from topoprof.model.strategies.predict import predict
from topoprof.model.strategies.results import Memory, Prediction, StrategyResult
from topoprof.model.strategies.steps import lower_bounds
from topoprof.workload.checkpointing import parse_checkpointing

MAX_MICRO_BATCH = 1024  # the search's ceiling (a size past it is reported as ">= 1024")

# Strategies whose memory is one and the same: the search shows the first for all.
SAME_MEMORY = {"ddp_synced": ("ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only", "ddp_fp16_compress")}


def at(inputs: ModelInputs, mode: str, samples: int, compute=None) -> ModelInputs:
    """The job at `samples` sequences per micro-batch under checkpointing `mode` (`compute`: the
    compute priced there, where one was)."""
    work = inputs.workload
    seq = (work.tokens_per_micro_batch or 0) // max(1, work.micro_batch_size)
    changed = replace(work, micro_batch_size=samples, tokens_per_micro_batch=seq * samples if seq else None,
                      checkpointing=parse_checkpointing(mode))
    return replace(inputs, workload=changed, compute=compute or inputs.compute)


def why_not_searched(inputs: ModelInputs, capacity: float | None) -> str | None:
    work = inputs.workload
    if capacity is None:
        return "the GPU's memory is unknown (give --gpu NAME or --gpu-memory GB)"
    if work.activation_memory_gb is not None:
        return f"the activations were given for micro-batch {work.micro_batch_size} only (--activation-memory)"
    if work.measured_memory:
        return f"the activations were measured at micro-batch {work.micro_batch_size} only"
    if work.traced_memory_failure:
        return (f"the activations were counted from the model's own pass at micro-batch {work.micro_batch_size} "
                f"only: at other sizes, {work.traced_memory_failure}")
    modelled = inputs.compute.modelled
    if work.traced_memory is None and modelled is not None and modelled.detail.memory is not None:
        return (f"the activations were counted from the model's own pass at micro-batch {work.micro_batch_size} "
                "only (other sizes are counted for a text preset or --params with --tokens)")
    return None


@dataclass(frozen=True)
class Largest:
    """The largest micro-batch of `strategies` under `mode` that fits; None: not even 1."""

    strategies: tuple[str, ...]
    mode: str
    micro_batch: int | None
    total_gb: float | None        # its memory per GPU (the top of the range)
    next_gb: float | None         # the next size's, which does not fit
    reason: str | None = None     # why none fits, or why it is not known

    @property
    def cell(self) -> FitCell:
        """As the search's table shows it, under its mode in its strategies' row."""
        return FitCell(self.micro_batch, self.total_gb, self.next_gb, self.reason)


def _fits(inputs: ModelInputs, names: list[str], mode: str, samples: int) -> dict:
    resized = at(inputs, mode, samples)
    job = job_memory(resized)
    return memory_by_strategy(job, names)


def largest(inputs: ModelInputs, names: list[str], mode: str) -> dict[str, Largest]:
    """Per strategy in `names`, the largest micro-batch under `mode` whose memory fits."""
    first = _fits(inputs, names, mode, 1)
    out = {}
    for name in names:
        mem = first.get(name)
        if mem is None or mem.parts_gb.get("activations") is None:
            why = "not counted" if mem is None else mem.sources.get("activations") or "activations unknown"
            out[name] = Largest((name,), mode, None, None, None, why)
            continue
        if mem.fits is not True:
            out[name] = Largest((name,), mode, None, mem.total_gb, None, mem.reason)
            continue
        good, good_gb, bad, bad_gb = 1, mem.total_gb, None, None
        size = 2
        while bad is None and size <= MAX_MICRO_BATCH:
            m = _fits(inputs, [name], mode, size)[name]
            if m.fits is True:
                good, good_gb, size = size, m.total_gb, size * 2
            else:
                bad, bad_gb = size, m.total_gb
        while bad is not None and bad - good > 1:
            mid = (good + bad) // 2
            m = _fits(inputs, [name], mode, mid)[name]
            if m.fits is True:
                good, good_gb = mid, m.total_gb
            else:
                bad, bad_gb = mid, m.total_gb
        out[name] = Largest((name,), mode, good, good_gb, bad_gb)
    return out


def _groups(names: list[str]) -> list[tuple[str, ...]]:
    """The strategies in `names`, those holding the same memory (DDP's) as one group."""
    out: list[tuple[str, ...]] = []
    done: set[str] = set()
    for name in names:
        if name in done:
            continue
        group = next((tuple(n for n in g if n in names) for g in SAME_MEMORY.values() if name in g), (name,))
        done.update(group)
        out.append(group)
    return out


NO_SYNC_PAIRS = (("fsdp_full_shard", "fsdp_full_shard_no_sync"), ("fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync"),
                 ("hsdp", "hsdp_no_sync"))


def no_sync_memory(memory: dict[str, Memory]) -> tuple[NoSyncMemory, ...]:
    """What FSDP's no_sync holds beyond its synced twin per GPU, from each strategy's `memory` at
    the size and mode given: every group's unsharded gradient, full size, until the micro-batch
    that syncs."""
    return tuple(NoSyncMemory(a, b, memory[b].total_gb - memory[a].total_gb, memory[b].fits)
                 for a, b in NO_SYNC_PAIRS if a in memory and b in memory)


@dataclass(frozen=True)
class Candidate:
    strategy: str
    mode: str
    micro_batch: int
    step_time_s: float
    samples_per_s: float
    memory_gb: float


@dataclass(frozen=True)
class ModeCost:
    """What a checkpointing mode costs per micro-batch at the size given: its compute over none's,
    and its recompute priced alone."""

    mode: str
    micro_batch_s: float
    extra_s: float
    recompute_s: float


@dataclass(frozen=True)
class FitCell:
    """The largest micro-batch of a row's strategies under one mode (`Largest`)."""

    micro_batch: int | None
    total_gb: float | None
    next_gb: float | None
    reason: str | None = None


@dataclass(frozen=True)
class LargestRow:
    strategies: tuple[str, ...]
    cells: dict[str, FitCell]  # by checkpointing mode; on the wire, each mode is a key of the row


@dataclass(frozen=True)
class NoSyncMemory:
    synced: str
    no_sync: str
    extra_gb: float
    fits: bool | None


@dataclass(frozen=True)
class Fits:
    """The search for what fits (module docstring); `reason`: why it was not run; `fastest_reason`:
    why the fastest that fits was not ranked."""

    modes: tuple[str, ...]
    gpu_memory_gb: float | None
    gpu_memory_source: str | None
    micro_batch_now: int
    tokens_per_sample: int | None
    accumulation_steps: int
    reason: str | None = None
    largest: tuple[LargestRow, ...] = ()
    no_sync: tuple[NoSyncMemory, ...] = ()
    fastest: tuple[Candidate, ...] = ()
    mode_costs: tuple[ModeCost, ...] = ()
    fastest_reason: str | None = None
    unranked: dict[str, str] = field(default_factory=dict)  # a strategy left out of `fastest`: why


@dataclass(frozen=True)
class SearchPlan:
    """The search as far as the memory takes it: what it found so far (`fits`; with its `reason`
    where it is not searched), the largest size per mode and strategy (`table`), and the (mode,
    samples) whose compute the fastest that fits needs (`wanted`)."""

    fits: Fits
    names: tuple[str, ...] = ()
    table: dict | None = None
    wanted: tuple[tuple[str, int], ...] = ()


def searched_strategies(planned: ModelPlan) -> list[str]:
    """The strategies the search takes: those priced here, or found not to fit, that the plan does
    not refuse."""
    return [name for name, r in planned.prediction.strategies.items()
            if name not in planned.refused and isinstance(r, StrategyResult)
            and (math.isfinite(r.step_time_s) or (r.memory is not None and r.memory.fits is False))]


def plan_search(inputs: ModelInputs, names: list[str], prediction: Prediction) -> SearchPlan:
    """The memory half of the search (module docstring), from `prediction` at the size and mode
    given (`predict(inputs)`): the GPU's memory, and what no_sync costs there; `finish_search`
    completes it with the compute priced at `wanted`."""
    work = inputs.workload
    modes = work.checkpointing.searched_modes
    gpu_memory = prediction.inputs.get("gpu_memory_gb")
    capacity, capacity_source = (gpu_memory.value, gpu_memory.source) if gpu_memory is not None else (None, None)
    given = {name: result.memory for name in names
             if isinstance(result := prediction.strategies.get(name), StrategyResult) and result.memory is not None}
    tokens_per_sample = None if work.layout.unit == "image" else \
        (work.tokens_per_micro_batch or 0) // max(1, work.micro_batch_size) or None
    fits = Fits(modes, capacity, capacity_source, work.micro_batch_size, tokens_per_sample, inputs.accumulation_steps,
                why_not_searched(inputs, capacity))
    if fits.reason is not None:
        return SearchPlan(fits)
    groups, no_sync = _groups(names), no_sync_memory(given)
    table = {mode: largest(inputs, names, mode) for mode in modes}
    # a group of strategies holding the same memory shows its first's
    rows = tuple(LargestRow(group, {mode: table[mode][group[0]].cell for mode in modes}) for group in groups)
    fits = replace(fits, largest=rows, no_sync=no_sync)
    now = work.micro_batch_size
    wanted: set[tuple[str, int]] = {(mode, now) for mode in modes}
    wanted |= {(mode, size) for mode in modes for n in names if (size := table[mode][n].micro_batch)}
    return SearchPlan(fits, tuple(names), table, tuple(sorted(wanted)))


def finish_search(inputs: ModelInputs, plan: SearchPlan, priced: dict[tuple[str, int], object] | str | None) -> Fits:
    """The search's result (module docstring). `priced`: the compute (a `Compute`) at each (mode,
    samples) of `plan.wanted`, or why it could not be priced; None: the compute is not priced here."""
    if plan.table is None:
        return plan.fits
    if priced is None:
        return replace(plan.fits, fastest_reason=(
            "the compute at other micro-batches and modes is not priced here (it was measured or given at the size "
            "it ran); `topoprof model --gpu NAME --tokens N` prices them from the model's own ops"))
    if isinstance(priced, str):
        return replace(plan.fits, fastest_reason=f"the compute at other sizes and modes could not be priced ({priced})")
    return _fastest_and_costs(inputs, plan, priced)


def search(inputs: ModelInputs, names: list[str],
           price: Callable[[list[tuple[str, int]]], dict[tuple[str, int], object] | str] | None,
           prediction: Prediction | None = None) -> Fits:
    """The whole search, `price` giving the compute (a `Compute`) at each (mode, samples) asked,
    or why it cannot; None: the compute is not priced here. `prediction`: `predict(inputs)`,
    where it was made already."""
    plan = plan_search(inputs, names, prediction or predict(inputs, parts=False))
    priced = price(list(plan.wanted)) if price is not None and plan.table is not None else None
    return finish_search(inputs, plan, priced)


def _fastest_and_costs(inputs: ModelInputs, plan: SearchPlan, priced: dict) -> Fits:
    """The search completed with the fastest that fits and what each mode costs, from the compute
    `priced` at each (mode, samples) the plan wanted."""
    assert plan.table is not None
    now = inputs.workload.micro_batch_size
    modes, table = plan.fits.modes, plan.table
    candidates = []
    predictions = {}
    for (mode, m), compute in priced.items():
        predictions[(mode, m)] = predict(at(inputs, mode, m, compute), parts=False).strategies
    for mode in modes:
        for name in plan.names:
            m = table[mode][name].micro_batch
            result = predictions.get((mode, m), {}).get(name) if m else None
            if not isinstance(result, StrategyResult):
                continue
            if result.memory is None or result.memory.fits is not True:
                continue
            candidates.append(Candidate(name, mode, m, result.step_time_s, result.samples_per_s,
                                        result.memory.total_gb))
    # a lower bound is not ranked against the others: said where it would have been a candidate
    lower = lower_bounds(inputs.compute.dp_thread_overhead_s)
    unranked = {c.strategy: lower[c.strategy] for c in candidates if c.strategy in lower}
    candidates = sorted((c for c in candidates if c.strategy not in lower), key=lambda c: -c.samples_per_s)
    costs = []
    base = priced.get(("none", now))
    for mode in modes:
        comp = priced.get((mode, now))
        if comp is None or base is None or comp.modelled is None or base.modelled is None:
            continue
        middle, base_middle = comp.modelled.middle_s, base.modelled.middle_s
        recompute = comp.modelled.detail.recomputed_middle_s
        costs.append(ModeCost(mode, middle, middle - base_middle, recompute))
    return replace(plan.fits, fastest=tuple(candidates[:5]), mode_costs=tuple(costs), unranked=unranked)
