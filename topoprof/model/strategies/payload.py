"""A prediction as JSON data: every strategy, the inputs with their sources, the buckets, the
sweep over K and the same global batch on fewer GPUs (what `model --json` prints and a scan
report embeds)."""
from __future__ import annotations

from dataclasses import replace

from topoprof.jsonio import to_jsonable
from topoprof.model.strategies.predict import fixed_global_batch, hide_threshold, predict
from topoprof.model.strategies.predict import sweep as sweep_k
from topoprof.model.strategies.results import StrategyResult

SWEEP_K = (1, 2, 4, 8, 16, 32)


MAIN = ("single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only", "ddp_fp16_compress",
        "fsdp_full_shard", "fsdp_full_shard_no_sync", "fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync",
        "hsdp", "hsdp_no_sync")


def _world_sizes(inputs) -> list[int]:
    """Power-of-two GPU counts up to the node's size (fewer GPUs with more accumulation?)."""
    gpn = inputs.cluster.gpus_per_node
    sizes, n = [], 1
    while n < gpn:
        sizes.append(n)
        n *= 2
    return sizes + [gpn]


def model_payload(inputs, described: dict, sweep: bool = True) -> dict:
    prediction = predict(inputs)
    payload = {"strategies": _strategies(prediction), "inputs": to_jsonable(prediction.inputs),
               "links": described, "per_micro_batch": prediction.per_micro_batch,
               "buckets": to_jsonable(prediction.buckets), "assumptions": list(prediction.assumptions),
               "warnings": [*prediction.warnings, *described.get("notes", [])],
               "hide_threshold": to_jsonable(hide_threshold(inputs)),
               "ddp_costs": to_jsonable(prediction.ddp_costs), "ddp_knobs": ddp_knobs(inputs, prediction),
               "fsdp_costs": to_jsonable(prediction.fsdp_costs), "hsdp": to_jsonable(prediction.hsdp)}
    if sweep:
        points = sweep_k(inputs, SWEEP_K)
        payload["sweep"] = {
            "accum": list(SWEEP_K), "world_size": inputs.cluster.world_size,
            "samples_per_micro_batch": inputs.workload.micro_batch_size,
            "strategies": {name: [_step(p.strategies[name]) for p in points] for name in MAIN},
        }
        cl = inputs.cluster
        global_batch = inputs.workload.micro_batch_size * inputs.accumulation_steps * cl.world_size
        shapes = [(cl.nodes, g) for g in _world_sizes(inputs)]
        payload["fixed_global_batch"] = {"global_batch_samples": global_batch,
                                         "options": to_jsonable(fixed_global_batch(inputs, global_batch, shapes))}
    return payload


# DDP's options a user can change, each with the part of DDP's cost it acts on. static_graph is
# not among them: what it saves (the reducer's per-iteration graph checks) is no part the model
# prices, so it is never recommended from a prediction.
KNOBS = (
    ("gradient_as_bucket_view=True", "ddp_kernels, copy_traffic", {"gradient_as_bucket_view": True}),
    ("bucket_cap_mb=100", "ddp_kernels, allreduce_tail", {"bucket_cap_mb": 100.0}),
    ("bucket_cap_mb=10", "allreduce_tail", {"bucket_cap_mb": 10.0}),
)


MIN_KNOB_GAIN_PCT = 0.1


def ddp_knobs(inputs, prediction) -> list[dict]:
    """Each DDP option's predicted gain on `ddp_synced` (and the fp16 hook's, from the strategy
    table), with the part it comes from; only the ones that gain."""
    now = prediction.strategies.get("ddp_synced")
    if not isinstance(now, StrategyResult):
        return []
    out: list[dict] = []
    for knob, part, change in KNOBS:
        if all(getattr(inputs.workload, k) == v for k, v in change.items()):
            continue
        changed = replace(inputs, workload=replace(inputs.workload, **change))
        after = predict(changed, parts=False).strategies["ddp_synced"]
        assert isinstance(after, StrategyResult)  # as `now`: an option does not make DDP unavailable
        out.append({"knob": knob, "part": part, "step_time_s": after.step_time_s})
    fp16 = prediction.strategies.get("ddp_fp16_compress")
    if isinstance(fp16, StrategyResult):
        out.append({"knob": "register_comm_hook(fp16_compress_hook)", "part": "allreduce_tail",
                    "step_time_s": fp16.step_time_s})
    for o in out:
        o["gain_s"] = now.step_time_s - o["step_time_s"]
        o["gain_pct"] = 100.0 * o["gain_s"] / now.step_time_s
    # a gain under 0.1 % of a step is no gain a run could show
    return sorted((o for o in out if o["gain_pct"] >= MIN_KNOB_GAIN_PCT), key=lambda o: -o["gain_s"])


def _step(result):
    """A sweep point's step time; none for a strategy that does not fit in memory (never drawn or
    compared, as in the strategy table)."""
    if getattr(getattr(result, "memory", None), "fits", None) is False:
        return None
    return getattr(result, "step_time_s", None)


def _strategies(prediction) -> dict:
    out: dict = {}
    for name, result in prediction.strategies.items():
        if hasattr(result, "reason"):
            out[name] = None
            out.setdefault("_reasons", {})[name] = result.reason
        else:
            out[name] = to_jsonable(result)
    reasons = out.pop("_reasons", {})
    for name, reason in reasons.items():
        out[name] = {"reason": reason, "step_time_s": None}
    return out
