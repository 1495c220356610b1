"""The `topoprof model` result as text tables (its JSON is written and read in
`topoprof.model.strategies.model_report`)."""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.model.compute.timing import FSDP_OVERHEAD_KEYS, OPTIMIZER_UNKNOWN_SOURCE
from topoprof.model.strategies.model_report import FixedGlobalBatch, Links, ModelReport, Sweep
from topoprof.model.strategies.results import HideThreshold, StrategyResult, Unavailable
from topoprof.model.strategies.steps import lower_bounds
from topoprof.report.costs import cost_share, part_rows, share_span
from topoprof.report.text_fits import fits_lines, memory_parts_lines
from topoprof.report.text_fsdp import fsdp_cost_rows, hsdp_line


def describe_links(links: Links) -> str:
    """One line: the intra-node source (or why there is none), then the network if any."""
    text = _intra_text(links)
    if links.network_bandwidth_gbps is not None:
        text += (f"; network {links.network_bandwidth_gbps:g} GB/s per node per direction "
                 f"(its NICs together), {links.network_latency_us:g} us per hop")
    return text


def _intra_text(links: Links) -> str:
    if links.no_link is not None:  # with several nodes the network line follows
        return links.no_link if links.network_bandwidth_gbps is not None else f"none needed ({links.no_link})"
    if links.assumed_node is not None:
        return links.assumed_node
    if links.bench is not None:
        return f"all-reduce fit measured by bench ({links.bench})"
    if links.link_bandwidth_gbps is not None:
        return f"{links.link_bandwidth_gbps:g} GB/s per direction (given)"
    pair = links.bus_bandwidth_gbps or links.bottleneck_gbps
    assert pair is not None and links.ring is not None  # a topology's links name their ring and its rate
    lo, hi = pair
    ring = "-".join(str(g) for g in links.ring)
    kind = "NVLink" if links.hop == "NV" else "PCIe / host"
    span = f"{lo:.1f} GB/s" if lo == hi else f"{lo:.1f}-{hi:.1f} GB/s (uncertain: predictions are given as ranges)"
    rings = links.rings or (links.ring,)
    if links.rings_kind == "nvlink_mesh":  # several rings at once
        text = (f"nominal {len(rings)} rings over NVLink of {links.topology} together {span} per direction "
                f"(one NVLink per GPU pair each, e.g. {'-'.join(map(str, rings[0]))})")
    else:
        switch = " through NVSwitch" if links.rings_kind == "nvswitch" else ""
        text = f"nominal ring {ring} of {links.topology}, slowest edge {kind}{switch} {span} per direction"
    return text + (f"; {links.nvlink_rate}" if links.nvlink_rate else "")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def _speedup(value: float | None) -> str:
    return f"{'-':>14} " if value is None else f"{value:>14.2f}x"


Row = StrategyResult | Unavailable


def _strategy_rows(report: ModelReport) -> list[str]:
    lines = [f"{'strategy':<28}{'step ms':>12}{'exposed comm ms':>17}{'samples/s':>12}{'vs ddp_synced':>15}"
             f"{'memory GB':>11}  range (step ms)"]
    strategies = report.strategies
    reasons = [s.reason for s in strategies.values() if isinstance(s, Unavailable)]
    if len(reasons) > 1 and len(set(reasons)) == 1 and len(reasons) == len(strategies) - 1:
        # e.g. one GPU: every strategy but `single` for one reason; say it once, not per row
        names = [name for name, s in strategies.items() if isinstance(s, Unavailable)]
        lines += [_strategy_row(name, s) for name, s in strategies.items() if isinstance(s, StrategyResult)]
        return lines + [f"{', '.join(names)}: n/a ({reasons[0]})"]
    ddp = {n: s for n, s in strategies.items() if not n.startswith(("fsdp_", "hsdp"))}
    fsdp = {n: s for n, s in strategies.items() if n not in ddp}
    lines += _section(ddp) + [f"  ({line})" for line in dp_note(report)]
    if fsdp:
        lines += [_fsdp_heading(report)] + _section(fsdp)
    return lines


def dp_note(report: ModelReport) -> list[str]:
    """DataParallel's row leaves out what makes it slow unless a figure for it was given."""
    why = lower_bounds(report.value("dp_thread_overhead_s")).get("dp")
    if report.result("dp") is None or why is None:
        return []
    return [f"dp: {why}; PyTorch's DDP tutorial: DataParallel 'is usually slower than "
            "DistributedDataParallel even on a single machine'"]


