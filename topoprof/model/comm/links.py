"""Collective-time models from what is known about the links: a bench fit, a topology, or numbers.

The step-time model (`topoprof.model.strategies`) takes a CommModel; this module builds one from
(a) a measured all-reduce fit (a `bench --json` or scan report), (b) the nominal links of a
topology for a chosen GPU set, or (c) an explicit bandwidth and latency, and for several nodes
composes the intra-node ring with the network.
"""
from __future__ import annotations

import itertools

from topoprof.errors import InputError
from topoprof.jsonio import load_json
from topoprof.model.comm import channels
from topoprof.model.comm.collectives import CommModel, HierarchicalComm, MeasuredComm, RingComm, SingleGpuComm
from topoprof.topology import constants

# Exhaustive search over rings is (n-1)!/2 cycles: fine up to 9 GPUs (20160), greedy beyond.
EXHAUSTIVE_RING_LIMIT = 9


def _edge(topology, a: int, b: int) -> tuple[float, float, str]:
    """(low, high) GB/s per direction and the hop kind of one GPU pair."""
    pair = topology.pair(a, b)
    if pair.bandwidth_gbps is not None:
        lo = hi = pair.bandwidth_gbps
    elif pair.bandwidth_range_gbps is not None:
        lo, hi = pair.bandwidth_range_gbps
    else:
        raise InputError(f"GPU pair {a}-{b}: no bandwidth known ({pair.basis})")
    return lo, hi, "NV" if pair.path == "NV" and pair.p2p != "no" else "PCIE"


