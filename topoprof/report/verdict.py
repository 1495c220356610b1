"""'Is my number normal?': measured bus bandwidth against what the links should give.

The expectation is NCCL's own nominal bus bandwidth for the job's GPUs (topo.h per-link rates
already stand for what NCCL expects a link to deliver, not the datasheet peak): over an NVLink
mesh without NVSwitch the rings NCCL runs at once together (`model.links.nvlink_rings`), else
the ring's slowest link; or a range where the path goes through host memory or the GPU
generation is unknown. A measured peak at or
above LOW_SHARE of the nominal figure is OK; below that it is low by the shortfall, with the
likely causes the report can see.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from topoprof.jsonio import from_jsonable
from topoprof.measure.bench import BenchReport, CopiesReport
from topoprof.specs.collective_spec import BenchRow
from topoprof.topology import constants
from topoprof.topology.build import Topology
from topoprof.topology.visible import job_devices

# Judgement threshold, not a model constant: below this share of NCCL's own nominal figure a
# user should look for a cause (a healthy ring reaches most of it at large sizes).
LOW_SHARE = 0.8


@dataclass(frozen=True)
class Verdict:
    level: str                        # "intra-node ring over GPUs 0-7", "CPU ranks over loopback"
    measured_busbw_gbps: float | None
    at_size_bytes: int | None
    expected_gbps: float | None
    expected_range_gbps: tuple[float, float] | None
    status: str                       # "ok", "low", "in range", "unknown"
    ratio: float | None
    summary: str
    causes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class NominalRing:
    """The nominal ring a report's `ring` holds (the `links` description of
    `model.comm.links.comm_from_topology`): the best single ring, its slowest edge and hop, and the
    rings NCCL runs together with what they carry; a report written before it had several rings
    gives only the one ring's `bottleneck_gbps`."""

    ring: list[int]
    bottleneck_gbps: tuple[float, float]
    hop: str
    rings: list[list[int]] | None = None
    bus_bandwidth_gbps: tuple[float, float] | None = None


def read_ring(doc: dict | None) -> NominalRing | None:
    return from_jsonable(NominalRing, doc, "ring") if doc else None


def _peak(rows: list[BenchRow], collective: str = "all_reduce") -> BenchRow | None:
    good = [r for r in rows if r.collective == collective and not r.wrong and r.level == "job"
            and r.busbw_gbps is not None]
    return max(good, key=lambda r: r.busbw_gbps or 0.0) if good else None


def likely_causes(topology: Topology | None, bench: BenchReport) -> list[str]:
    causes = []
    for line in (bench.nccl.explained if bench.nccl is not None else []):
        causes.append(f"NCCL: {line}")
    pairs, notes = (topology.pairs, topology.notes) if topology is not None else ((), ())
    for p in pairs:
        if p.path in ("NV", "PIX", "PXB") and p.p2p == "no":
            causes.append(f"P2P is off between GPU {p.gpu_a} and {p.gpu_b} ({p.p2p_basis})")
            break
    causes += [n for n in notes if "PCIe link" in n]
    for flag in bench.slow_ranks:
        causes.append(f"rank {flag.rank} is consistently slower ({flag.median_excess_pct:+.0f}% on "
                      f"{flag.slower_sizes}/{flag.sizes} sizes): check its GPU, link and CPU binding")
    return causes