def _section(strategies: dict[str, Row]) -> list[str]:
    """Rows; the ones that do not apply for one same reason as one line."""
    reasons = [s.reason for s in strategies.values() if isinstance(s, Unavailable)]
    if len(reasons) > 1 and len(set(reasons)) == 1:
        names = [name for name, s in strategies.items() if isinstance(s, Unavailable)]
        return ([_strategy_row(name, s) for name, s in strategies.items() if isinstance(s, StrategyResult)]
                + [f"{', '.join(names)}: n/a ({reasons[0]})"])
    return [_strategy_row(name, s) for name, s in strategies.items()]


def _fsdp_heading(report: ModelReport) -> str:
    """FSDP2's rows under a line saying how the model is wrapped and what its collectives move."""
    groups = report.value("fsdp_groups") or {}
    param, reduce = report.value("fsdp_param_bytes"), report.value("fsdp_reduce_bytes")
    dtypes = f"; all-gather {param} B per parameter, reduce-scatter {reduce} B per gradient" if param else ""
    heading = f"FSDP2 (fully_shard: {groups.get('grouping', 'groups unknown')}{dtypes}):"
    return "\n".join([heading, *(f"  ({line})" for line in fsdp_note(report) + hsdp_line(report))])


def fsdp_note(report: ModelReport) -> list[str]:
    """FSDP's rows price its own work on a GPU the datasheet knows, or as validate measured it;
    without either, its hooks (and, with no memory bandwidth, its copies) are left out."""
    if any(key in report.inputs for key in (*FSDP_OVERHEAD_KEYS, "fsdp_host_step_s")):
        return []
    return ["FSDP's own work per group - its hooks, and its buffer copies where no memory bandwidth is known - is not "
            "priced: no GPU named and nothing measured it (give --gpu NAME, or --calibration FILE from "
            "`validate --modes`)"]


def _memory_text(s: StrategyResult) -> str:
    mem = s.memory
    if mem is None:
        return f"{'-':>11}"
    unknown = "+?" if mem.parts_gb.get("activations") is None else ""  # activations unknown
    return f"{mem.total_gb:>9,.1f}{unknown:<2}"


def _strategy_row(name: str, s: Row) -> str:
    if isinstance(s, Unavailable):
        return f"{name:<28}{'n/a':>12}   {s.reason}"
    mem = s.memory
    if mem is not None and mem.fits is False:  # kept, but no step time to rank against the others
        return f"{name:<28}{'-':>12}   does not fit: needs {mem.total_gb:,.1f} GB of {mem.gpu_memory_gb:,.1f} GB"
    rng = s.range
    lo, hi = rng.step_time_s if rng else (None, None)
    span = "" if not rng or _ms(lo) == _ms(hi) else f"{_ms(lo)} - {_ms(hi)}"  # none left on this row
    return (f"{name:<28}{_ms(s.step_time_s):>12}{_ms(s.comm_exposed_s):>17}"
            f"{s.samples_per_s:>12,.1f}{_speedup(s.speedup_vs_ddp_synced)}{_memory_text(s)}  {span}").rstrip()


def _sweep_rows(sweep: Sweep) -> list[str]:
    rows = [f"{name:<28}" + "".join(f"{_ms(s):>10}" for s in steps) for name, steps in sweep.strategies.items()
            if any(step is not None for step in steps)]  # none: it does not apply here (e.g. DDP on one GPU)
    if not rows:  # nothing fits, or nothing applies: an empty table would read as a missing result
        return ["Step time by accumulation steps K: none (no strategy above fits in memory and applies here)"]
    return ["Step time (ms) by accumulation steps K:",
            f"{'strategy':<28}" + "".join(f"{'K=' + str(k):>10}" for k in sweep.accum), *rows]


def _header(report: ModelReport) -> list[str]:
    value, per = report.value, report.per_micro_batch
    assumed = report.source("optimizer_time_s") == OPTIMIZER_UNKNOWN_SOURCE
    optimizer = f"optimizer {_ms(per['optimizer_s'])} ms" + (" (unknown: assumed 0)" if assumed else "")
    buckets = f"; {report.buckets.count} DDP bucket(s)" if value("world_size") != 1 else ""
    # the user's own model: which parameters and which gradient-ready order the buckets follow
    model = [f"model: {report.source('model')}"] if str(value("model")).startswith("user:") else []
    return [f"topoprof model: {value('model')} ({value('params'):,} params), world size {value('world_size')} "
            f"({value('nodes')} node(s)), K = {value('accumulation_steps')}, micro-batch {value('micro_batch_size')} "
            f"sample(s)",
            *model, f"links: {describe_links(report.links)}",
            f"per micro-batch: {_compute_text(report)}, {optimizer}{buckets}", *_compute_model_lines(report), ""]


