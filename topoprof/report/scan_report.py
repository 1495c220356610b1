"""A scan's report.json read back typed, part by part, through the one reader
(`topoprof.jsonio.from_jsonable`): how the scan ran, the bench and its nominal ring, the copies,
the model's predictions, the validation, the topology, the bandwidth's verdict, the advice, the
sources asked, a one-GPU scan's what-if, a multi-node scan's cluster, the charts, the time each
stage took and the versions. report.md is rendered from these alone, and `topoprof report` reads
them before it writes anything, so that a report it cannot read is one line naming where."""
from __future__ import annotations

from dataclasses import dataclass, field

from topoprof.jsonio import from_jsonable
from topoprof.measure.bench import BenchReport, CopiesReport, read_bench
from topoprof.measure.cluster import ClusterReport
from topoprof.model.strategies.model_report import ModelReport, Skipped, read_predictions
from topoprof.model.strategies.whatif import WhatIfReport
from topoprof.model.validate.report import ValidateReport, read_validate_report
from topoprof.probing import ProbeStatus
from topoprof.report.recommend import Recommendation
from topoprof.report.verdict import NominalRing, Verdict, read_ring
from topoprof.topology.build import Topology
from topoprof.topology.load import topology_from_dict


@dataclass(frozen=True)
class ScanMode:
    """How the scan ran: its backend and ranks, whether this machine has a GPU, and the line
    that says so at the top of report.md."""

    backend: str = ""
    nproc: int | None = None
    gpu: bool = False
    summary: str = ""
    banner: str = ""


@dataclass(frozen=True)
class ScanParts:
    predictions: list[ModelReport | Skipped]
    validation: ValidateReport
    topology: Topology | None
    verdict: Verdict | None
    recommendations: list[Recommendation]
    probes: list[ProbeStatus]  # empty in reports written before sources had statuses
    what_if: WhatIfReport | None  # a one-GPU scan's
    cluster: ClusterReport | None  # a multi-node scan's
    host: str | None = None
    created_utc: str | None = None
    mode: ScanMode = ScanMode()
    bench: BenchReport = BenchReport()
    ring: NominalRing | None = None
    copies: CopiesReport | None = None
    charts: dict[str, str] = field(default_factory=dict)  # a chart's name: its file, beside report.md
    timing: dict[str, float] = field(default_factory=dict)  # a stage: its wall seconds, and total_s
    versions: dict[str, str | None] = field(default_factory=dict)


def read_scan_parts(report: dict) -> ScanParts:
    """The typed parts of `report` (a scan's report.json); `SchemaError` names where one differs."""
    return ScanParts(
        predictions=read_predictions(report.get("predictions")),
        # a report without its validation part renders it as one whose status is unknown
        validation=read_validate_report(report.get("validation") or {"status": ""}, "validation"),
        topology=topology_from_dict(report["topology"]) if report.get("topology") else None,
        verdict=from_jsonable(Verdict, report["verdict"], "verdict") if report.get("verdict") else None,
        recommendations=[from_jsonable(Recommendation, r, f"recommendations[{i}]")
                         for i, r in enumerate(report.get("recommendations") or [])],
        probes=[from_jsonable(ProbeStatus, p, f"probes[{i}]") for i, p in enumerate(report.get("probes") or [])],
        what_if=from_jsonable(WhatIfReport, report["what_if"], "what_if") if report.get("what_if") else None,
        cluster=from_jsonable(ClusterReport, report["cluster"], "cluster") if report.get("cluster") else None,
        host=report.get("host"), created_utc=report.get("created_utc"),
        mode=from_jsonable(ScanMode, report.get("mode") or {}, "mode"),
        bench=read_bench(report.get("bench") or {}),
        ring=read_ring(report.get("ring")),
        copies=from_jsonable(CopiesReport, report["copies"], "copies") if report.get("copies") else None,
        charts=from_jsonable(dict[str, str], report.get("charts") or {}, "charts"),
        timing=from_jsonable(dict[str, float], report.get("timing") or {}, "timing"),
        versions=from_jsonable(dict[str, str | None], report.get("versions") or {}, "versions"))