def judge(bench: BenchReport, topology: Topology | None, ring: NominalRing | None) -> Verdict:
    """One verdict for the measured all-reduce against the nominal bus bandwidth of `ring`."""
    peak = _peak(bench.rows)
    world, backend = bench.metadata.world_size, bench.metadata.backend
    if world == 1:  # nothing crosses a link: no bandwidth was given, and none is judged
        return Verdict(f"1 rank, {backend}", None, None, None, None, "unknown", None,
                       "one rank: nothing crosses a link, so there is no bus bandwidth to judge "
                       "(its rows time the collective on that one rank alone)")
    if peak is None:
        return Verdict("all-reduce", None, None, None, None, "unknown", None, "no correct all-reduce rows measured")
    measured, size = peak.busbw_gbps, peak.size_bytes
    assert measured is not None  # `_peak` keeps rows with a bus bandwidth
    if backend.startswith("gloo"):
        return Verdict(f"{world} CPU rank(s), gloo", measured, size, None, None, "unknown", None,
                       f"peak busbw {measured:.3f} GB/s at {size} B; there is no nominal figure for "
                       "CPU ranks (host memory copies and TCP), so nothing to compare with")
    if ring is None:
        return Verdict(f"{world} rank(s), {backend}", measured, size, None, None, "unknown", None,
                       f"peak busbw {measured:.3f} GB/s at {size} B; no nominal ring to compare with "
                       "(fewer than 2 GPUs of this node in the job, or no topology)")
    lo, hi = ring.bus_bandwidth_gbps or ring.bottleneck_gbps
    rings = ring.rings or [ring.ring]
    level = (f"intra-node ring {'-'.join(map(str, ring.ring))} ({'NVLink' if ring.hop == 'NV' else 'PCIe/host'})"
             if len(rings) == 1 else
             f"intra-node rings over GPUs {','.join(map(str, sorted(ring.ring)))} "
             f"({len(rings)} at once over NVLink)")
    causes = tuple(likely_causes(topology, bench))
    if lo == hi:
        ratio = measured / lo
        if ratio >= LOW_SHARE:
            return Verdict(level, measured, size, lo, None, "ok", ratio,
                           f"peak busbw {measured:.1f} GB/s = {ratio:.0%} of the nominal {lo:.1f} GB/s: normal")
        return Verdict(level, measured, size, lo, None, "low", ratio,
                       f"peak busbw {measured:.1f} GB/s is {1 - ratio:.0%} below the nominal {lo:.1f} GB/s", causes)
    status = "in range" if lo * LOW_SHARE <= measured else "low"
    text = (f"peak busbw {measured:.2f} GB/s against an uncertain {lo:.1f}-{hi:.1f} GB/s "
            f"({'within what this path can give' if status == 'in range' else 'below even the low end'})")
    return Verdict(level, measured, size, None, (lo, hi), status, None, text, causes if status == "low" else ())


@dataclass
class CopyVerdict:
    """One host<->GPU copy against its GPU's PCIe link."""

    gpu: int | None                 # the node's GPU the device is; None: unknown
    device: str                     # torch's cuda:i
    kind: str                       # h2d or d2h
    measured_gbps: float
    nominal_gbps: float | None      # the link's raw rate; None: unknown
    link: str                       # "Gen5 x16", or "unknown"
    ratio: float | None = None
    status: str = "unknown"         # ok, low, unknown
    cause: str | None = None        # why it is low, where NVML saw the link run below what it can


def copy_verdicts(copies: CopiesReport | None, topology: Topology | None) -> list[CopyVerdict]:
    """Each host<->GPU copy against its GPU's PCIe link as NVML reports it: the raw rate after
    line encoding at the link's maximum generation and width (a pinned copy reaches most of it;
    an idle GPU reports a lower current generation to save power, so the maximum is the
    reference), OK from LOW_SHARE; when low, a link NVML saw running narrower or slower is named.
    A copy on torch's cuda:i is judged against the link of the GPU that cuda:i is (the topology's
    `job_gpus`: under CUDA_VISIBLE_DEVICES=6,2 cuda:0 is GPU 6; a MIG device copies over its GPU's)."""
    if copies is None or copies.status != "ok":
        return []
    gpus = {g.index: g for g in topology.gpus} if topology is not None else {}
    devices = job_devices(topology) if topology is not None else ()
    out = []
    for m in copies.measurements:
        if m.kind not in ("h2d", "d2h"):
            continue
        ordinal = int((m.dst if m.kind == "h2d" else m.src).split(":")[1])
        index = devices[ordinal].gpu if ordinal < len(devices) else None
        gpu = gpus.get(index) if index is not None else None
        gen = (gpu.pcie_gen_max or gpu.pcie_gen_current) if gpu is not None else None
        width = (gpu.pcie_width_max or gpu.pcie_width_current) if gpu is not None else None
        nominal = constants.pcie_raw_gbps(gen, width)
        row = CopyVerdict(index, f"cuda:{ordinal}", m.kind, m.bandwidth_gbps, nominal,
                          f"Gen{gen} x{width}" if nominal else "unknown")
        if nominal:
            row.ratio = m.bandwidth_gbps / nominal
            row.status = "ok" if row.ratio >= LOW_SHARE else "low"
        below = [f"{what}{now} of {what}{best}" for what, now, best in
                 (("Gen", gpu.pcie_gen_current, gpu.pcie_gen_max), ("x", gpu.pcie_width_current, gpu.pcie_width_max))
                 if now and best and now < best] if gpu is not None else []
        if below and row.status == "low":
            row.cause = "the link runs below what it can (" + ", ".join(below) + \
                           "): check `nvidia-smi -q -d PCIE` while a copy runs " + \
                           "(an idle GPU lowers its generation on purpose)"
        out.append(row)
    return out
