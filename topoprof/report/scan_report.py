"""A scan's report.json read back typed, part by part, through the one reader
(`topoprof.jsonio.from_jsonable`): the model's predictions, the validation, the topology, the
bandwidth's verdict, the advice, the sources asked, a one-GPU scan's what-if and a multi-node
scan's cluster. report.md is rendered from these, and `topoprof report` reads them before it
writes anything, so that a report it cannot read is one line naming where."""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.jsonio import from_jsonable
from topoprof.measure.cluster import ClusterReport
from topoprof.model.strategies.model_report import ModelReport, Skipped, read_predictions
from topoprof.model.strategies.whatif import WhatIfReport
from topoprof.model.validate.report import ValidateReport, read_validate_report
from topoprof.probing import ProbeStatus
from topoprof.report.recommend import Recommendation
from topoprof.report.verdict import Verdict
from topoprof.topology.build import Topology
from topoprof.topology.load import topology_from_dict


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
        cluster=from_jsonable(ClusterReport, report["cluster"], "cluster") if report.get("cluster") else None)
