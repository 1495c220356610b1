"""The `topoprof model` result as text tables (its JSON shape is `topoprof.model.strategies.payload`)."""
from __future__ import annotations

from topoprof.model.compute.timing import FSDP_OVERHEAD_KEYS, OPTIMIZER_UNKNOWN_SOURCE
from topoprof.report.costs import cost_share, part_rows, share_span
from topoprof.report.text_fits import fits_lines, memory_parts_lines
from topoprof.report.text_fsdp import fsdp_cost_rows, hsdp_line


def describe_links(links: dict) -> str:
    """One line: the intra-node source (or why there is none), then the network if any."""
    text = _intra_text(links)
    if links.get("network_bandwidth_gbps") is not None:
        text += (f"; network {links['network_bandwidth_gbps']:g} GB/s per node per direction "
                 f"(its NICs together), {links['network_latency_us']:g} us per hop")
    return text


def _intra_text(links: dict) -> str:
    if "no_link" in links:  # with several nodes the network line follows
        return links["no_link"] if "network_bandwidth_gbps" in links else f"none needed ({links['no_link']})"
    if "assumed_node" in links:
        return links["assumed_node"]
    if "bench" in links:
        return f"all-reduce fit measured by bench ({links['bench']})"
    if "link_bandwidth_gbps" in links:
        return f"{links['link_bandwidth_gbps']:g} GB/s per direction (given)"
    lo, hi = links.get("bus_bandwidth_gbps") or links["bottleneck_gbps"]
    ring = "-".join(str(g) for g in links["ring"])
    kind = "NVLink" if links["hop"] == "NV" else "PCIe / host"
    span = f"{lo:.1f} GB/s" if lo == hi else f"{lo:.1f}-{hi:.1f} GB/s (uncertain: predictions are given as ranges)"
    rings = links.get("rings") or [links["ring"]]
    if links.get("rings_kind") == "nvlink_mesh":  # several rings at once
        text = (f"nominal {len(rings)} rings over NVLink of {links['topology']} together {span} per direction "
                f"(one NVLink per GPU pair each, e.g. {'-'.join(map(str, rings[0]))})")
    else:
        switch = " through NVSwitch" if links.get("rings_kind") == "nvswitch" else ""
        text = f"nominal ring {ring} of {links['topology']}, slowest edge {kind}{switch} {span} per direction"
    return text + (f"; {links['nvlink_rate']}" if links.get("nvlink_rate") else "")


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def _speedup(value) -> str:
    return f"{'-':>14} " if value is None else f"{value:>14.2f}x"


def _strategy_rows(payload: dict) -> list[str]:
    lines = [f"{'strategy':<28}{'step ms':>12}{'exposed comm ms':>17}{'samples/s':>12}{'vs ddp_synced':>15}"
             f"{'memory GB':>11}  range (step ms)"]
    strategies = payload["strategies"]
    reasons = [s.get("reason") for s in strategies.values() if s.get("step_time_s") is None]
    if len(reasons) > 1 and len(set(reasons)) == 1 and len(reasons) == len(strategies) - 1:
        # e.g. one GPU: every strategy but `single` for one reason; say it once, not per row
        names = [name for name, s in strategies.items() if s.get("step_time_s") is None]
        lines += [_strategy_row(name, s) for name, s in strategies.items() if s.get("step_time_s") is not None]
        return lines + [f"{', '.join(names)}: n/a ({reasons[0]})"]
    ddp = {n: s for n, s in strategies.items() if not n.startswith(("fsdp_", "hsdp"))}
    fsdp = {n: s for n, s in strategies.items() if n not in ddp}
    lines += _section(ddp) + [f"  ({line})" for line in dp_note(payload)]
    if fsdp:
        lines += [_fsdp_heading(payload)] + _section(fsdp)
    return lines


def dp_note(payload: dict) -> list[str]:
    """DataParallel's row leaves out what makes it slow unless a figure for it was given."""
    dp = payload["strategies"].get("dp") or {}
    given = ((payload["inputs"].get("dp_thread_overhead_s") or {}).get("value") or 0) > 0
    if dp.get("step_time_s") is None or given:
        return []
    return ["dp: its replicas' Python in one process's threads (the GIL) and its replicate() every step are "
            "not priced, so its row is a lower bound; PyTorch's DDP tutorial: DataParallel 'is usually slower than "
            "DistributedDataParallel even on a single machine'"]