def _compute_model_lines(report: ModelReport) -> list[str]:
    """What the modelled compute rests on: its op count, the bound, each constant's basis."""
    detail = report.value("compute_model")
    if not detail:
        return []
    return [f"compute model: {detail['summary']}",
            *(f"  {line}" for line in detail["basis"]), *(f"  note: {n}" for n in detail.get("notes", []))]


def _compute_text(report: ModelReport) -> str:
    """Measured or given compute is one number (with the modelled range beside it where there is
    one); a what-if (from the model's ops, or the datasheet's) is its range, with its basis."""
    per = report.per_micro_batch
    what_if = report.value("micro_batch_time_range_s")
    if what_if is None:
        text = f"compute {_ms(per['micro_batch_s'])} ms (backward {_ms(per['backward_s'])} ms)"
        beside = report.value("micro_batch_time_modelled_s")
        if beside is not None:
            fast, middle, slow = beside
            gap = per["micro_batch_s"] / middle - 1
            text += (f"; modelled from its ops {_ms(fast)}-{_ms(slow)} ms (middle {_ms(middle)} ms): measured is "
                     f"{100 * gap:+.0f} % of the middle, "
                     f"{'inside' if fast <= per['micro_batch_s'] <= slow else 'outside'} "
                     "the range")
        return text
    fast, slow = what_if
    return (f"compute {_ms(fast)}-{_ms(slow)} ms (a {report.source('micro_batch_time_range_s')}; the tables use the "
            f"middle, {_ms(per['micro_batch_s'])} ms, and their range column spans the rest)")


def _hide_line(h: HideThreshold | Unavailable) -> list[str]:
    if isinstance(h, Unavailable):  # DDP does not apply (one GPU)
        return []
    return ["", f"DDP exposes {_ms(h.exposed_s)} ms per synced micro-batch after backward (all-reduce tail, "
                f"copies and its kernels); no amount of compute takes that below {_ms(h.exposed_floor_s)} ms, "
                f"reached at >= {_ms(h.threshold_micro_batch_time_s)} ms of compute per micro-batch "
                f"({'reached' if h.hidden else 'not reached'} now)."]


# Below this share of a step, even at the top of its range, DDP's cost is not worth attacking.
NOTHING_TO_GAIN_PCT = 5.0


def ddp_cost_share(report: ModelReport) -> tuple[float, float, float] | None:
    """(nominal, low, high) % of a ddp_synced step that DDP's parts take; None on one GPU."""
    return cost_share(report, report.ddp_costs, "ddp_synced")


def _memory_rows(report: ModelReport) -> list[str]:
    """What the memory column rests on, and each part of one strategy that does not fit."""
    capacity, act = report.inputs.get("gpu_memory_gb"), report.inputs.get("activation_memory_gb")
    if capacity is None and act is None:
        return []
    activations = "?" if act is None or act.value is None else f"{act.value:.1f}"
    gpu = "?" if capacity is None or capacity.value is None else f"{capacity.value:,.1f}"
    out = ["", f"Memory per GPU (counted: weights, gradients, optimizer state, DDP's buckets, FSDP's unsharded "
               f"groups, activations): GPU {gpu} GB ({report.source('gpu_memory_gb')}); "
               f"activations {activations} GB ({report.source('activation_memory_gb')})."]
    out += [f"  {r}" for r in not_fitting_reasons(report)]
    return out


def not_fitting_reasons(report: ModelReport) -> list[str]:
    """Why each strategy that does not fit does not, each reason once."""
    return sorted({s.memory.reason for s in report.strategies.values() if isinstance(s, StrategyResult)
                   and s.memory is not None and s.memory.fits is False and s.memory.reason is not None})


# Each strategy syncing every micro-batch, and its twin that syncs only the last one.
NO_SYNC_PAIRS = (("ddp_synced", "ddp_no_sync"), ("fsdp_full_shard", "fsdp_full_shard_no_sync"),
                 ("fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync"), ("hsdp", "hsdp_no_sync"))


@dataclass(frozen=True)
class NoSyncTrade:
    synced: str
    no_sync: str
    saves_s: float
    extra_gb: float
    fits: bool | None


