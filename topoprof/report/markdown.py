"""report.md: what to do first, then the evidence, written for GitHub's Markdown."""
from __future__ import annotations

from topoprof.measure.cluster import ClusterReport
from topoprof.measure.fit import FitLine
from topoprof.model.strategies.model_report import ModelReport, Skipped, made
from topoprof.model.strategies.results import PartCost, StrategyResult, Unavailable
from topoprof.model.validate.report import Calibration, ModeCheck
from topoprof.probing import ProbeStatus
from topoprof.report.costs import part_rows, share_span
from topoprof.report.recommend import Recommendation
from topoprof.report.scan_report import ScanParts
from topoprof.report.text_fits import fits_lines
from topoprof.report.text_fsdp import COST_STRATEGY, fsdp_cost_share, hsdp_line
from topoprof.report.text_model import NOTHING_TO_GAIN_PCT, ddp_cost_share, dp_note, fsdp_note, not_fitting_reasons
from topoprof.report.text_validate import INPUTS
from topoprof.report.units import listed
from topoprof.report.verdict import CopyVerdict, copy_verdicts
from topoprof.specs.collective_spec import BenchRow
from topoprof.topology.visible import describe, gpu_marks, job_devices


def _ms(s) -> str:
    return "–" if s is None else f"{s * 1e3:,.1f}"