def best_ring(topology, gpus: list[int]) -> tuple[list[int], tuple[float, float], str]:
    """The ring order whose slowest edge is fastest (as NCCL's ring search aims for).

    Returns (order, (low, high) bottleneck GB/s, hop kind of the slowest edge)."""
    if len(gpus) < 2:
        return list(gpus), (float("inf"), float("inf")), "NV"
    first, rest = gpus[0], gpus[1:]
    orders = (itertools.permutations(rest) if len(gpus) <= EXHAUSTIVE_RING_LIMIT
              else [tuple(_greedy_ring(topology, gpus)[1:])])
    best: tuple[list[int], tuple[float, float], str] | None = None
    for tail in orders:
        ring = [first, *tail]
        edges = [_edge(topology, ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]
        slowest = min(edges, key=lambda e: (e[0], e[1]))
        if best is None or (slowest[0], slowest[1]) > (best[1][0], best[1][1]):
            best = (ring, (slowest[0], slowest[1]), slowest[2])
    assert best is not None  # two GPUs or more: one order at least
    return best


def _greedy_ring(topology, gpus: list[int]) -> list[int]:
    ring, left = [gpus[0]], set(gpus[1:])
    while left:
        nxt = max(sorted(left), key=lambda g: _edge(topology, ring[-1], g)[:2])
        ring.append(nxt)
        left.remove(nxt)
    return ring


def _nvlink_pairs(topology, gpus: list[int]) -> list:
    """The GPU pairs NCCL sends over NVLink directly (P2P not refused)."""
    keep = set(gpus)
    return [p for p in topology.pairs if p.gpu_a in keep and p.gpu_b in keep
            and p.path == "NV" and p.p2p != "no" and p.nvlinks > 0]


def through_nvswitch(topology, gpus: list[int]) -> bool:
    """Whether NVSwitch joins these GPUs: NVML saw switch links, or a GPU's NV# counts to all
    its peers in the node add up to more NVLinks than a GPU of its generation has (8 GPUs
    printing NV12 or NV18 for every pair: each pair sees all of a GPU's switch links)."""
    pairs = [p for p in topology.pairs if p.path == "NV"]
    if any(p.via_nvswitch for p in _nvlink_pairs(topology, gpus)):
        return True
    by_index = {g.index: g for g in topology.gpus}
    for g in gpus:
        sheet = constants.nvlink_datasheet(by_index[g].compute_capability)
        most = sheet[0] if sheet else constants.MAX_NVLINKS_PER_GPU
        if sum(p.nvlinks for p in pairs if g in (p.gpu_a, p.gpu_b)) > most:
            return True
    return False


def nvlink_rings(topology, gpus: list[int]):
    """NCCL's rings at once over the chosen GPUs' NVLink mesh (`channels.pack_rings`), capped by
    each GPU's own NVLinks (`channels.link_bound`): (rings, per-ring (low, high) GB/s, total
    (low, high)); None through NVSwitch (one ring there already runs at each GPU's full NVLink
    bandwidth) or when the NVLink pairs do not join every chosen GPU into a ring."""
    if len(gpus) < 2:
        return None
    links, per_link = {}, {}
    for p in _nvlink_pairs(topology, gpus):
        lo, hi, _ = _edge(topology, p.gpu_a, p.gpu_b)
        key = (min(p.gpu_a, p.gpu_b), max(p.gpu_a, p.gpu_b))
        links[key], per_link[key] = p.nvlinks, (lo / p.nvlinks, hi / p.nvlinks)
    if through_nvswitch(topology, gpus):
        return None
    packing = channels.pack_rings(gpus, links, per_link, EXHAUSTIVE_RING_LIMIT)
    if not packing.rings:
        return None
    (lo, hi), (max_lo, max_hi) = packing.total_gbps, channels.link_bound(gpus, links, per_link)
    return packing.rings, packing.ring_gbps, (min(lo, max_lo), min(hi, max_hi))


def nvlink_rate_text(topology, gpus: list[int], origin: str | None = None) -> str | None:
    """Where the NVLink per-link rate of these GPUs comes from; None without NVLink pairs."""
    if not _nvlink_pairs(topology, gpus):
        return None
    caps = [g.compute_capability for g in topology.gpus if g.index in set(gpus)]
    if any(cc is None for cc in caps):
        lo, hi = constants.nvlink_gbps_bounds()
        return (f"NVLink per-link rate unknown without the GPUs' compute capability: {lo:g}-{hi:g} GB/s "
                "per NCCL src/graph/topo.h (--gpu NAME pins it)")
    rates = []
    for major, minor in sorted({tuple(cc) for cc in caps}):
        rate = constants.nvlink_gbps_per_link((major, minor))
        rates.append(f"sm{major}{minor} ({rate:g} GB/s per link)" if rate is not None
                     else f"sm{major}{minor} (no NCCL per-link rate)")
    return f"NVLink {', '.join(rates)} per NCCL src/graph/topo.h, from {origin or 'the topology'}"


def comm_from_topology(topology, gpus: list[int] | None = None,
                       rate_origin: str | None = None) -> tuple[CommModel, dict]:
    """The chosen GPUs' all-reduce at the nominal bus bandwidth of their links: over an NVLink
    mesh without NVSwitch, the rings NCCL runs at once (`nvlink_rings`), else one ring at its
    slowest edge; one GPU has no ring and no link (`SingleGpuComm`). `rate_origin` names where
    the GPUs' compute capability came from when the topology had none (e.g. "--gpu v100-sxm2").

    The description keeps the best single ring (`ring`, `bottleneck_gbps`, `hop`) and adds the
    rings used (`rings`), what they carry together (`bus_bandwidth_gbps`, the RingComm's B) and
    why (`rings_kind`: nvlink_mesh, nvswitch or one_ring; `rings_basis`), and where the NVLink
    rate came from (`nvlink_rate`)."""
    chosen = gpus if gpus is not None else [g.index for g in topology.gpus]
    if not chosen:
        raise InputError("no GPU chosen: --gpus needs at least one index, e.g. 0 or 0,1,2,3")
    sub = topology.subset(chosen)  # refuses indices the topology does not have
    where = topology.sources[0] if topology.sources else "topology"
    if len(chosen) == 1:
        return (SingleGpuComm(f"GPU {chosen[0]} of {where}: one GPU, no link"),
                {"gpus": chosen, "no_link": "one GPU: nothing to all-reduce"})
    # the two ways to run: one ring at its slowest edge, or the NVLink mesh's rings at once
    order, (lo, hi), hop = best_ring(sub, chosen)
    packed = nvlink_rings(topology, chosen)
    described = {"ring": order, "bottleneck_gbps": [lo, hi], "hop": hop}
    total, rings, kind = (lo, hi), [order], "one_ring"
    basis = "one ring at its slowest edge"
    if hop == "NV" and through_nvswitch(topology, chosen):
        kind, basis = "nvswitch", "NVSwitch: one ring at each GPU's NVLink bandwidth (NV# x per-link rate)"
    # Only where the rings together beat one ring at its slowest edge (not by rounding): a pair's
    # NV# rings are its one ring at NV# x per-link, and a ring through a fast PCIe hop could win.
    if packed is not None and packed[2][0] > lo * (1 + 1e-9) and packed[2][1] >= hi:
        rings, total, kind, hop = [list(r) for r in packed[0]], packed[2], "nvlink_mesh", "NV"
        basis = (f"NVLink mesh without NVSwitch: {len(rings)} rings at once, one NVLink of each pair "
                 "per ring and direction (NCCL channels, src/graph/search.cc)")
    rate = nvlink_rate_text(topology, chosen, rate_origin)
    described.update(rings=rings, bus_bandwidth_gbps=list(total), rings_kind=kind, rings_basis=basis,
                     **({"nvlink_rate": rate} if rate else {}))
    comm = nominal_ring(total, constants.HOP_LATENCY_US[hop], len(chosen), f"nominal links of {where}",
                        _search_rings(topology, chosen, kind, rings))
    return comm, described


def nominal_ring(bandwidth_gbps: tuple[float, float], hop_latency_us: float, world_size: int, source: str,
                 rings: int) -> RingComm:
    """A ring over nominal links of (low, high) GB/s: at the range's geometric middle, the range
    kept where it is one, NCCL's base latency once per collective."""
    lo, hi = bandwidth_gbps
    rng = None if lo == hi else (lo, hi)
    nominal = lo if rng is None else (lo * hi) ** 0.5  # geometric middle of an uncertain range
    return RingComm(link_bandwidth_gbps=nominal, hop_latency_us=hop_latency_us, world_size=world_size,
                    bandwidth_range_gbps=rng, base_latency_us=constants.RING_BASE_LATENCY_US, source=source,
                    rings=rings)


def standard_node_comm(link, gpus: int) -> RingComm:
    """`gpus` GPUs of one standard node (`whatif.standard_link`: NVSwitch or PCIe) as one ring."""
    return nominal_ring(link.bandwidth_gbps, link.hop_latency_us, gpus, link.basis, link.rings)


def _search_rings(topology, gpus: list[int], kind: str, rings: list) -> int:
    """The rings NCCL's search finds: those packed over an NVLink mesh; through NVSwitch, one per
    NVLink of a GPU (each link a channel of the pair's bandwidth); else one."""
    if kind == "nvswitch":
        return max(p.nvlinks for p in _nvlink_pairs(topology, gpus))
    return len(rings)


def load_bench_fit(path: str) -> tuple[float, float, int, dict]:
    """(latency_us, algbw_gbps, world_size, fit dict with its `rows`) of all_reduce from a bench or scan JSON."""
    doc = load_json(path)
    bench = doc.get("bench", doc)
    fit = (bench.get("fit") or {}).get("all_reduce")
    if not fit or not fit.get("bandwidth_gbps"):
        raise InputError(f"{path}: no all_reduce fit with a finite bandwidth (run `topoprof bench --json`)")
    world = int((bench.get("metadata") or {}).get("world_size") or 0)
    if world < 2:
        raise InputError(f"{path}: the bench ran on {world} rank(s); a fit needs at least 2")
    backend = (bench.get("metadata") or {}).get("backend")
    return float(fit["latency_us"]), float(fit["bandwidth_gbps"]), world, {**fit, "rows": bench.get("rows", []),
                                                                           "backend": backend}


def comm_explicit(bandwidth_gbps: float, latency_us: float, world_size: int) -> RingComm:
    return RingComm(link_bandwidth_gbps=bandwidth_gbps, hop_latency_us=latency_us,
                    world_size=world_size, source="--link-bandwidth/--link-latency")


def across_nodes(intra: CommModel | None, nodes: int, gpus_per_node: int,
                 network_gbps: float | None, network_latency_us: float | None) -> CommModel:
    """Compose the per-node ring with the network: the slowest level bounds the ring.

    `intra` is None when no intra-node link was described; one GPU per node needs none (every
    ring edge is then a network hop), and one GPU in all needs no link at all."""
    if gpus_per_node == 1 and nodes == 1:
        return _one_gpu(intra)
    if nodes == 1:
        return _need_intra(intra, gpus_per_node)
    if network_gbps is None:
        raise InputError(f"--nodes {nodes} needs --network-bandwidth (GB/s of each node's NICs together)")
    inter = RingComm(link_bandwidth_gbps=network_gbps,
                     hop_latency_us=network_latency_us if network_latency_us is not None
                     else constants.HOP_LATENCY_US["NET"],
                     world_size=nodes, source="--network-bandwidth")
    intra_ring = None if gpus_per_node == 1 else _as_ring(intra, gpus_per_node)
    return HierarchicalComm(intra=intra_ring, inter=inter, nodes=nodes, gpus_per_node=gpus_per_node)


def _one_gpu(intra: CommModel | None) -> CommModel:
    """One node of one GPU: keep a described one-GPU model (its source), else a plain one."""
    return intra if isinstance(intra, SingleGpuComm) else SingleGpuComm()


def _need_intra(intra: CommModel | None, gpus_per_node: int) -> CommModel:
    if intra is None:
        raise InputError(f"{gpus_per_node} GPUs per node need an intra-node link: give --link-bandwidth, "
                         "--topology or --bench")
    return intra


def _as_ring(intra: CommModel | None, gpus_per_node: int) -> RingComm:
    """The per-node ring as a RingComm at gpus_per_node (a fit keeps its bus bandwidth)."""
    intra = _need_intra(intra, gpus_per_node)
    ring = intra if isinstance(intra, RingComm) else RingComm(
        link_bandwidth_gbps=intra.bus_bandwidth_gbps, hop_latency_us=constants.HOP_LATENCY_US["NV"],
        world_size=gpus_per_node, source=intra.source)
    return ring.at_shape(1, gpus_per_node)


def measured_comm(rows, fit, world_size: int, source: str):
    """The all-reduce fit plus its measured curve (correct rows only), as one comm model; the
    all-gather and reduce-scatter rows, where measured, as curves of their own (FSDP's)."""
    def get(row, key):
        return row[key] if isinstance(row, dict) else getattr(row, key)

    def curve(name):
        return tuple(sorted({get(r, "size_bytes"): get(r, "time_us") for r in rows
                             if get(r, "collective") == name and not get(r, "wrong")
                             and get(r, "time_us") > 0}.items()))

    curves = tuple((name, curve(name)) for name in ("all_gather", "reduce_scatter") if curve(name))
    return MeasuredComm(latency_us=fit.latency_us if hasattr(fit, "latency_us") else fit["latency_us"],
                        algbw_gbps=fit.bandwidth_gbps if hasattr(fit, "bandwidth_gbps") else fit["bandwidth_gbps"],
                        world_size=world_size, source=source, points=curve("all_reduce"), curves=curves)
