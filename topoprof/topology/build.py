"""One picture of a node's wiring, built from whichever sources exist.

Sources, each optional: the text of `nvidia-smi topo -m` (path kind for every GPU/NIC pair),
an NVML snapshot (names, PCIe generation/width, NVLink counts and remotes, P2P status) and the
host probe (CPU, NUMA, NIC rates). Pure logic: the probes gather, this module combines.

For every GPU pair the result says how the pair is connected (path kind, NVLink count, NVSwitch),
whether GPU peer-to-peer works (yes / no / unknown) and the nominal bandwidth per direction with
its basis, or a range flagged uncertain when the data flows through host memory or the figure
depends on facts no source gave.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from topoprof.errors import InputError
from topoprof.probing import ProbeStatus
from topoprof.specs.host_facts import HostInfo  # held by a topology, and read back from its JSON
from topoprof.topology import constants
from topoprof.topology.visible import JobGpu

if TYPE_CHECKING:  # the probe records; importing them costs nothing but keeps layers explicit
    from topoprof.probes.hardware.nvidia_smi import SmiTopology
    from topoprof.probes.hardware.nvml import NvLink, NvmlSnapshot

# `nvidia-smi topo -m` path kinds from best to worst, with the legend's meaning.
PATH_MEANING = {
    "NV": "bonded NVLinks",
    "PIX": "at most one PCIe bridge",
    "PXB": "several PCIe bridges, no host bridge",
    "PHB": "through a PCIe host bridge (the CPU)",
    "NODE": "between PCIe host bridges within a NUMA node",
    "SYS": "across the CPU interconnect between NUMA nodes (QPI/UPI/Infinity Fabric)",
}
# NCCL uses direct GPU peer-to-peer only up to PXB by default (NCCL_P2P_LEVEL, src/graph/paths.cc
# ncclTopoCheckP2p: p2pLevel = PATH_PXB); farther pairs are staged through host shared memory.
P2P_PATH_KINDS = frozenset({"NV", "PIX", "PXB"})


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None          # "GPU-8932f937-...", as CUDA_VISIBLE_DEVICES may name it (NVML)
    compute_capability: tuple[int, int] | None = None
    memory_total_bytes: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    numa_node: int | None = None
    cpu_affinity: tuple[int, ...] | None = None
    nvlinks_active: int | None = None
    nvswitch_links: int | None = None
    lost: bool = False
    missing: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Nic:
    index: int
    label: str                       # column label in `nvidia-smi topo -m` (NIC0, mlx5_0)
    device: str                      # RDMA device name (mlx5_0)
    rate_gbit: float | None = None   # link rate from /sys/class/infiniband
    link_layer: str | None = None    # InfiniBand or Ethernet (RoCE)
    state: str | None = None
    numa_node: int | None = None
    nominal_gbps: float | None = None


@dataclass(frozen=True)
class PairLink:
    """How GPU a reaches GPU b, and what that link should carry per direction."""

    gpu_a: int
    gpu_b: int
    path: str | None                 # NV, PIX, PXB, PHB, NODE, SYS; None when no source says
    nvlinks: int                     # bonded NVLinks between the pair (0 if none)
    via_nvswitch: bool
    p2p: str                         # "yes", "no", "unknown"
    p2p_basis: str
    bandwidth_gbps: float | None     # nominal per direction; None when it can only be a range
    bandwidth_range_gbps: tuple[float, float] | None
    uncertain: bool
    basis: str


@dataclass(frozen=True)
class Topology:
    sources: tuple[str, ...]
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...]
    pairs: tuple[PairLink, ...]
    gpu_nic_paths: dict[str, str]    # "0:mlx5_0" -> path kind
    host: HostInfo | None = None     # when the host was probed
    driver_version: str | None = None
    notes: tuple[str, ...] = ()
    probes: tuple[ProbeStatus, ...] = ()  # each source asked, and what became of it
    # The job's view of the node (topology.visible): CUDA_VISIBLE_DEVICES as this process had it
    # (None: unset, every GPU is the job's), and which GPU each of torch's cuda:i is. job_gpus is
    # None for a topology that is not this process's node (read from a file).
    visible_devices: str | None = None
    job_gpus: tuple[JobGpu, ...] | None = None

    def pair(self, a: int, b: int) -> PairLink:
        lo, hi = sorted((a, b))
        for link in self.pairs:
            if (link.gpu_a, link.gpu_b) == (lo, hi):
                return link
        raise KeyError(f"no GPU pair ({a}, {b}) in this topology")

    def subset(self, gpus: list[int]) -> "Topology":
        """The same node restricted to the GPUs a job will use."""
        known = {g.index for g in self.gpus}
        unknown = [g for g in gpus if g not in known]
        if unknown:
            raise InputError(f"--gpus: GPU(s) {unknown} not in this topology (it has {sorted(known)})")
        keep = set(gpus)
        return Topology(
            sources=self.sources,
            gpus=tuple(g for g in self.gpus if g.index in keep),
            nics=self.nics,
            pairs=tuple(p for p in self.pairs if p.gpu_a in keep and p.gpu_b in keep),
            gpu_nic_paths={k: v for k, v in self.gpu_nic_paths.items() if int(k.split(":")[0]) in keep},
            host=self.host,
            driver_version=self.driver_version,
            notes=self.notes,
            probes=self.probes,
            visible_devices=self.visible_devices,
            job_gpus=self.job_gpus,
        )


def build_topology(
    smi: "SmiTopology | None" = None,
    nvml: "NvmlSnapshot | None" = None,
    host: "HostInfo | None" = None,
    notes: tuple[str, ...] = (),
    probes: tuple[ProbeStatus, ...] = (),
) -> Topology:
    """Combine the available sources into one Topology; `probes` says what became of each source."""
    gpus = _gpus(smi, nvml)
    nics = _nics(smi, host)
    pairs = tuple(
        _pair_link(a, b, smi, nvml, gpus)
        for i, a in enumerate(gpus)
        for b in gpus[i + 1:]
    )
    sources = tuple(s for s, present in (
        (f"nvidia-smi topo -m ({smi.source})" if smi else "", smi is not None),
        ("NVML", nvml is not None),
        ("host (/proc, /sys, psutil)", host is not None),
    ) if present)
    nic_paths = {}
    if smi is not None:
        for g in smi.gpus:
            for n in smi.nics:
                nic_paths[f"{g.index}:{n.device}"] = str(smi.gpu_nic_path(g.index, n.index))
    return Topology(
        sources=sources,
        gpus=gpus,
        nics=nics,
        pairs=pairs,
        gpu_nic_paths=nic_paths,
        host=host,
        driver_version=nvml.driver_version if nvml is not None else None,
        notes=notes + (smi.notes if smi is not None else ()) + _consistency_notes(smi, nvml),
        probes=probes,
    )


def _gpus(smi, nvml) -> tuple[Gpu, ...]:
    by_index: dict[int, Gpu] = {}
    if smi is not None:
        for g in smi.gpus:
            numa = g.numa_affinity[0] if g.numa_affinity and len(g.numa_affinity) == 1 else None
            if g.gpu_numa_id is not None:
                numa = g.gpu_numa_id
            by_index[g.index] = Gpu(index=g.index, numa_node=numa, cpu_affinity=g.cpu_affinity)
    if nvml is not None:
        switch = nvswitch_links(nvml)
        for g in nvml.gpus:
            base = by_index.get(g.index, Gpu(index=g.index))
            active = sum(1 for link in g.nvlinks if link.active) if g.nvlinks else (0 if not g.lost else None)
            by_index[g.index] = Gpu(
                index=g.index, name=g.name, pci_bus_id=g.pci_bus_id, uuid=g.uuid,
                compute_capability=g.compute_capability, memory_total_bytes=g.memory_total_bytes,
                pcie_gen_current=g.pcie_gen_current, pcie_gen_max=g.pcie_gen_max,
                pcie_width_current=g.pcie_width_current, pcie_width_max=g.pcie_width_max,
                numa_node=g.numa_node if g.numa_node is not None else base.numa_node,
                cpu_affinity=g.cpu_affinity if g.cpu_affinity is not None else base.cpu_affinity,
                nvlinks_active=active, nvswitch_links=switch.get(g.index, 0),
                lost=g.lost, missing=dict(g.missing),
            )
    return tuple(by_index[i] for i in sorted(by_index))


def _nics(smi, host) -> tuple[Nic, ...]:
    ports = {}
    if host is not None:
        for port in host.ib_ports:
            # A multi-port HCA lists each port; the first active one describes the device.
            if port.device not in ports or port.state == "ACTIVE":
                ports[port.device] = port
    names = [(n.index, n.label, n.device) for n in smi.nics] if smi is not None else [
        (i, d, d) for i, d in enumerate(sorted(ports))
    ]
    nics = []
    for index, label, device in names:
        port = ports.get(device)
        rate = port.rate_gbps if port is not None else None
        nics.append(Nic(
            index=index, label=label, device=device, rate_gbit=rate,
            link_layer=port.link_layer if port is not None else None,
            state=port.state if port is not None else None,
            numa_node=port.numa_node if port is not None else None,
            nominal_gbps=constants.nic_gbps(rate),
        ))
    return tuple(nics)


def _nvml_gpu(nvml, index: int):
    if nvml is None:
        return None
    return next((g for g in nvml.gpus if g.index == index), None)


def _pair_path(a: int, b: int, smi, nvml) -> tuple[str | None, int]:
    """Path kind and NVLink count: nvidia-smi's matrix first, then NVML: its NVLink remotes, and
    for a pair without NVLink its PCIe common ancestor (what nvidia-smi itself prints)."""
    if smi is not None and a < len(smi.gpus) and b < len(smi.gpus):
        code = smi.gpu_path(a, b)
        return code.kind, code.nvlinks
    if nvml is None:
        return None, 0

    nvlinks = nvlink_pairs(nvml).get((min(a, b), max(a, b)))
    if nvlinks:
        return "NV", nvlinks
    # Through NVSwitch every GPU reaches every other over all its switch links: nvidia-smi prints
    # NV18 for each pair of an 8 x H100 HGX board (fixture 18).
    switch = nvswitch_links(nvml)
    if switch.get(a) and switch.get(b):
        return "NV", min(switch[a], switch[b])
    status = next((p for p in nvml.p2p if {p.gpu_a, p.gpu_b} == {a, b}), None)
    return (status.pcie_path if status is not None else None), 0


def _p2p(a: int, b: int, path: str | None, nvml) -> tuple[str, str]:
    if nvml is not None:
        status = next((p for p in nvml.p2p if {p.gpu_a, p.gpu_b} == {a, b}), None)
        if status is not None and status.read is not None:
            if status.read == "ok":
                return "yes", "NVML P2P read status: ok"
            return "no", f"NVML P2P read status: {status.read}"
        if status is not None and status.reason:
            return "unknown", f"NVML could not tell: {status.reason}"
    if path in P2P_PATH_KINDS:
        return "unknown", f"{path} allows P2P, but no source confirmed it works (NVML unavailable)"
    if path is not None:
        return "no", f"{path}: NCCL stages through host memory beyond PXB by default (NCCL_P2P_LEVEL)"
    return "unknown", "no source describes this pair"


def _pair_link(a: Gpu, b: Gpu, smi, nvml, gpus) -> PairLink:
    path, nvlinks = _pair_path(a.index, b.index, smi, nvml)
    p2p, p2p_basis = _p2p(a.index, b.index, path, nvml)
    via_switch = bool(a.nvswitch_links) and bool(b.nvswitch_links) and path == "NV"
    bw, rng, uncertain, basis = nominal_bandwidth(path, nvlinks, p2p, a, b)
    return PairLink(
        gpu_a=a.index, gpu_b=b.index, path=path, nvlinks=nvlinks, via_nvswitch=via_switch,
        p2p=p2p, p2p_basis=p2p_basis, bandwidth_gbps=bw, bandwidth_range_gbps=rng,
        uncertain=uncertain, basis=basis,
    )


def nominal_bandwidth(path, nvlinks, p2p, a: Gpu, b: Gpu, cc_origin: str | None = None):
    """(bandwidth_gbps, range, uncertain, basis) for one GPU pair, per direction; `cc_origin`
    says where the GPUs' compute capability came from when no probe read it (e.g. --gpu)."""
    if path == "NV" and p2p != "no":
        return _nvlink_bandwidth(nvlinks, a, b, cc_origin)
    pcie = _pcie_pair(a, b)
    if path in ("PIX", "PXB") and p2p != "no":
        if pcie is None:
            rng = (constants.pcie_gbps(3, 16), constants.pcie_gbps(5, 16))
            return (None, rng, True,
                    f"{path}: PCIe generation/width unknown (no NVML); range spans x16 Gen3..Gen5")
        value, text = pcie
        note = "" if p2p == "yes" else " (P2P not confirmed)"
        return value, None, p2p != "yes", f"{path}: {text}{note}"
    if path is None:
        return None, None, True, "no source describes this pair"
    return _host_staged(path, p2p, pcie)


