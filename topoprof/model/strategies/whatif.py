"""What a one-GPU node's model would do on more GPUs of the same kind: predictions from nominal
links, never from a measurement, so each is a range and is labelled a what-if.

The compute per micro-batch is this GPU's, as measured (`--model`, `--micro-batch-time`); the
links are those a user could buy or rent around it:
- 2, 4 and 8 such GPUs on NVSwitch: every GPU's NVLinks, from NCCL's per-link figure (what its
  model assumes) to the datasheet's raw rate (`constants.NVLINK_DATASHEET_BY_SM`);
- 2, 4 and 8 such GPUs over PCIe at this GPU's generation and width, peer to peer: from NCCL's
  figure to the raw rate after line encoding;
- 2 to 4 nodes of one such GPU over 25, 100, 200 and 400 Gbit/s networks: from NCCL's NET_BW
  share (12 GB/s for 100 Gbit/s, topo.h) to the raw rate.
"""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.model.comm import links
from topoprof.model.comm.collectives import CommModel, RingComm, SingleGpuComm
from topoprof.model.compute.datasheet import GpuSpec, lookup_gpu_quietly
from topoprof.model.strategies.job import Cluster, ModelInputs
from topoprof.model.strategies.predict import predict
from topoprof.model.strategies.results import StrategyResult
from topoprof.topology import constants
from topoprof.topology.build import Gpu

GPU_COUNTS = (2, 4, constants.STANDARD_NODE_GPUS)
NODE_COUNTS = (2, 3, 4)
NETWORK_GBIT = (25, 100, 200, 400)
# NCCL topo.h: NET_BW 12.0 GB/s for a 100 Gbit/s NIC, whose raw rate is 12.5 GB/s.
NCCL_NET_SHARE = 12.0 / 12.5
STRATEGIES = ("ddp_synced", "ddp_no_sync")


@dataclass(frozen=True)
class Link:
    kind: str                        # "NVLink", "PCIe", "network"
    bandwidth_gbps: tuple[float, float]
    hop_latency_us: float
    basis: str
    # the rings NCCL's search runs at once over it: through NVSwitch one per NVLink of a GPU (as
    # `links.comm_from_topology` counts them), else one
    rings: int = 1


def sxm_part(name: str | None) -> bool:
    """Whether the datasheet table knows this GPU as an SXM part, the form that sits on an
    NVSwitch baseboard (V100 SXM2, A100 SXM4, H100/H200 SXM5): PCIe cards of the same
    generation (L4, L40S, A10, RTX) have no NVLink, or only a bridge to one peer."""
    spec = lookup_gpu_quietly(name)  # an unknown name: not known to be SXM
    return spec is not None and _sxm(spec)


def _sxm(spec: GpuSpec) -> bool:
    return "sxm" in spec.name


def nvlink(gpu) -> Link | None:
    """NVLink through NVSwitch for a GPU the table has as an SXM part; else None."""
    return _nvswitch(gpu) if sxm_part(gpu.name) else None


def _nvswitch(gpu) -> Link | None:
    """Every NVLink of the GPU's generation through NVSwitch; None where the tables lack it."""
    sheet = constants.nvlink_datasheet(gpu.compute_capability)
    nccl = constants.nvlink_gbps_per_link(gpu.compute_capability)
    if sheet is None or nccl is None:
        return None
    links, raw = sheet
    return Link("NVLink", (links * nccl, links * raw), constants.HOP_LATENCY_US["NV"],
                f"{links} NVLinks x {nccl:g}..{raw:g} GB/s (NCCL topo.h .. datasheet), sm{gpu.compute_capability[0]}"
                f"{gpu.compute_capability[1]} SXM on NVSwitch", rings=links)


def pcie(gpu) -> Link | None:
    gen, width = gpu.pcie_gen_max, gpu.pcie_width_max
    nccl, raw = constants.pcie_gbps(gen, width), constants.pcie_raw_gbps(gen, width)
    if nccl is None:
        return None
    return Link("PCIe", (nccl, raw or nccl), constants.HOP_LATENCY_US["PCIE"],
                f"PCIe Gen{gen} x{width} peer to peer, {nccl:g}..{(raw or nccl):.1f} GB/s (NCCL topo.cc .. raw after "
                f"encoding)")


def standard_link(spec: GpuSpec | None) -> Link | None:
    """The link of the node a GPU's datasheet row is sold in: NVLink through NVSwitch for an SXM
    part, else PCIe of its generation and width, peer to peer; None for a GPU the table does not
    know or whose link it cannot price."""
    if spec is None:
        return None
    gen, width = spec.pcie or (None, None)
    gpu = Gpu(index=0, name=spec.name, compute_capability=spec.compute_capability, pcie_gen_max=gen,
              pcie_width_max=width)
    return _nvswitch(gpu) if _sxm(spec) else pcie(gpu)  # its row in hand: not looked up again