def _section(strategies: dict) -> list[str]:
    """Rows; the ones that do not apply for one same reason as one line."""
    reasons = [s.get("reason") for s in strategies.values() if s.get("step_time_s") is None]
    if len(reasons) > 1 and len(set(reasons)) == 1:
        names = [name for name, s in strategies.items() if s.get("step_time_s") is None]
        return ([_strategy_row(name, s) for name, s in strategies.items() if s.get("step_time_s") is not None]
                + [f"{', '.join(names)}: n/a ({reasons[0]})"])
    return [_strategy_row(name, s) for name, s in strategies.items()]


def _fsdp_heading(payload: dict) -> str:
    """FSDP2's rows under a line saying how the model is wrapped and what its collectives move."""
    inputs = payload["inputs"]
    groups = (inputs.get("fsdp_groups") or {}).get("value") or {}
    param = (inputs.get("fsdp_param_bytes") or {}).get("value")
    reduce = (inputs.get("fsdp_reduce_bytes") or {}).get("value")
    dtypes = f"; all-gather {param} B per parameter, reduce-scatter {reduce} B per gradient" if param else ""
    heading = f"FSDP2 (fully_shard: {groups.get('grouping', 'groups unknown')}{dtypes}):"
    return "\n".join([heading, *(f"  ({line})" for line in fsdp_note(payload) + hsdp_line(payload))])


def fsdp_note(payload: dict) -> list[str]:
    """FSDP's rows price its own work on a GPU the datasheet knows, or as validate measured it;
    without either, its hooks (and, with no memory bandwidth, its copies) are left out."""
    inputs = payload["inputs"]
    if any(key in inputs for key in (*FSDP_OVERHEAD_KEYS, "fsdp_host_step_s")):
        return []
    return ["FSDP's own work per group - its hooks, and its buffer copies where no memory bandwidth is known - is not "
            "priced: no GPU named and nothing measured it (give --gpu NAME, or --calibration FILE from "
            "`validate --modes`)"]


def _memory_text(s: dict) -> str:
    mem = s.get("memory")
    if not mem:
        return f"{'-':>11}"
    unknown = "+?" if mem["parts_gb"].get("activations") is None else ""  # activations unknown
    return f"{mem['total_gb']:>9,.1f}{unknown:<2}"


def _strategy_row(name: str, s: dict) -> str:
    if s.get("step_time_s") is None:
        return f"{name:<28}{'n/a':>12}   {s.get('reason', '')}"
    mem = s.get("memory") or {}
    if mem.get("fits") is False:  # kept, but no step time to rank against the others
        need = mem["total_gb"]
        return f"{name:<28}{'-':>12}   does not fit: needs {need:,.1f} GB of {mem['gpu_memory_gb']:,.1f} GB"
    rng = s.get("range")
    lo, hi = rng["step_time_s"] if rng else (None, None)
    span = "" if not rng or _ms(lo) == _ms(hi) else f"{_ms(lo)} - {_ms(hi)}"  # none left on this row
    return (f"{name:<28}{_ms(s['step_time_s']):>12}{_ms(s['comm_exposed_s']):>17}"
            f"{s['samples_per_s']:>12,.1f}{_speedup(s.get('speedup_vs_ddp_synced'))}{_memory_text(s)}  {span}").rstrip()


def _sweep_rows(payload: dict) -> list[str]:
    sweep = payload["sweep"]
    rows = [f"{name:<28}" + "".join(f"{_ms(s):>10}" for s in steps) for name, steps in sweep["strategies"].items()
            if any(step is not None for step in steps)]  # none: it does not apply here (e.g. DDP on one GPU)
    if not rows:  # nothing fits, or nothing applies: an empty table would read as a missing result
        return ["Step time by accumulation steps K: none (no strategy above fits in memory and applies here)"]
    return ["Step time (ms) by accumulation steps K:",
            f"{'strategy':<28}" + "".join(f"{'K=' + str(k):>10}" for k in sweep["accum"]), *rows]


