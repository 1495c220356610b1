"""Read a Topology back from a file: a saved `nvidia-smi topo -m` text or a topoprof JSON document."""
from __future__ import annotations

import json

from topoprof.errors import InputError
from topoprof.probes.hardware.nvidia_smi import read_topo_file
from topoprof.probing import ProbeStatus
from topoprof.topology.build import Gpu, Nic, PairLink, Topology, build_topology
from topoprof.topology.visible import JobGpu


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value


def topology_from_dict(data: dict) -> Topology:
    """The inverse of `jsonio.to_jsonable(topology)`."""
    gpus = tuple(Gpu(**{k: _tuple(v) for k, v in g.items()}) for g in data["gpus"])
    nics = tuple(Nic(**n) for n in data.get("nics", []))
    pairs = tuple(PairLink(**{k: _tuple(v) for k, v in p.items()}) for p in data["pairs"])
    return Topology(sources=tuple(data.get("sources", ())), gpus=gpus, nics=nics, pairs=pairs,
                    gpu_nic_paths=dict(data.get("gpu_nic_paths", {})), host=data.get("host"),
                    driver_version=data.get("driver_version"), notes=tuple(data.get("notes", ())),
                    probes=tuple(ProbeStatus(**p) for p in data.get("probes", ())),
                    visible_devices=data.get("visible_devices"),
                    job_gpus=None if data.get("job_gpus") is None else tuple(JobGpu(**d) for d in data["job_gpus"]))


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
        except (TypeError, KeyError) as err:
            raise InputError(f"{path}: topology JSON does not match this version: {err}") from None

    return build_topology(smi=read_topo_file(path))
