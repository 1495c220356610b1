"""A scan report on disk: report.json (everything), PNG charts, and report.md for people.

`write_report` is used both by `topoprof scan` and by `topoprof report PATH/report.json`, which
re-renders the charts and the Markdown from the JSON alone. A scan writes through `save_report`,
which falls back to the temporary directory rather than lose what was measured.
"""
from __future__ import annotations

import os
from dataclasses import replace

from topoprof.errors import InputError
from topoprof.jsonio import SCHEMA_VERSION, SchemaError, dumps, load_json, spare_folder, to_jsonable
from topoprof.measure.bench import CopiesReport
from topoprof.model.compute.datasheet import lookup_gpu_quietly
from topoprof.model.strategies.model_report import ModelReport, made
from topoprof.model.strategies.results import Memory, StrategyResult
from topoprof.report import plots
from topoprof.report.markdown import render_markdown
from topoprof.report.scan_report import ScanParts, read_scan_parts
from topoprof.report.verdict import NominalRing, copy_verdicts
from topoprof.topology.build import Topology

CHARTS = ("busbw", "links", "copies", "what_if", "step_vs_accum", "pred_vs_measured", "memory")


def _nominal(ring: NominalRing | None) -> list[dict]:
    """The nominal ring's bus bandwidth as the bus-bandwidth chart draws it: a line, or a band."""
    if ring is None:
        return []
    lo, hi = ring.bus_bandwidth_gbps or ring.bottleneck_gbps
    rings = ring.rings or [ring.ring]
    label = (f"nominal slowest ring link ({'NVLink' if ring.hop == 'NV' else 'PCIe/host'})" if len(rings) == 1
             else f"nominal {len(rings)} NVLink rings together")
    if lo == hi:
        return [{"label": f"{label} {lo:g} GB/s", "gbps": lo}]
    return [{"label": f"{label} {lo:g}-{hi:g} GB/s", "low_gbps": lo, "high_gbps": hi}]


def _primary(predictions: list[ModelReport]) -> ModelReport | None:
    return next((p for p in predictions if (p.label or "").startswith("1.3B")), predictions[0] if predictions else None)


def _largest(predictions: list[ModelReport]) -> ModelReport | None:
    """The prediction whose model holds the most memory (the one that may not fit), among those
    whose GPU's memory is known (without a GPU there is no memory to fit into)."""
    def memories(p: ModelReport) -> list[Memory]:
        return [s.memory for s in p.strategies.values() if isinstance(s, StrategyResult) and s.memory is not None]

    sized = [p for p in predictions if any(m.gpu_memory_gb for m in memories(p))]
    return max(sized, key=lambda p: max(m.total_gb or 0 for m in memories(p)), default=None)


def _copy_reference(copies: CopiesReport, topology: Topology | None) -> dict:
    """The figures the copies chart draws its measurements against: the PCIe link's raw rate (as
    the copies' verdict takes it, from NVML) and the GPU's datasheet memory bandwidth, where every
    copied GPU is the same known model; None where unknown."""
    links = [r.nominal_gbps for r in copy_verdicts(copies, topology) if r.nominal_gbps]
    # an unknown GPU has no figure: nothing is drawn for it
    specs = {lookup_gpu_quietly(name) for name in copies.device_names}
    spec = next(iter(specs)) if len(specs) == 1 else None
    hbm = spec.memory_bandwidth_gbps if spec is not None else None
    return {"pcie_gbps": max(links) if links else None, "hbm_gbps": hbm}


def render_charts(parts: ScanParts, out_dir: str) -> dict[str, str]:
    """The PNG charts of a scan report's typed parts (`read_scan_parts`) in out_dir, each plot
    handed its record's JSON data; their file names."""
    charts = {}
    job_rows = [to_jsonable(r) for r in parts.bench.rows if r.level == "job"]
    if job_rows and parts.mode.nproc != 1:  # one rank: no link, no bus bandwidth
        charts["busbw"] = plots.plot_busbw(job_rows, to_jsonable(parts.bench.fit), _nominal(parts.ring),
                                           os.path.join(out_dir, "busbw.png"),
                                           title=f"Bus bandwidth, {parts.mode.summary}")
    topo = parts.topology
    if topo is not None and len(topo.gpus) >= 2:
        charts["links"] = plots.plot_link_matrix(to_jsonable(topo.gpus), to_jsonable(topo.pairs),
                                                 os.path.join(out_dir, "links.png"))
    if parts.copies is not None and parts.copies.status == "ok":
        charts["copies"] = plots.plot_copy_matrix(to_jsonable(parts.copies), os.path.join(out_dir, "copies.png"),
                                                  reference=_copy_reference(parts.copies, parts.topology))
    if parts.what_if is not None and parts.what_if.cases:  # one GPU: what more such GPUs and nodes would give
        charts["what_if"] = plots.plot_what_if(to_jsonable(parts.what_if), os.path.join(out_dir, "what_if.png"))
    predictions = made(parts.predictions)
    primary = _primary(predictions)
    if primary is not None and primary.sweep is not None:
        charts["step_vs_accum"] = plots.plot_step_vs_accum(
            to_jsonable(primary.sweep), os.path.join(out_dir, "step_vs_accum.png"),
            title=f"Predicted step time vs accumulation steps: {primary.label}")
    fitted = _largest(predictions)
    if fitted is not None:
        charts["memory"] = plots.plot_memory(to_jsonable(fitted.strategies), os.path.join(out_dir, "memory.png"),
                                             title=f"Memory per GPU by strategy: {fitted.label}")
    validation = parts.validation
    cases = [{"label": validation.label or "", "mode": mode, **to_jsonable(m)}
             for mode, m in validation.modes.items() if m.measured_step_s]
    if cases:
        charts["pred_vs_measured"] = plots.plot_pred_vs_measured(cases, os.path.join(out_dir, "pred_vs_measured.png"))
    return {name: os.path.basename(path) for name, path in charts.items()}


def write_report(report: dict, out_dir: str, beside: dict[str, str] | None = None) -> dict[str, str]:
    """report.json, the charts, report.md and the files `beside` (name: text) in out_dir; returns
    the file names written."""
    parts = read_scan_parts(report)  # once, for the charts and report.md
    os.makedirs(out_dir, exist_ok=True)
    report["charts"] = render_charts(parts, out_dir)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        f.write(dumps(report) + "\n")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(render_markdown(replace(parts, charts=report["charts"])))
    for name, text in (beside or {}).items():
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(text)
    return {"json": "report.json", "markdown": "report.md", **report["charts"]}


def save_report(report: dict, out_dir: str, beside: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """write_report in out_dir, or, if that fails at the end of a scan, in a new folder in the
    system's temporary directory, so that nothing measured is lost: (the folder written, or None
    if neither could be; why out_dir could not be, or None)."""
    try:
        write_report(report, out_dir, beside)
        return out_dir, None
    except OSError as err:
        reason = err.strerror or str(err)
    try:
        spare = spare_folder()
        write_report(report, spare, beside)
        return spare, reason
    except OSError:
        return None, reason


def load_report(path: str) -> dict:
    doc = load_json(path)
    if doc.get("kind") != "scan":
        raise InputError(f"{path}: not a scan report (kind {doc.get('kind')!r}); expected report.json from `topoprof "
                         f"scan`")

    if doc.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"{path}: schema_version {doc.get('schema_version')} is not {SCHEMA_VERSION}, the one this "
                         f"topoprof reads")
    try:  # read here, so that a part the renderers cannot read is one line naming where
        read_scan_parts(doc)
    except SchemaError as err:
        raise InputError(f"{path}: {err}") from None
    return doc
