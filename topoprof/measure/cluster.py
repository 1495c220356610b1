"""Several nodes at a glance: what each has, and which differ from the rest."""
from __future__ import annotations

from collections import Counter


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