def _nvlink_bandwidth(nvlinks: int, a: Gpu, b: Gpu, cc_origin: str | None = None):
    known = [constants.nvlink_gbps_per_link(g.compute_capability) for g in (a, b)]
    per_link = [r for r in known if r is not None]
    if len(per_link) < len(known):
        lo, hi = constants.nvlink_gbps_bounds()
        return (None, (nvlinks * lo, nvlinks * hi), True,
                f"NV{nvlinks}: per-link rate depends on the GPU generation, unknown without NVML "
                f"({lo}-{hi} GB/s per link in NCCL's table)")
    rate = min(per_link)
    return (nvlinks * rate, None, False,
            f"NV{nvlinks}: {nvlinks} x {rate} GB/s per link (NCCL topo.h, sm{_sm(a)}"
            f"{f' from {cc_origin}' if cc_origin else ''})")


def with_compute_capability(topology: Topology, cc: tuple[int, int], origin: str) -> tuple[Topology, list[str]]:
    """The topology with compute capability `cc` (said by `origin`, e.g. "--gpu v100-sxm2") for
    every GPU no source gave one, and NCCL's per-link NVLink rate for it on their NVLink pairs, so
    an NV# pair is # x that rate instead of a range over generations. A GPU's own capability (read
    by NVML) is kept; where it differs from `cc` a note says so. Returns (topology, notes)."""
    filled = {g.index for g in topology.gpus if g.compute_capability is None}
    differ = sorted(g.index for g in topology.gpus
                    if g.compute_capability is not None and tuple(g.compute_capability) != tuple(cc))
    notes = []
    if differ:
        theirs = sorted({_sm(g) for g in topology.gpus if g.index in differ})
        notes.append(f"{origin} is sm{cc[0]}{cc[1]}, but the topology reads sm{'/sm'.join(theirs)} for GPU(s) "
                     f"{', '.join(map(str, differ))}: the topology's is kept for their NVLink rate")
    if not filled:
        return topology, notes
    gpus = tuple(replace(g, compute_capability=(cc[0], cc[1])) if g.index in filled else g for g in topology.gpus)
    by_index = {g.index: g for g in gpus}
    pairs = []
    for p in topology.pairs:
        if p.path == "NV" and (p.gpu_a in filled or p.gpu_b in filled):
            bw, rng, uncertain, basis = nominal_bandwidth(p.path, p.nvlinks, p.p2p, by_index[p.gpu_a],
                                                          by_index[p.gpu_b], cc_origin=origin)
            p = replace(p, bandwidth_gbps=bw, bandwidth_range_gbps=rng, uncertain=uncertain, basis=basis)
        pairs.append(p)
    return replace(topology, gpus=gpus, pairs=tuple(pairs)), notes