def _header(payload: dict) -> list[str]:
    inputs = payload["inputs"]

    def value(k: str):
        return inputs.get(k, {}).get("value")

    per = payload["per_micro_batch"]
    assumed = inputs.get("optimizer_time_s", {}).get("source") == OPTIMIZER_UNKNOWN_SOURCE
    optimizer = f"optimizer {_ms(per['optimizer_s'])} ms" + (" (unknown: assumed 0)" if assumed else "")
    buckets = f"; {payload['buckets']['count']} DDP bucket(s)" if value("world_size") != 1 else ""
    # the user's own model: which parameters and which gradient-ready order the buckets follow
    model = [f"model: {inputs['model']['source']}"] if str(value("model")).startswith("user:") else []
    return [f"topoprof model: {value('model')} ({value('params'):,} params), world size {value('world_size')} "
            f"({value('nodes')} node(s)), K = {value('accumulation_steps')}, micro-batch {value('micro_batch_size')} "
            f"sample(s)",
            *model, f"links: {describe_links(payload['links'])}",
            f"per micro-batch: {_compute_text(inputs, per)}, {optimizer}{buckets}", *_compute_model_lines(inputs), ""]


def _compute_model_lines(inputs: dict) -> list[str]:
    """What the modelled compute rests on: its op count, the bound, each constant's basis."""
    detail = (inputs.get("compute_model") or {}).get("value")
    if not detail:
        return []
    return [f"compute model: {detail['summary']}",
            *(f"  {line}" for line in detail["basis"]), *(f"  note: {n}" for n in detail.get("notes", []))]


def _compute_text(inputs: dict, per: dict) -> str:
    """Measured or given compute is one number (with the modelled range beside it where there is
    one); a what-if (from the model's ops, or the datasheet's) is its range, with its basis."""
    what_if = inputs.get("micro_batch_time_range_s")
    if what_if is None:
        text = f"compute {_ms(per['micro_batch_s'])} ms (backward {_ms(per['backward_s'])} ms)"
        beside = inputs.get("micro_batch_time_modelled_s")
        if beside is not None:
            fast, middle, slow = beside["value"]
            gap = per["micro_batch_s"] / middle - 1
            text += (f"; modelled from its ops {_ms(fast)}-{_ms(slow)} ms (middle {_ms(middle)} ms): measured is "
                     f"{100 * gap:+.0f} % of the middle, "
                     f"{'inside' if fast <= per['micro_batch_s'] <= slow else 'outside'} "
                     "the range")
        return text
    fast, slow = what_if["value"]
    return (f"compute {_ms(fast)}-{_ms(slow)} ms (a {what_if['source']}; the tables use the middle, "
            f"{_ms(per['micro_batch_s'])} ms, and their range column spans the rest)")


def _hide_line(h: dict) -> list[str]:
    if h.get("reason") is not None:  # DDP does not apply (one GPU)
        return []
    return ["", f"DDP exposes {_ms(h['exposed_s'])} ms per synced micro-batch after backward (all-reduce tail, "
                f"copies and its kernels); no amount of compute takes that below {_ms(h['exposed_floor_s'])} ms, "
                f"reached at >= {_ms(h['threshold_micro_batch_time_s'])} ms of compute per micro-batch "
                f"({'reached' if h['hidden'] else 'not reached'} now)."]


# Below this share of a step, even at the top of its range, DDP's cost is not worth attacking.
NOTHING_TO_GAIN_PCT = 5.0


def ddp_cost_share(payload: dict) -> tuple[float, float, float] | None:
    """(nominal, low, high) % of a ddp_synced step that DDP's parts take; None on one GPU."""
    return cost_share(payload, "ddp_costs", "ddp_synced")


def _memory_rows(payload: dict) -> list[str]:
    """What the memory column rests on, and each part of one strategy that does not fit."""
    inputs = payload["inputs"]
    capacity, act = inputs.get("gpu_memory_gb") or {}, inputs.get("activation_memory_gb") or {}
    if not capacity and not act:
        return []
    activations = "?" if act.get("value") is None else f"{act['value']:.1f}"
    gpu = "?" if capacity.get("value") is None else f"{capacity['value']:,.1f}"
    out = ["", f"Memory per GPU (counted: weights, gradients, optimizer state, DDP's buckets, FSDP's unsharded "
               f"groups, activations): GPU {gpu} GB ({capacity.get('source')}); "
               f"activations {activations} GB ({act.get('source')})."]
    reasons = {s["memory"]["reason"] for s in payload["strategies"].values()
               if (s.get("memory") or {}).get("fits") is False}
    out += [f"  {r}" for r in sorted(reasons)]
    return out


# Each strategy syncing every micro-batch, and its twin that syncs only the last one.
NO_SYNC_PAIRS = (("ddp_synced", "ddp_no_sync"), ("fsdp_full_shard", "fsdp_full_shard_no_sync"),
                 ("fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync"), ("hsdp", "hsdp_no_sync"))


