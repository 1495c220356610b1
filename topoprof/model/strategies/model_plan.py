"""Everything `topoprof model` predicts for a job, typed (`ModelPlan`): every strategy, what DDP's
options would gain, the sweep over K and the same global batch on fewer GPUs. Pure: it reads the
inputs alone; `model_report.model_payload` writes it as JSON, once, with the fits search.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from topoprof.model.strategies.job import ModelInputs
from topoprof.model.strategies.predict import fixed_global_batch, predict
from topoprof.model.strategies.predict import sweep as sweep_k
from topoprof.model.strategies.results import (
    GlobalBatchOption,
    Prediction,
    StrategyResult,
    Unavailable,
)

SWEEP_K = (1, 2, 4, 8, 16, 32)


MAIN = ("single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only", "ddp_fp16_compress",
        "fsdp_full_shard", "fsdp_full_shard_no_sync", "fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync",
        "hsdp", "hsdp_no_sync")


@dataclass(frozen=True)
class KnobGain:
    """A DDP option's predicted gain on ddp_synced, and the part of DDP's cost it acts on."""

    knob: str
    part: str
    step_time_s: float
    gain_s: float
    gain_pct: float


@dataclass(frozen=True)
class Sweep:
    accum: tuple[int, ...]
    world_size: int
    samples_per_micro_batch: int
    strategies: dict[str, tuple[float | None, ...]]  # a step time per K; None: not applying, or not fitting


@dataclass(frozen=True)
class FixedGlobalBatch:
    global_batch_samples: int
    options: tuple[GlobalBatchOption, ...]


@dataclass(frozen=True)
class ModelPlan:
    """What `plan_model` predicts. `links`: what the links were read from, as described where they
    were chosen; `refused`: strategies this run cannot stand for, with why (a scan on CPU ranks has
    no GPUs for DataParallel), kept in their place and never searched."""

    prediction: Prediction
    links: dict
    knobs: tuple[KnobGain, ...]
    sweep: Sweep | None = None
    fixed_global_batch: FixedGlobalBatch | None = None
    refused: dict[str, str] = field(default_factory=dict)

    def refusing(self, name: str, reason: str) -> ModelPlan:
        return replace(self, refused={**self.refused, name: reason})


def plan_model(inputs: ModelInputs, links: dict, sweep: bool = True) -> ModelPlan:
    """Every strategy (`predict`), DDP's options, and with `sweep` the steps over K and the same
    global batch on each power-of-two GPU count up to the node's."""
    prediction = predict(inputs)
    plan = ModelPlan(prediction, links, ddp_knobs(inputs, prediction))
    if not sweep:
        return plan
    points = sweep_k(inputs, SWEEP_K)
    steps = Sweep(SWEEP_K, inputs.cluster.gpus, inputs.workload.micro_batch_size,
                  {name: tuple(_step(p.strategies[name]) for p in points) for name in MAIN})
    cl = inputs.cluster
    global_batch = inputs.workload.micro_batch_size * inputs.accumulation_steps * cl.gpus
    shapes = [(cl.nodes, g) for g in _world_sizes(inputs)]
    fixed = FixedGlobalBatch(global_batch, fixed_global_batch(inputs, global_batch, shapes))
    return replace(plan, sweep=steps, fixed_global_batch=fixed)


def _world_sizes(inputs: ModelInputs) -> list[int]:
    """Power-of-two GPU counts up to the node's size (fewer GPUs with more accumulation?)."""
    gpn = inputs.cluster.gpus_per_node
    sizes, n = [], 1
    while n < gpn:
        sizes.append(n)
        n *= 2
    return sizes + [gpn]


def _step(result: StrategyResult | Unavailable) -> float | None:
    """A sweep point's step time; none for a strategy that does not apply or does not fit in memory
    (never drawn or compared, as in the strategy table)."""
    if not isinstance(result, StrategyResult) or (result.memory is not None and result.memory.fits is False):
        return None
    return result.step_time_s


# DDP's options a user can change, each with the part of DDP's cost it acts on. static_graph is
# not among them: what it saves (the reducer's per-iteration graph checks) is no part the model
# prices, so it is never recommended from a prediction.
KNOBS = (
    ("gradient_as_bucket_view=True", "ddp_kernels, copy_traffic", {"gradient_as_bucket_view": True}),
    ("bucket_cap_mb=100", "ddp_kernels, allreduce_tail", {"bucket_cap_mb": 100.0}),
    ("bucket_cap_mb=10", "allreduce_tail", {"bucket_cap_mb": 10.0}),
)


MIN_KNOB_GAIN_PCT = 0.1


def ddp_knobs(inputs: ModelInputs, prediction: Prediction) -> tuple[KnobGain, ...]:
    """Each DDP option's predicted gain on `ddp_synced` (and the fp16 hook's, from the strategy
    table), with the part it comes from; only the ones that gain."""
    now = prediction.strategies.get("ddp_synced")
    if not isinstance(now, StrategyResult):
        return ()
    steps: list[tuple[str, str, float]] = []
    for knob, part, change in KNOBS:
        if all(getattr(inputs.workload, k) == v for k, v in change.items()):
            continue
        changed = replace(inputs, workload=replace(inputs.workload, **change))
        after = predict(changed, parts=False).strategies["ddp_synced"]
        assert isinstance(after, StrategyResult)  # as `now`: an option does not make DDP unavailable
        steps.append((knob, part, after.step_time_s))
    fp16 = prediction.strategies.get("ddp_fp16_compress")
    if isinstance(fp16, StrategyResult):
        steps.append(("register_comm_hook(fp16_compress_hook)", "allreduce_tail", fp16.step_time_s))
    gains = [KnobGain(knob, part, step, now.step_time_s - step, 100.0 * (now.step_time_s - step) / now.step_time_s)
             for knob, part, step in steps]
    # a gain under 0.1 % of a step is no gain a run could show
    return tuple(sorted((g for g in gains if g.gain_pct >= MIN_KNOB_GAIN_PCT), key=lambda g: -g.gain_s))