def _sm(gpu: Gpu) -> str:
    cc = gpu.compute_capability
    return f"{cc[0]}{cc[1]}" if cc else "?"


def _pcie_pair(a: Gpu, b: Gpu) -> tuple[float, str] | None:
    """The slower GPU's PCIe link at its maximum generation and width, or None if unknown."""
    links = []
    for g in (a, b):
        gbps = constants.pcie_gbps(g.pcie_gen_max, g.pcie_width_max)
        if gbps is None:
            return None
        links.append((gbps, f"PCIe Gen{g.pcie_gen_max} x{g.pcie_width_max} = {gbps:g} GB/s"))
    return min(links)


def _host_staged(path: str, p2p: str, pcie):
    lo, hi = constants.HOST_STAGED_RANGE_GBPS
    if pcie is not None:
        hi = min(hi, pcie[0])
        lo = min(lo, hi)
    reason = "P2P unavailable" if path in P2P_PATH_KINDS else f"{path} path"
    return (None, (lo, hi), True,
            f"{reason}: staged through host memory, rate uncertain until measured "
            f"({lo:g}-{hi:g} GB/s)")


def _consistency_notes(smi, nvml) -> tuple[str, ...]:
    notes = []
    if smi is not None and nvml is not None and len(smi.gpus) != len(nvml.gpus):
        notes.append(f"nvidia-smi shows {len(smi.gpus)} GPUs but NVML reports {len(nvml.gpus)}")
    if nvml is not None:
        for g in nvml.gpus:
            if g.lost:
                notes.append(f"GPU {g.index} is lost (NVML_ERROR_GPU_IS_LOST): reset or reboot needed")
            gen_low = (g.pcie_gen_current is not None and g.pcie_gen_max is not None
                       and g.pcie_gen_current < g.pcie_gen_max)
            width_low = (g.pcie_width_current is not None and g.pcie_width_max is not None
                         and g.pcie_width_current < g.pcie_width_max)
            if width_low:
                notes.append(f"GPU {g.index} PCIe link runs x{g.pcie_width_current} below its x{g.pcie_width_max}: "
                             f"check the slot/riser")
            elif gen_low:
                notes.append(f"GPU {g.index} PCIe link at Gen{g.pcie_gen_current} below Gen{g.pcie_gen_max} "
                             "(normal at idle: GPUs lower the link speed to save power; check under load)")
    return tuple(notes)