def no_sync_trades(report: ModelReport) -> list[NoSyncTrade]:
    """What skipping the sync until the last micro-batch saves in time and costs in memory, per
    pair whose both strategies have a step and a memory count."""
    out = []
    for synced, twin in NO_SYNC_PAIRS:
        a, b = report.result(synced), report.result(twin)
        if a is None or b is None or not (a.step_time_s and b.step_time_s) or a.memory is None or b.memory is None:
            continue
        out.append(NoSyncTrade(synced, twin, a.step_time_s - b.step_time_s, b.memory.total_gb - a.memory.total_gb,
                               b.memory.fits))
    return out


def _no_sync_rows(report: ModelReport) -> list[str]:
    trades = no_sync_trades(report)
    k = report.value("accumulation_steps")
    if not trades or k < 2:
        return []
    out = ["", f"Syncing only the last of K={k} micro-batches, per pair:"]
    for t in trades:
        fits = {True: "", False: "; does not fit", None: ""}[t.fits]
        out.append(f"  {t.no_sync:<28} saves {_ms(t.saves_s)} ms per step over {t.synced}, "
                   f"holds {t.extra_gb:+,.1f} GB per GPU{fits}")
    return out


def _ddp_cost_rows(report: ModelReport) -> list[str]:
    """Where DDP's cost goes, per synced micro-batch, and which option acts on which part."""
    share = ddp_cost_share(report)
    if share is None:
        return []
    out = ["", "Where DDP's cost goes, per synced micro-batch (a range where nothing measured the part):",
           f"  {'part':<16}{'ms':>8}  {'range ms':<14}scales with"]
    for name, ms, rng, c in part_rows(report.ddp_costs, _ms, lambda pair: f"{_ms(pair[0])}-{_ms(pair[1])}"):
        out.append(f"  {name:<16}{ms:>8}  {rng:<14}{c.scales_with}")
    nominal, low, high = share
    span = share_span(low, high)
    out.append(f"  DDP takes {nominal:.1f} % of a ddp_synced step{span}.")
    if high < NOTHING_TO_GAIN_PCT:
        out.append(f"  Even at the top of its range that is under {NOTHING_TO_GAIN_PCT:.0f} %: "
                   "nothing worth attacking.")
    if report.ddp_knobs:
        out.append("DDP options the model predicts a gain for (ddp_synced, nominal):")
        out += [f"  {o.knob:<40} -{_ms(o.gain_s)} ms ({o.gain_pct:.1f} %), on {o.part}" for o in report.ddp_knobs]
    return out


def _fixed_rows(fixed: FixedGlobalBatch) -> list[str]:
    """Fewer GPUs with more accumulation; nothing to compare when there is one shape."""
    if len(fixed.options) < 2:
        return []
    out = ["", f"Same global batch ({fixed.global_batch_samples} samples) on fewer GPUs with more accumulation "
               f"(ddp_no_sync):"]
    for o in fixed.options:
        if o.step_time_s is None:
            out.append(f"  {o.world_size:>3} GPU(s): {o.reason}")
            continue
        other = f" [{o.strategy}]" if o.strategy not in (None, "ddp_no_sync") else ""
        out.append(f"  {o.world_size:>3} GPU(s), K={o.accumulation_steps:<4} step {_ms(o.step_time_s)} ms, "
                   f"{o.samples_per_s:,.1f} samples/s ({o.samples_per_s_per_gpu:,.1f} per GPU){other}")
    return out


def render_model(report: ModelReport) -> str:
    ddp = report.result("ddp_synced")
    ddp_fits = ddp is None or ddp.memory is None or ddp.memory.fits is not False
    lines = (_hide_line(report.hide_threshold) + _ddp_cost_rows(report) if ddp_fits
             else ["", "DDP does not fit on these GPUs: where its cost goes is left out."])
    out = (fits_lines(report.fits) + _header(report) + _strategy_rows(report)
           + (memory_parts_lines(report) or _memory_rows(report)) + _no_sync_rows(report) + lines
           + fsdp_cost_rows(report))
    if report.sweep is not None:
        out += [""] + _sweep_rows(report.sweep)
        if report.fixed_global_batch is not None:
            out += _fixed_rows(report.fixed_global_batch)
    if report.warnings:
        out += ["", "Warnings:"] + [f"  - {w}" for w in report.warnings]
    return "\n".join(out) + "\n"