def _table(headers: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _chart(parts: ScanParts, name: str, alt: str) -> list[str]:
    path = parts.charts.get(name)
    return [f"![{alt}]({path})", ""] if path else []


def _todo(recs: list[Recommendation], predictions: list[ModelReport]) -> list[str]:
    out = ["## What to do", ""]
    if not recs:
        out += ["Nothing stands out: no change is predicted to save 5 % or more of a step here."]
        for p in predictions:
            synced, no_sync = p.result("ddp_synced"), p.result("ddp_no_sync")
            if synced and no_sync and synced.step_time_s and no_sync.step_time_s:
                step = synced.step_time_s
                out.append(f"- {p.label}, K = {p.value('accumulation_steps')}: `no_sync()` "
                           f"{100 * (step - no_sync.step_time_s) / step:.1f} % faster than syncing every micro-batch; "
                           f"exposed communication {100 * synced.comm_exposed_s / step:.1f} % of a synced step.")
        return out + [""]
    for i, r in enumerate(recs[:3], 1):
        gain = f" (predicted {r.gain_pct:.0f}% faster steps)" if r.gain_pct else ""
        out += [f"**{i}. {r.title}**{gain}", "", r.why, ""]
        if r.snippet:
            out += ["```python" if "import" in r.snippet or "model" in r.snippet else "```bash", r.snippet, "```", ""]
    return out


def _sources(probes: list[ProbeStatus]) -> list[str]:
    """Every source the scan asked, and what became of it: a failed one is said here, once."""
    if not probes:
        return []
    rows = [[p.name, p.status, p.detail.replace("|", "\\|")] for p in probes]
    return ["## Sources", ""] + _table(["source", "status", "detail"], rows) + [""]


def _topology(parts: ScanParts) -> list[str]:
    topo, probes = parts.topology, parts.probes
    out = ["## Topology", ""]
    if topo is None:
        return out + ["No NVIDIA GPU on this machine.", ""]
    if not probes:  # reports written before sources had statuses
        out += [f"Sources: {', '.join(topo.sources) or 'none'}.", ""]
    if topo.gpus:
        marks = gpu_marks(topo)
        rows = [[f"GPU{g.index}" + ("\\*" if g.index in (marks or {}) else ""),
                 *([marks.get(g.index, "–")] if marks is not None else []), g.name or "–", g.pci_bus_id or "–",
                 f"Gen{g.pcie_gen_current}x{g.pcie_width_current} / Gen{g.pcie_gen_max}x{g.pcie_width_max}"
                 if g.pcie_gen_max else "–", g.numa_node, g.nvlinks_active] for g in topo.gpus]
        out += _table(["GPU", *(["this job"] if marks is not None else []), "name", "bus id", "PCIe now / max",
                       "NUMA", "NVLinks"], rows) + [""]
        if marks is not None:
            out += [f"\\* = visible to this job (`CUDA_VISIBLE_DEVICES={topo.visible_devices}`): "
                    f"{describe(job_devices(topo))}.", ""]
        out += _chart(parts, "links", "GPU x GPU links")
    else:
        out += ["No NVIDIA GPU on this machine.", ""]
    host = topo.host
    if host is not None:
        cpu = host.cpu
        out += [f"Host `{host.hostname}`: {cpu.model or 'CPU model unknown'}, {cpu.sockets} "
                f"socket(s), {cpu.cpus_logical} logical CPUs, {len(host.numa_nodes)} NUMA node(s), "
                f"{(host.memory_total_bytes or 0) / 2**30:.0f} GiB.", ""]
    for nic in topo.nics:
        out.append(f"- NIC {nic.device}: {nic.rate_gbit or '?'} Gb/s, {nic.link_layer or '?'}, {nic.state or '?'}")
    return out + ([""] if topo.nics else []) + [f"> {n}" for n in topo.notes] + ([""] if topo.notes else [])


def _one_rank(parts: ScanParts) -> bool:
    return parts.mode.nproc == 1


def _bandwidth(parts: ScanParts) -> list[str]:
    bench, v = parts.bench, parts.verdict
    out = ["## Measured bandwidth", ""]
    if _one_rank(parts):
        return out + ["One GPU: no GPU-to-GPU link to measure.", ""] + _copies(parts)
    if v is not None:
        status = {"ok": "OK", "low": "LOW", "in range": "in the expected range", "unknown": "no reference figure"}
        out += [f"**{v.level}: {status.get(v.status, v.status)}.** {v.summary}.", ""]
        out += [f"- likely cause: {c}" for c in v.causes] + ([""] if v.causes else [])
    by_coll: dict[str, list[BenchRow]] = {}
    for row in bench.rows:
        if row.level == "job":  # the levels of a multi-node job are in "Cluster"
            by_coll.setdefault(row.collective, []).append(row)
    fits = bench.fit
    rows = []
    for coll, rs in by_coll.items():
        peak = max((r for r in rs if not r.wrong and r.busbw_gbps is not None),
                   key=lambda r: r.busbw_gbps or 0.0, default=None)
        rows.append([coll, len(rs), sum(1 for r in rs if r.wrong),
                     f"{peak.busbw_gbps:.3f} @ {peak.size_bytes:,} B" if peak else "–", _fit_text(fits.get(coll))])
    if rows:
        out += _table(["collective", "sizes", "#wrong", "peak busbw GB/s", "fit t(S)"], rows) + [""]
    out += _chart(parts, "busbw", "bus bandwidth vs message size")
    nccl = bench.nccl.explained if bench.nccl is not None else []
    out += [f"- NCCL: {line}" for line in nccl] + ([""] if nccl else [])
    if bench.error:
        out += [f"> The run failed: {bench.error}. The rows above were measured before the failure.", ""]
    return out + _copies(parts)


def _fit_text(fit: FitLine | None) -> str:
    if fit is None:
        return "–"
    if not fit.bandwidth_gbps:  # the times did not grow with the size (the JSON's null for an infinite one)
        return f"{fit.latency_us:.1f} µs (latency only)"
    return f"{fit.latency_us:.1f} µs + S / {fit.bandwidth_gbps:.3f} GB/s"


def _speedup(value) -> str:
    return "–" if value is None else f"{value:.2f}x"  # None: ddp_synced does not apply


def _predictions(parts: ScanParts) -> list[str]:
    predictions = parts.predictions
    out = ["## Predictions", ""]
    if not predictions and _one_rank(parts):
        return out + ["One GPU: nothing to all-reduce, so no DDP prediction for this node; "
                      "\"What if\" below shows more such GPUs and nodes.", ""]
    if not predictions:
        return out + ["No prediction: it needs an all-reduce fit from at least 2 ranks.", ""]
    if isinstance(predictions[0], Skipped):
        return out + [f"No prediction: {predictions[0].skipped}.", ""]
    for p in made(predictions):
        out += _prediction(p)
    out += _chart(parts, "step_vs_accum", "predicted step time vs accumulation steps")
    out += _chart(parts, "memory", "memory per GPU by strategy against the GPU's memory")
    return out


def _prediction(p: ModelReport) -> list[str]:
    out = [f"### {p.label}: {p.value('world_size')} rank(s), K = {p.value('accumulation_steps')}", ""]
    out += _fits_block(p) + [f"Compute: {p.compute_source}.", ""]
    what_if = p.value("micro_batch_time_range_s")
    if what_if:
        fast, slow = what_if
        out += [f"Compute per micro-batch {_ms(fast)} – {_ms(slow)} ms ({p.source('micro_batch_time_range_s')}). "
                "Every step time is a range; the step column uses the middle.", ""]
    beside = p.value("micro_batch_time_modelled_s")
    if beside:  # a GPU scan checks the what-if against what it measured
        out += [_measured_vs_modelled(p.value("micro_batch_time_s"), beside), ""]
    model = p.value("compute_model")
    if model:
        out += [f"Compute model: {model['summary']}.", ""]
    results = [s for s in p.strategies.values() if isinstance(s, StrategyResult)]
    ranged = any(s.range for s in results)
    # memory only where there is a GPU's memory to hold it against
    sized = any(s.memory is not None and s.memory.gpu_memory_gb for s in results)
    rows = [_strategy_row(name, s, ranged, sized) for name, s in p.strategies.items()]
    out += _table(["strategy", "step ms", "exposed comm ms", "samples/s", "vs ddp_synced"]
                  + (["memory GB", "fits"] if sized else []) + (["step range ms"] if ranged else []), rows) + [""]
    fsdp_rows = any(name.startswith("fsdp_") and isinstance(s, StrategyResult) and s.step_time_s
                    for name, s in p.strategies.items())
    notes = [f"Note: {line}." for line in dp_note(p) + (fsdp_note(p) if fsdp_rows else [])]
    out += [line for note in notes for line in (note, "")]
    return out + (_memory_basis(p) if sized else []) + _ddp_costs(p) + _fsdp_costs(p)


def _strategy_row(name: str, s: StrategyResult | Unavailable, ranged: bool, sized: bool) -> list:
    if isinstance(s, Unavailable):
        return [f"`{name}`", "–", "–", "–", s.reason] + (["–"] if ranged else [])
    mem = s.memory
    if mem is not None and mem.fits is False:  # kept, never ranked
        return ([f"`{name}`", "–", "–", "–", "–", f"{mem.total_gb:,.1f}",
                 f"does not fit: needs {mem.total_gb:,.1f} GB of {mem.gpu_memory_gb:,.1f} GB"]
                + (["–"] if ranged else []))
    return ([f"`{name}`", _ms(s.step_time_s), _ms(s.comm_exposed_s), f"{s.samples_per_s:,.2f}",
             _speedup(s.speedup_vs_ddp_synced)]
            + ([_memory_gb(s), _fits(s)] if sized else []) + ([_step_range(s)] if ranged else []))


def _fits_block(p: ModelReport) -> list[str]:
    """What fits, first (`topoprof.report.text_fits`), as a fixed-width block."""
    lines = fits_lines(p.fits)
    return ["```text", *[line for line in lines if line], "```", ""] if lines else []


def _memory_gb(s: StrategyResult) -> str:
    mem = s.memory
    if mem is None:
        return "–"
    return f"{mem.total_gb:,.1f}" + (" + activations?" if mem.parts_gb.get("activations") is None else "")


def _fits(s: StrategyResult) -> str:
    return {True: "yes", False: "no", None: "?"}[None if s.memory is None else s.memory.fits]


def _memory_basis(p: ModelReport) -> list[str]:
    """What the memory column rests on, and the arithmetic of what does not fit."""
    if "gpu_memory_gb" not in p.inputs:
        return []
    act = p.value("activation_memory_gb")
    activations = "unknown" if act is None else f"{act:.1f} GB"
    out = [f"Memory per GPU, counted: the GPU has {p.value('gpu_memory_gb') or '?'} GB ({p.source('gpu_memory_gb')}); "
           f"activations {activations} ({p.source('activation_memory_gb')}).", ""]
    reasons = not_fitting_reasons(p)
    return out + [f"- {r}" for r in reasons] + ([""] if reasons else [])


def _ddp_costs(p: ModelReport) -> list[str]:
    """Where DDP's cost goes per synced micro-batch, and the options that act on each part."""
    share = ddp_cost_share(p)
    if share is None:
        return []
    nominal, low, high = share
    verdict = (f" Even at the top of its range that is under {NOTHING_TO_GAIN_PCT:.0f} %: nothing worth attacking."
               if high < NOTHING_TO_GAIN_PCT else "")
    out = ["Where DDP's cost goes, per synced micro-batch (a range where nothing measured the part):", ""]
    out += _cost_table(p.ddp_costs)
    out += ["", f"DDP takes {nominal:.1f} % of a `ddp_synced` step{share_span(low, high, '–')}.{verdict}", ""]
    if p.ddp_knobs:
        out += ["DDP options with a predicted gain on `ddp_synced`: " + "; ".join(
            f"`{o.knob}` {o.gain_s * 1e3:.1f} ms ({o.gain_pct:.1f} %, on {o.part})" for o in p.ddp_knobs) + ".", ""]
    return out


def _fsdp_costs(p: ModelReport) -> list[str]:
    """Where FSDP's cost goes per synced micro-batch of fsdp_full_shard, and HSDP's levels."""
    share = fsdp_cost_share(p)
    out = [f"{line[0].upper()}{line[1:]}.\n" for line in hsdp_line(p)]
    if share is None:
        return out
    nominal, low, high = share
    out += [f"Where FSDP's cost goes in `{COST_STRATEGY}`, per synced micro-batch (a range where nothing measured "
            "the part):", ""]
    out += _cost_table(p.fsdp_costs)
    return out + ["", f"FSDP takes {nominal:.1f} % of an `{COST_STRATEGY}` step{share_span(low, high, '–')}.", ""]


def _cost_table(costs: dict[str, PartCost]) -> list[str]:
    return _table(["part", "ms", "range ms", "scales with", "from"],
                  [[f"`{name}`", ms, rng, c.scales_with, c.source]
                   for name, ms, rng, c in part_rows(costs, _ms, _span_ms, "–")])


def _span_ms(pair: list | tuple[float, float]) -> str:
    low, high = sorted(pair)
    return f"{low * 1e3:.1f}" if abs(high - low) < 0.05e-3 else f"{low * 1e3:.1f}–{high * 1e3:.1f}"


def _copies(parts: ScanParts) -> list[str]:
    rows = copy_verdicts(parts.copies, parts.topology)
    if not rows:
        return []
    status = {"ok": "OK", "low": "LOW", "unknown": "no reference figure"}
    out = ["### Host↔GPU copies against the PCIe link", ""]
    out += _table(["GPU", "copy", "measured GB/s", "link (NVML)", "raw GB/s", "share", "verdict"],
                  [[_copy_gpu(r), r.kind, f"{r.measured_gbps:.1f}", r.link,
                    f"{r.nominal_gbps:.1f}" if r.nominal_gbps else "–",
                    f"{100 * r.ratio:.0f} %" if r.ratio else "–", status[r.status]] for r in rows]) + [""]
    causes = sorted({r.cause for r in rows if r.cause})
    return out + [f"- {c}" for c in causes] + ([""] if causes else [])


def _copy_gpu(row: CopyVerdict) -> str:
    """"GPU6 (cuda:0)" where the job's device is not the node's GPU of the same number."""
    if row.gpu is None:
        return f"{row.device} (GPU unknown)"
    return f"GPU{row.gpu}" + ("" if row.device == f"cuda:{row.gpu}" else f" ({row.device})")


def _measured_vs_modelled(measured: float, modelled) -> str:
    fast, middle, slow = modelled
    return (f"Compute per micro-batch measured {_ms(measured)} ms; modelled from its own ops {_ms(fast)} – "
            f"{_ms(slow)} ms, middle {_ms(middle)} ms: measured is {100 * (measured / middle - 1):+.0f} % of the "
            f"middle, {'inside' if fast <= measured <= slow else 'outside'} the range.")


def _what_if(parts: ScanParts) -> list[str]:
    w = parts.what_if
    if w is None:
        return []
    out = ["## What if: more GPUs like this one", ""]
    if w.skipped:
        return out + [f"No what-if: {w.skipped}.", ""]
    assert w.single_step_s is not None  # a what-if that was made times one GPU's step
    out += [f"**What-if from nominal figures, not measured.** {w.label}, K = {w.accum}; compute: "
            f"{w.compute_source}. One GPU: {w.single_step_s * 1e3:.1f} ms per optimizer step. "
            "Each range spans the link's nominal low and high.", ""]
    check = w.compute_check
    if check is not None:  # the what-if method held against this GPU: what a GPU that is not here would be priced by
        out += [_measured_vs_modelled(check.measured_s, check.modelled_s)
                + (f" ({check.summary}.)" if check.summary else ""), ""]
    rows = []
    for c in w.cases:
        low, high = sorted(c.no_sync_saving)
        span = f"{100 * low:.0f}" if round(100 * low) == round(100 * high) else f"{100 * low:.0f}–{100 * high:.0f}"
        advice = (f"`no_sync()`: {span} % faster" if low >= 0.05 else
                  "sync every micro-batch: `no_sync()` saves under 5 %")
        rows.append([c.label, c.basis, _span_ms(c.step_time_s["ddp_synced"]), _span_ms(c.step_time_s["ddp_no_sync"]),
                     advice])
    out += _table(["job", "link", "ddp_synced ms", "ddp_no_sync ms", "advice"], rows) + [""]
    out += [f"- {m}" for m in w.missing] + ([""] if w.missing else [])
    return out + _chart(parts, "what_if", "throughput of each job over this one GPU, synced vs no_sync")


_PARTS = ("compute", "exposed_comm", "optimizer", "other")


def _range(v: ModeCheck) -> str:
    rng = v.predicted_range_s
    if not rng:
        return "–"
    inside = {True: " (inside)", False: " (outside)", None: ""}[v.inside_range]
    return f"{_ms(rng[0])} – {_ms(rng[1])}{inside}"


def _parts_rows(modes: dict[str, ModeCheck]) -> list[list]:
    rows = []
    for m, v in modes.items():
        meas, pred = v.parts.measured, v.parts.predicted
        if meas and pred:
            rows.append([f"`{m}`", *[f"{_ms(meas[p])} / {_ms(pred[p])}" for p in _PARTS]])
    return rows


def _calibration_rows(cal: Calibration) -> list[list]:
    rows = [[label, _value(s.value, unit), f"{_value(s.p25, unit)} – {_value(s.p75, unit)}", s.n]
            for key, label, unit in INPUTS if key != "comm_slowdown_during_compute" and (s := cal.spread.get(key))]
    for key, s in cal.spread.items():
        if key.startswith("comm_slowdown_at_"):
            size = int(key.split("_")[-2])
            rows.append([f"all-reduce of {size / 2**20:.1f} MiB beside compute", _value(s.value, "x"),
                         f"{_value(s.p25, 'x')} – {_value(s.p75, 'x')}", s.n])
    return rows


def _value(v: float, unit: str) -> str:
    return f"{v * 1e3:,.1f} ms" if unit == "ms" else f"×{v:.2f}"


def _validation(parts: ScanParts) -> list[str]:
    val = parts.validation
    out = ["## Validation: predicted vs measured", ""]
    if val.status == "skipped":
        return out + [f"Skipped: {val.reason}.", ""]
    modes = val.modes
    rows = [[f"`{m}`", _ms(v.measured_step_s), _ms(v.predicted_step_s), _range(v),
             "–" if v.error_pct is None else f"{v.error_pct:+.1f}%"] for m, v in modes.items()]
    cal = val.calibration or Calibration()
    out += [f"Real training loops of a {val.label} model on the same ranks, in "
            f"{cal.rotations if cal.rotations is not None else '?'} "
            "rotations: each rotation measures every input of the prediction and runs one step of every mode, so "
            "that a machine whose speed drifts moves both together (step time = max over ranks, median over "
            "rotations; the error compares each rotation's prediction with that rotation's measured step, median "
            "over rotations, so it need not equal the ratio of the two medians; the predicted range spans the "
            "predictions from each rotation's own inputs).", ""]
    out += _table(["mode", "measured ms", "predicted ms", "predicted range ms", "error"], rows) + [""]
    where_it_went = _parts_rows(modes)
    if where_it_went:
        out += ["Where the time went, measured / predicted (ms; measured from the slowest rank's timeline of the "
                "median step): the part that differs most names the miss.", ""]
        out += _table(["mode", *_PARTS], where_it_went) + [""]
    calibration = _calibration_rows(cal)
    if calibration:
        out += ["The model's inputs, measured in every rotation (value used, interquartile range, samples):", ""]
        out += _table(["input", "value", "quartiles", "n"], calibration) + [""]
    num = val.numerics
    checked = num.checked() if num is not None else []
    if num is not None and checked:
        agree = all(num.checks[m].allclose for m in checked)
        worst = max(num.checks[m].max_abs_diff_vs_single for m in checked)
        names = listed([f"`{m}`" for m in checked])
        out += [f"Numerics: after one optimizer step on the same global batch, {names} "
                f"{'agree with' if agree else 'DIFFER from'} one process accumulating "
                f"the whole batch (max |diff| {worst:.1e}, {num.dtype}).", ""]
    return out + _chart(parts, "pred_vs_measured", "predicted vs measured step time")


def _method(parts: ScanParts) -> list[str]:
    predictions = parts.predictions
    out = ["## Method and assumptions", "", f"- Bench: {parts.bench.metadata.protocol}."]
    if predictions and isinstance(predictions[0], ModelReport):
        out += [f"- Model: {a}" for a in predictions[0].assumptions]
    timing = parts.timing
    out += ["", "Wall time per stage: " + ", ".join(f"{k} {v:.1f} s" for k, v in timing.items() if k != "total_s")
            + f"; total {timing.get('total_s', 0):.1f} s.", ""]
    versions = parts.versions
    return out + ["Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + ".", ""]


def _step_range(s: StrategyResult) -> str:
    return "–" if s.range is None else f"{_ms(s.range.step_time_s[0])} – {_ms(s.range.step_time_s[1])}"


def _cluster(cluster: ClusterReport | None) -> list[str]:
    if cluster is None:
        return []
    summ = cluster.summary
    out = ["## Cluster", "", f"{summ.nodes} nodes, {'/'.join(map(str, summ.ranks_per_node))} rank(s) and "
           f"{'/'.join(map(str, summ.gpus_per_node))} GPU(s) per node.", ""]
    rows = [[f.host, f.ranks, f.gpus, ", ".join(f.gpu_names) or "–",
             ", ".join(f"{d} {r or '?'} Gb/s" for d, r in f.nics) or
             ", ".join(f"{n} {(s or 0) / 1000:g} Gb/s" for n, s in f.interfaces) or "–"] for f in summ.per_node]
    out += _table(["node", "ranks", "GPUs", "GPU model", "NICs / interfaces"], rows) + [""]
    out += [f"> differs: {d}" for d in summ.differing] + ([""] if summ.differing else [])
    levels = cluster.levels
    rows = []
    for level, label in (("intra", "inside a node"), ("inter", "network (one rank per node)"), ("job", "whole job")):
        if level == "intra" and not levels.get(level) and max(summ.ranks_per_node, default=0) == 1:
            rows.append([label, "–", 1, "–", "one rank per node: nothing to all-reduce inside a node"])
        for group, e in (levels.get(level) or {}).items():
            bw = e.fit.bandwidth_gbps
            rows.append([label, group, len(e.ranks), f"{e.peak_busbw_gbps:.3f} @ {e.peak_size_bytes:,} B",
                         f"{e.fit.latency_us:.0f} µs + S / {bw:.3f} GB/s" if bw else
                         f"{e.fit.latency_us:.0f} µs (latency only)"])
    if rows:
        out += (["All-reduce at each level:", ""]
                + _table(["level", "group", "ranks", "peak busbw GB/s", "fit"], rows) + [""])
    check = cluster.composed_check
    if check is not None:
        out += [f"Cross-check: the per-node ring and the network measured alone, composed as NCCL's ring crosses "
                f"them, give {check.composed_s * 1e3:.2f} ms for a {check.size_bytes:,} B all-reduce; the whole "
                f"job measured {check.measured_s * 1e3:.2f} ms ({check.error_pct:+.0f}%). Predictions use the "
                "whole job's own measurement.", ""]
    return out


def render_markdown(parts: ScanParts) -> str:
    """report.md, from a scan report's typed parts (`read_scan_parts`) alone."""
    out = [f"# topoprof scan: {parts.host}, {parts.created_utc}", "", f"> {parts.mode.banner}", ""]
    out += _todo(parts.recommendations, made(parts.predictions)) + _sources(parts.probes) + _cluster(parts.cluster)
    out += _topology(parts) + _bandwidth(parts) + _predictions(parts) + _what_if(parts) + _validation(parts)
    more = parts.recommendations[3:]
    if more:
        out += ["## More advice", ""]
        for r in more:
            out += [f"- **{r.title}.** {r.why}"]
            if r.snippet:
                out += ["", "  ```", *[f"  {line}" for line in r.snippet.splitlines()], "  ```"]
        out.append("")
    return "\n".join(out + _method(parts))