def _gpu_buses(snapshot: NvmlSnapshot) -> dict[str, int]:
    return {gpu.pci_bus_id: gpu.index for gpu in snapshot.gpus if gpu.pci_bus_id is not None}


def nvlink_pairs(snapshot: NvmlSnapshot) -> dict[tuple[int, int], int]:
    """Active NVLinks between GPU pairs (a < b), the NV# of `nvidia-smi topo -m`.

    Each link is seen from both ends; both ends are counted separately and the larger count kept,
    so a GPU whose links cannot be read does not hide the pair and no link is counted twice.
    """
    owner = _gpu_buses(snapshot)
    seen: dict[tuple[int, int], int] = {}
    for gpu in snapshot.gpus:
        for link in gpu.nvlinks:
            peer = owner.get(link.remote_bus_id) if link.active and link.remote_bus_id is not None else None
            if peer is not None and peer != gpu.index:
                seen[(gpu.index, peer)] = seen.get((gpu.index, peer), 0) + 1
    pairs: dict[tuple[int, int], int] = {}
    for (a, b), count in seen.items():
        key = (min(a, b), max(a, b))
        pairs[key] = max(pairs.get(key, 0), count)
    return dict(sorted(pairs.items()))


def nvswitch_links(snapshot: NvmlSnapshot) -> dict[int, int]:
    """Per GPU that is not lost: active links whose far end is an NVSwitch (`nvidia-smi nvlink -R`).

    Where the remote type cannot be read, a remote bus id that is no GPU's counts as a switch
    (on POWER9 an NVLink to the CPU would be counted too; only the type function tells them apart).
    """
    gpu_buses = set(_gpu_buses(snapshot))

    def to_switch(link: NvLink) -> bool:
        if link.remote_device_type is not None:
            return link.remote_device_type == "switch"
        return link.remote_bus_id is not None and link.remote_bus_id not in gpu_buses

    return {gpu.index: sum(1 for link in gpu.nvlinks if link.active and to_switch(link))
            for gpu in snapshot.gpus if not gpu.lost}