def network(gbit: float) -> Link:
    raw = gbit / constants.BITS_PER_BYTE
    return Link("network", (raw * NCCL_NET_SHARE, raw), constants.HOP_LATENCY_US["NET"],
                f"{gbit:g} Gbit/s per node, {raw * NCCL_NET_SHARE:.2f}..{raw:.2f} GB/s (NCCL NET_BW share .. raw)")


def _steps(workload, compute, accum: int, nodes: int, gpus_per_node: int, link: Link, bandwidth: float) -> dict:
    comm: CommModel
    if nodes == 1:
        comm = RingComm(link_bandwidth_gbps=bandwidth, hop_latency_us=link.hop_latency_us,
                        world_size=gpus_per_node, source=link.basis)
    else:
        comm = links.across_nodes(None, nodes, 1, bandwidth, link.hop_latency_us)
    result = predict(ModelInputs(workload, compute, Cluster(comm, nodes=nodes, gpus_per_node=gpus_per_node),
                                 accumulation_steps=accum), parts=False)
    return {name: _step_time_s(result.strategies[name]) for name in STRATEGIES}


def _case(label: str, workload, compute, accum: int, nodes: int, gpus_per_node: int, link: Link) -> dict:
    slow = _steps(workload, compute, accum, nodes, gpus_per_node, link, link.bandwidth_gbps[0])
    fast = _steps(workload, compute, accum, nodes, gpus_per_node, link, link.bandwidth_gbps[1])
    return {"label": label, "kind": link.kind, "nodes": nodes, "gpus_per_node": gpus_per_node,
            "world_size": nodes * gpus_per_node, "basis": link.basis, "bandwidth_gbps": list(link.bandwidth_gbps),
            "step_time_s": {name: [fast[name], slow[name]] for name in STRATEGIES},
            # what no_sync saves over syncing every micro-batch, at the slow and the fast end
            "no_sync_saving": [1 - slow["ddp_no_sync"] / slow["ddp_synced"],
                               1 - fast["ddp_no_sync"] / fast["ddp_synced"]]}


def what_ifs(workload, compute, gpu, accum: int) -> dict:
    """Every case for this GPU, and the links that could not be priced with the reason."""
    cases, missing = [], []
    name = gpu.name or "GPU"
    for make in (nvlink, pcie):
        link = make(gpu)
        if link is None:
            why = ("not an SXM part on NVSwitch in the datasheet table, or its compute capability unknown"
                   if make is nvlink else "PCIe generation and width unknown")
            missing.append(f"{make.__name__}: no nominal figure for {name} ({why})")
            continue
        cases += [_case(f"{n} x {name} over {link.kind}", workload, compute, accum, 1, n, link) for n in GPU_COUNTS]
    for gbit in NETWORK_GBIT:
        link = network(gbit)
        cases += [_case(f"{nodes} nodes x 1 {name}, {gbit:g} Gbit/s", workload, compute, accum, nodes, 1, link)
                  for nodes in NODE_COUNTS]
    single = _single_step(workload, compute, accum)
    return {"label": workload.layout.name, "accum": accum, "single_step_s": single, "cases": cases,
            "missing": missing,
            "note": "what-if from nominal figures, not measured: ranges span the links' nominal low and high"}


def _single_step(workload, compute, accum: int) -> float:
    result = predict(ModelInputs(workload, compute, Cluster(SingleGpuComm(), 1, 1), accumulation_steps=accum))
    return _step_time_s(result.strategies["single"])


def _step_time_s(result) -> float:
    """A what-if's strategy always applies: its step time."""
    assert isinstance(result, StrategyResult), result
    return result.step_time_s


# ---- the result as a scan's report.json holds it, read back typed (report/scan_report.py) ----------


@dataclass(frozen=True)
class WhatIfCase:
    """One job of such GPUs (`_case`): each strategy's step at the link's (fast, slow) ends."""

    label: str
    kind: str
    nodes: int
    gpus_per_node: int
    world_size: int
    basis: str
    bandwidth_gbps: tuple[float, float]
    step_time_s: dict[str, tuple[float, float]]
    no_sync_saving: tuple[float, float]  # at the slow end, at the fast end


@dataclass(frozen=True)
class ComputeCheck:
    """The compute measured on this GPU beside the range priced from the model's own ops
    (`topoprof.model.inputs.scan.compute_check`)."""

    measured_s: float
    modelled_s: tuple[float, float, float]
    summary: str | None = None


@dataclass(frozen=True)
class WhatIfReport:
    """A one-GPU scan's what-if (`what_ifs`, with the scan's label and compute), or why it was skipped."""

    label: str | None = None
    skipped: str | None = None
    accum: int | None = None
    single_step_s: float | None = None
    cases: tuple[WhatIfCase, ...] = ()
    missing: tuple[str, ...] = ()
    compute_source: str | None = None
    compute_check: ComputeCheck | None = None
    note: str | None = None  # what the figures are (nominal, not measured)
