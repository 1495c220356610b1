"""Several nodes at a glance: what each has, and which differ from the rest."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from topoprof.measure.fit import FitLine
from topoprof.topology.build import Topology


def nodes_from_ranks(ranks: list[dict]) -> list[dict]:
    """Group the per-rank reports of the `nodes` worker by host, in rank order."""
    nodes: dict[str, dict] = {}
    for info in sorted(ranks, key=lambda r: r["rank"]):
        key = info.get("node", info["host"])
        node = nodes.setdefault(key, {"host": key, "ranks": [], "topology": None})
        node["ranks"].append(info["rank"])
        if info.get("topology") is not None:
            node["topology"] = info["topology"]
    return list(nodes.values())


def _node_facts(node: dict) -> dict:
    topo = node.get("topology") or {}
    gpus = topo.get("gpus", [])
    nics = [(n["device"], n.get("rate_gbit")) for n in topo.get("nics", [])]
    host = topo.get("host") or {}
    up = [(i["name"], i.get("speed_mbps")) for i in host.get("interfaces", [])
          if i.get("is_up") and not i.get("is_loopback")]
    return {"host": node["host"], "ranks": len(node["ranks"]), "gpus": len(gpus),
            "gpu_names": sorted({g.get("name") or "?" for g in gpus}), "nics": nics, "interfaces": up,
            "cpu": (host.get("cpu") or {}).get("model")}


def summarize(nodes: list[dict]) -> dict:
    """Nodes, GPUs per node, NICs and speeds per node; facts that differ from the majority."""
    facts = [_node_facts(n) for n in nodes]
    differing = []
    for key in ("ranks", "gpus", "gpu_names", "nics", "cpu"):
        values = Counter(repr(f[key]) for f in facts)
        if len(values) > 1:
            common = values.most_common(1)[0][0]
            for f in facts:
                if repr(f[key]) != common:
                    differing.append(f"{f['host']}: {key} = {f[key]} (most nodes: {common})")
    return {"nodes": len(facts), "ranks_per_node": sorted({f["ranks"] for f in facts}),
            "gpus_per_node": sorted({f["gpus"] for f in facts}), "per_node": facts, "differing": differing}


# ---- the cluster part of a scan's report.json, read back typed (report/scan_report.py) ----------


@dataclass(frozen=True)
class NodeFacts:
    """What `_node_facts` says of one node."""

    host: str
    ranks: int
    gpus: int
    gpu_names: tuple[str, ...]
    nics: tuple[tuple[str, float | None], ...]        # (RDMA device, Gb/s)
    interfaces: tuple[tuple[str, float | None], ...]  # (name, Mb/s), up and not loopback
    cpu: str | None


@dataclass(frozen=True)
class ClusterSummary:
    nodes: int
    ranks_per_node: tuple[int, ...]
    gpus_per_node: tuple[int, ...]
    per_node: tuple[NodeFacts, ...]
    differing: tuple[str, ...]


@dataclass(frozen=True)
class LevelFit:
    """One group's all-reduce at one level (`topoprof.scan.pipeline.level_fits`)."""

    fit: FitLine
    ranks: tuple[int, ...]
    peak_busbw_gbps: float
    peak_size_bytes: int


@dataclass(frozen=True)
class ComposedCheck:
    """The levels composed vs the whole job at its largest size (`topoprof.model.inputs.scan.composed_check`)."""

    size_bytes: int
    measured_s: float
    composed_s: float
    error_pct: float


@dataclass(frozen=True)
class ClusterNode:
    """One node of the job: its host, its ranks, and its topology as its ranks sent it (None
    where none did)."""

    host: str
    ranks: list[int]
    topology: Topology | None = None


@dataclass(frozen=True)
class ClusterReport:
    summary: ClusterSummary
    levels: dict[str, dict[str, LevelFit]] = field(default_factory=dict)  # "intra", "inter", "job": group -> fit
    composed_check: ComposedCheck | None = None
    nodes: list[ClusterNode] = field(default_factory=list)
