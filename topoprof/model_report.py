"""The `topoprof model` result as JSON data and as text tables."""
from __future__ import annotations

from topoprof.jsonio import to_jsonable

SWEEP_K = (1, 2, 4, 8, 16, 32)
MAIN = ("single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only", "ddp_fp16_compress")


def _world_sizes(inputs) -> list[int]:
    """Power-of-two GPU counts up to the node's size (fewer GPUs with more accumulation?)."""
    gpn = inputs.cluster.gpus_per_node
    sizes, n = [], 1
    while n < gpn:
        sizes.append(n)
        n *= 2
    return sizes + [gpn]


def model_payload(inputs, described: dict, sweep: bool = True) -> dict:
    from topoprof.costmodel import fixed_global_batch, hide_threshold, predict
    from topoprof.costmodel import sweep as sweep_k

    prediction = predict(inputs)
    payload = {"strategies": _strategies(prediction), "inputs": to_jsonable(prediction.inputs),
               "links": described, "per_micro_batch": prediction.per_micro_batch,
               "buckets": to_jsonable(prediction.buckets), "assumptions": list(prediction.assumptions),
               "warnings": list(prediction.warnings), "hide_threshold": to_jsonable(hide_threshold(inputs))}
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


def _step(result):
    return getattr(result, "step_time_s", None)


def _strategies(prediction) -> dict:
    out = {}
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


def describe_links(links: dict) -> str:
    if "bench" in links:
        return f"all-reduce fit measured by bench ({links['bench']})"
    if "link_bandwidth_gbps" in links:
        return f"{links['link_bandwidth_gbps']:g} GB/s per direction (given)"
    lo, hi = links["bottleneck_gbps"]
    ring = "-".join(str(g) for g in links["ring"])
    kind = "NVLink" if links["hop"] == "NV" else "PCIe / host"
    span = f"{lo:.1f} GB/s" if lo == hi else f"{lo:.1f}-{hi:.1f} GB/s (uncertain: predictions are given as ranges)"
    return f"nominal ring {ring} of {links['topology']}, slowest edge {kind} {span} per direction"


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def _strategy_rows(payload: dict) -> list[str]:
    lines = [f"{'strategy':<28}{'step ms':>12}{'exposed comm ms':>17}{'samples/s':>12}{'vs ddp_synced':>15}  range (step ms)"]
    for name, s in payload["strategies"].items():
        if s.get("step_time_s") is None:
            lines.append(f"{name:<28}{'n/a':>12}   {s.get('reason', '')}")
            continue
        rng = s.get("range")
        span = "" if not rng else f"{_ms(rng['step_time_s'][0])} - {_ms(rng['step_time_s'][1])}"
        lines.append(f"{name:<28}{_ms(s['step_time_s']):>12}{_ms(s['comm_exposed_s']):>17}"
                     f"{s['samples_per_s']:>12,.1f}{s['speedup_vs_ddp_synced']:>14.2f}x  {span}")
    return lines


def _sweep_rows(payload: dict) -> list[str]:
    sweep = payload["sweep"]
    lines = ["Step time (ms) by accumulation steps K:", f"{'strategy':<28}" + "".join(f"{'K=' + str(k):>10}" for k in sweep["accum"])]
    for name, steps in sweep["strategies"].items():
        lines.append(f"{name:<28}" + "".join(f"{_ms(s):>10}" for s in steps))
    return lines


def render_model(payload: dict) -> str:
    inputs = payload["inputs"]
    value = lambda k: inputs.get(k, {}).get("value")  # noqa: E731
    out = [f"topoprof model: {value('model')} ({value('params'):,} params), world size {value('world_size')} "
           f"({value('nodes')} node(s)), K = {value('accumulation_steps')}, micro-batch {value('micro_batch_size')} sample(s)",
           f"links: {describe_links(payload['links'])}",
           f"per micro-batch: compute {_ms(payload['per_micro_batch']['micro_batch_s'])} ms "
           f"(backward {_ms(payload['per_micro_batch']['backward_s'])} ms), optimizer "
           f"{_ms(payload['per_micro_batch']['optimizer_s'])} ms; {payload['buckets']['count']} DDP bucket(s)", ""]
    out += _strategy_rows(payload)
    h = payload["hide_threshold"]
    out += ["", f"DDP exposes {_ms(h['exposed_s'])} ms of communication per synced micro-batch; its floor is "
                f"{_ms(h['exposed_floor_s'])} ms, reached at >= {_ms(h['threshold_micro_batch_time_s'])} ms of compute "
                f"per micro-batch ({'reached' if h['hidden'] else 'not reached'} now)."]
    if "sweep" in payload:
        out += [""] + _sweep_rows(payload)
        fixed = payload["fixed_global_batch"]
        out += ["", f"Same global batch ({fixed['global_batch_samples']} samples) on fewer GPUs with more accumulation (ddp_no_sync):"]
        for o in fixed["options"]:
            if o["step_time_s"] is None:
                out.append(f"  {o['world_size']:>3} GPU(s): {o['reason']}")
            else:
                out.append(f"  {o['world_size']:>3} GPU(s), K={o['accumulation_steps']:<4} step {_ms(o['step_time_s'])} ms, "
                           f"{o['samples_per_s']:,.1f} samples/s ({o['samples_per_s_per_gpu']:,.1f} per GPU)")
    if payload["warnings"]:
        out += ["", "Warnings:"] + [f"  - {w}" for w in payload["warnings"]]
    return "\n".join(out) + "\n"
