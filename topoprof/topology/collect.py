"""This node's wiring from its sources: nvidia-smi, NVML and the host, each optional.

The probes (probes/) read the hardware; this module asks each of them, turns a failure into a
`ProbeStatus` with its reason, and builds one Topology from whatever answered.
"""
from __future__ import annotations

import os
from dataclasses import replace

from topoprof.probes.hardware import nvidia_smi
from topoprof.probes.hardware import nvml as nvml_probe
from topoprof.probes.hardware.host import query_host
from topoprof.probing import SKIPPED, ProbeStatus, attempt
from topoprof.topology.build import build_topology
from topoprof.topology.visible import JobView, identify, job_devices, job_gpus


def collect_topology(from_file: str | None = None, use_nvml: bool = True):
    """Gather the sources and build a Topology; a source that fails is a ProbeStatus, never the end.

    With `from_file`, the saved `nvidia-smi topo -m` text is the only source: it usually comes
    from another machine, so this machine's NVML and host facts would be wrong beside it. A file
    whose path matrix cannot be read is bad input (exit 2, FILE:LINE).
    """
    if from_file is not None:
        smi = nvidia_smi.read_topo_file(from_file)
        return build_topology(smi=smi, probes=(_smi_status(smi, ProbeStatus("nvidia-smi", "ok")),))
    smi, smi_status = attempt("nvidia-smi", lambda: nvidia_smi.parse_topo_matrix(
        nvidia_smi.run_topo_matrix(), source="nvidia-smi topo -m"))
    nvml, nvml_status = None, ProbeStatus("NVML", SKIPPED, "--no-nvml")
    if use_nvml:
        nvml, nvml_status = attempt("NVML", nvml_probe.query_nvml)

    host, host_status = attempt("host", query_host)
    if host is not None:
        host_status = replace(host_status, detail=f"{host.hostname}: {host.cpu.cpus_logical or '?'} CPU(s), "
                              f"{len(host.numa_nodes)} NUMA node(s), {len(host.ib_ports)} RDMA port(s)")
    probes = (_smi_status(smi, smi_status), _nvml_status(nvml, nvml_status), host_status)
    return for_this_job(build_topology(smi=smi, nvml=nvml, host=host, probes=probes))


def for_this_job(topology):
    """The topology with this process's view of it (`topology.visible`): CUDA_VISIBLE_DEVICES,
    which GPU each of torch's cuda:i is by the variable, and what its reading has to say."""
    setting = os.environ.get("CUDA_VISIBLE_DEVICES")
    view = job_gpus(setting, topology.gpus, os.environ.get("CUDA_DEVICE_ORDER"))
    return replace(topology, visible_devices=setting, job_gpus=view.devices, notes=topology.notes + view.notes)


def identified(topology, identities):
    """The job's devices tied by CUDA's own (UUID, PCI bus id) of each torch device, as a process
    that started CUDA read them (`identities[i]` for cuda:i); unchanged without them."""
    if not identities:
        return topology
    view = identify(JobView(job_devices(topology)), identities, topology.gpus)
    return replace(topology, job_gpus=view.devices, notes=topology.notes + view.notes)


def _smi_status(smi, status):
    """nvidia-smi read: how much, and whether some of it could only be noted (see the notes)."""
    if smi is None:
        return status
    detail = f"{smi.source}: {len(smi.gpus)} GPU(s), {len(smi.nics)} NIC(s)"
    if smi.notes:
        return replace(status, status="partial", detail=f"{detail}; {len(smi.notes)} field(s) noted below")
    return replace(status, detail=detail)


# NVML fields a report relies on; the others (NVLinks on a PCIe GPU, the GPU's own NUMA node
# outside coherent platforms) are commonly NotSupported and only listed.
_CORE_NVML_FIELDS = ("name", "pci_bus_id", "compute_capability", "pcie_gen_max", "pcie_width_max")


def _nvml_status(nvml, status):
    """NVML read: every field it could not answer is named, with the driver's reason."""
    if nvml is None:
        return status
    missing = sorted({f"{name} ({why})" for g in nvml.gpus for name, why in g.missing.items()})
    lost = [g.index for g in nvml.gpus if g.lost]
    core = [g.index for g in nvml.gpus if any(f in g.missing for f in _CORE_NVML_FIELDS)]
    detail = f"{len(nvml.gpus)} GPU(s), driver {nvml.driver_version or '?'}"
    if missing:
        detail += "; not answered: " + ", ".join(missing)
    bad = lost or core
    return replace(status, status="partial" if bad else status.status,
                   detail=detail + (f"; GPU(s) {', '.join(map(str, bad))} incomplete" if bad else ""))
