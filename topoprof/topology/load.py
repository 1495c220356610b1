"""Read a Topology back from a file: a saved `nvidia-smi topo -m` text or a topoprof JSON document."""
from __future__ import annotations

import json

from topoprof.errors import InputError
from topoprof.jsonio import SchemaError, from_jsonable
from topoprof.probes.hardware.nvidia_smi import read_topo_file
from topoprof.topology.build import Topology, build_topology


def topology_from_dict(data: dict) -> Topology:
    """The inverse of `jsonio.to_jsonable(topology)`, through the one typed reader (`SchemaError`
    names where a document differs)."""
    return from_jsonable(Topology, data, "topology")


def topology_from_file(path: str) -> Topology:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(1 << 20)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    if head.lstrip().startswith("{"):
        try:
            doc = json.loads(head)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{err.lineno}: not JSON: {err.msg}") from None
        data = doc.get("topology", doc)
        if not isinstance(data, dict) or "pairs" not in data:
            raise InputError(f"{path}: JSON without a topology (expected `topoprof topo --json` or a scan report)")
        try:
            return topology_from_dict(data)
        except SchemaError as err:
            raise InputError(f"{path}: topology JSON does not match this version: {err}") from None

    return build_topology(smi=read_topo_file(path))