def no_sync_trades(payload: dict) -> list[dict]:
    """What skipping the sync until the last micro-batch saves in time and costs in memory, per
    pair whose both strategies have a step and a memory count."""
    strategies, out = payload["strategies"], []
    for synced, twin in NO_SYNC_PAIRS:
        a, b = strategies.get(synced) or {}, strategies.get(twin) or {}
        if not (a.get("step_time_s") and b.get("step_time_s") and a.get("memory") and b.get("memory")):
            continue
        out.append({"synced": synced, "no_sync": twin, "saves_s": a["step_time_s"] - b["step_time_s"],
                    "extra_gb": b["memory"]["total_gb"] - a["memory"]["total_gb"], "fits": b["memory"]["fits"]})
    return out


def _no_sync_rows(payload: dict) -> list[str]:
    trades = no_sync_trades(payload)
    k = payload["inputs"]["accumulation_steps"]["value"]
    if not trades or k < 2:
        return []
    out = ["", f"Syncing only the last of K={k} micro-batches, per pair:"]
    for t in trades:
        fits = {True: "", False: "; does not fit", None: ""}[t["fits"]]
        out.append(f"  {t['no_sync']:<28} saves {_ms(t['saves_s'])} ms per step over {t['synced']}, "
                   f"holds {t['extra_gb']:+,.1f} GB per GPU{fits}")
    return out


def _ddp_cost_rows(payload: dict) -> list[str]:
    """Where DDP's cost goes, per synced micro-batch, and which option acts on which part."""
    share = ddp_cost_share(payload)
    if share is None:
        return []
    out = ["", "Where DDP's cost goes, per synced micro-batch (a range where nothing measured the part):",
           f"  {'part':<16}{'ms':>8}  {'range ms':<14}scales with"]
    for name, ms, rng, c in part_rows(payload["ddp_costs"], _ms, lambda pair: f"{_ms(pair[0])}-{_ms(pair[1])}"):
        out.append(f"  {name:<16}{ms:>8}  {rng:<14}{c['scales_with']}")
    nominal, low, high = share
    span = share_span(low, high)
    out.append(f"  DDP takes {nominal:.1f} % of a ddp_synced step{span}.")
    if high < NOTHING_TO_GAIN_PCT:
        out.append(f"  Even at the top of its range that is under {NOTHING_TO_GAIN_PCT:.0f} %: "
                   "nothing worth attacking.")
    knobs = payload.get("ddp_knobs") or []
    if knobs:
        out.append("DDP options the model predicts a gain for (ddp_synced, nominal):")
        out += [f"  {o['knob']:<40} -{_ms(o['gain_s'])} ms ({o['gain_pct']:.1f} %), on {o['part']}" for o in knobs]
    return out


def _fixed_rows(fixed: dict) -> list[str]:
    """Fewer GPUs with more accumulation; nothing to compare when there is one shape."""
    if len(fixed["options"]) < 2:
        return []
    out = ["", f"Same global batch ({fixed['global_batch_samples']} samples) on fewer GPUs with more accumulation "
               f"(ddp_no_sync):"]
    for o in fixed["options"]:
        if o["step_time_s"] is None:
            out.append(f"  {o['world_size']:>3} GPU(s): {o['reason']}")
            continue
        other = f" [{o['strategy']}]" if o.get("strategy") not in (None, "ddp_no_sync") else ""
        out.append(f"  {o['world_size']:>3} GPU(s), K={o['accumulation_steps']:<4} step {_ms(o['step_time_s'])} ms, "
                   f"{o['samples_per_s']:,.1f} samples/s ({o['samples_per_s_per_gpu']:,.1f} per GPU){other}")
    return out


def render_model(payload: dict) -> str:
    ddp_fits = ((payload["strategies"].get("ddp_synced") or {}).get("memory") or {}).get("fits") is not False
    ddp = (_hide_line(payload["hide_threshold"]) + _ddp_cost_rows(payload) if ddp_fits
           else ["", "DDP does not fit on these GPUs: where its cost goes is left out."])
    lead = fits_lines(payload.get("fits"))
    out = (lead + _header(payload) + _strategy_rows(payload) + (memory_parts_lines(payload) or _memory_rows(payload))
           + _no_sync_rows(payload) + ddp + fsdp_cost_rows(payload))
    if "sweep" in payload:
        out += [""] + _sweep_rows(payload) + _fixed_rows(payload["fixed_global_batch"])
    if payload["warnings"]:
        out += ["", "Warnings:"] + [f"  - {w}" for w in payload["warnings"]]
    return "\n".join(out) + "\n"
