"""Time of one collective as a function of its size: the ring (alpha-beta) model.

For n ranks on a ring whose slowest edge moves B bytes/s per direction, with a per-hop latency a
(Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009; NCCL `src/graph/tuning.cc`, whose step counts we follow for the latency terms):

  all-reduce                  T = 2(n-1)*a + 2(n-1)/n * S/B
  reduce-scatter, all-gather  T =  (n-1)*a +  (n-1)/n * S/B   (S = the full buffer, nccl-tests)
  broadcast, reduce           T =  (n-1)*a +          S/B     (a pipelined chain of n-1 hops)
  gather onto one rank        T =  (n-1)*a + (n-1) *  S/B     (S per rank; all enters the root
                                                              through its one inbound ring edge)

B is what nccl-tests calls bus bandwidth (busbw = algbw * 2(n-1)/n for all-reduce,
nccl-tests `doc/PERFORMANCE.md`), so a measured all-reduce fit t(S) = alpha + S/beta gives
B = beta * 2(n-1)/n and a = alpha / (2(n-1)). A chain broadcast pays n-1 hop latencies; NCCL's
tuning.cc charges n steps for it, a difference of one hop. One rank (n = 1) communicates nothing.
GB/s = 1e9 B/s; latencies in microseconds.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

from topoprof.errors import InputError

GB = 1e9  # bytes per GB: GB/s = 1e9 B/s, as nccl-tests reports
US = 1e-6  # seconds per microsecond


class LinkUnknown(InputError):
    """A job shape needs a link nobody described (e.g. several GPUs per node when only the
    network was given): sweeps skip that shape with this reason instead of inventing a link."""


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise InputError(f"{name} must be > 0, got {value}")


def _check_range(name: str, nominal: float, rng: tuple[float, float] | None) -> None:
    if rng is None:
        return
    low, high = rng
    if not 0 < low <= nominal <= high:
        raise InputError(f"{name} range must satisfy 0 < low <= nominal <= high, "
                         f"got low({low}) nominal({nominal}) high({high})")


class CommModel(ABC):
    """Collective times in seconds for buffers of `size_bytes` on `world_size` ranks."""

    world_size: int
    source: str  # where the numbers came from: "bench fit", "nominal NVLink", "given", ...

    @property
    @abstractmethod
    def bus_bandwidth_gbps(self) -> float:
        """B of the ring formulas: the slowest edge's per-direction bandwidth."""

    @abstractmethod
    def _latency_s(self, hops: str) -> float:
        """Latency of a collective: hops is 'allreduce', 'half' (RS/AG) or 'chain'."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The inputs and the formula, for a report."""

    @abstractmethod
    def bounds(self) -> tuple[CommModel, CommModel] | None:
        """(slowest, fastest) variants when an input is a range, else None."""

    @abstractmethod
    def at_shape(self, nodes: int, gpus_per_node: int) -> CommModel:
        """The same links at another job shape (for sweeps over world size)."""

    def _bytes_s(self, size_bytes: float) -> float:
        return size_bytes / (self.bus_bandwidth_gbps * GB)

    def allreduce_s(self, size_bytes: float) -> float:
        n = self.world_size
        if n == 1:
            return 0.0
        return self._latency_s("allreduce") + 2 * (n - 1) / n * self._bytes_s(size_bytes)

    def reduce_scatter_s(self, size_bytes: float) -> float:
        n = self.world_size
        if n == 1:
            return 0.0
        return self._latency_s("half") + (n - 1) / n * self._bytes_s(size_bytes)

    all_gather_s = reduce_scatter_s

    def broadcast_s(self, size_bytes: float) -> float:
        if self.world_size == 1:
            return 0.0
        return self._latency_s("chain") + self._bytes_s(size_bytes)

    reduce_s = broadcast_s

    def gather_s(self, size_bytes_per_rank: float) -> float:
        n = self.world_size
        if n == 1:
            return 0.0
        return self._latency_s("chain") + (n - 1) * self._bytes_s(size_bytes_per_rank)


def _hop_count(hops: str, n: int) -> int:
    """NCCL tuning.cc ring step counts: 2(n-1) for all-reduce, n-1 for the others."""
    return 2 * (n - 1) if hops == "allreduce" else n - 1


@dataclass(frozen=True)
class RingComm(CommModel):
    """A ring over links of `link_bandwidth_gbps` per direction (the slowest edge of the ring,
    summed over the rings/channels NCCL runs in parallel) and `hop_latency_us` per hop.
    `base_latency_us` is added once per collective (NCCL tuning.cc baseLat, e.g. 8.4 us for
    ring/Simple); it is an explicit input, 0 unless given."""

    link_bandwidth_gbps: float
    hop_latency_us: float
    world_size: int
    bandwidth_range_gbps: tuple[float, float] | None = None
    base_latency_us: float = 0.0
    source: str = "given"
    # the rings NCCL's search runs at once over these links (its channels, before it doubles
    # them): how many SMs its kernels hold while an all-reduce runs (topoprof.model.ddp.gpu_costs)
    rings: int = 1

    def __post_init__(self) -> None:
        _check_positive("link_bandwidth_gbps", self.link_bandwidth_gbps)
        if self.hop_latency_us < 0 or self.base_latency_us < 0:
            raise InputError(f"latencies must be >= 0, got hop_latency_us({self.hop_latency_us}) "
                             f"base_latency_us({self.base_latency_us})")
        if self.world_size < 1:
            raise InputError(f"world_size must be >= 1, got {self.world_size}")
        _check_range("link_bandwidth_gbps", self.link_bandwidth_gbps, self.bandwidth_range_gbps)

    @property
    def bus_bandwidth_gbps(self) -> float:
        return self.link_bandwidth_gbps

    def _latency_s(self, hops: str) -> float:
        steps = _hop_count(hops, self.world_size)
        return (self.base_latency_us + steps * self.hop_latency_us) * US

    def describe(self) -> dict[str, Any]:
        return {"kind": "ring", "link_bandwidth_gbps": self.link_bandwidth_gbps,
                "bandwidth_range_gbps": self.bandwidth_range_gbps,
                "hop_latency_us": self.hop_latency_us, "base_latency_us": self.base_latency_us,
                "world_size": self.world_size, "source": self.source,
                "formula": "allreduce = base + 2(n-1)*hop + 2(n-1)/n * S/B"}

    def bounds(self) -> tuple[RingComm, RingComm] | None:
        if self.bandwidth_range_gbps is None:
            return None
        low, high = self.bandwidth_range_gbps
        return (replace(self, link_bandwidth_gbps=low, bandwidth_range_gbps=None),
                replace(self, link_bandwidth_gbps=high, bandwidth_range_gbps=None))

    def at_shape(self, nodes: int, gpus_per_node: int) -> RingComm:
        return replace(self, world_size=nodes * gpus_per_node)


@dataclass(frozen=True)
class FitComm(CommModel):
    """A measured all-reduce fit t(S) = latency + S/algbw at `world_size` ranks.

    Other collectives and other world sizes follow from the ring model with the bus bandwidth
    B = algbw * 2(n-1)/n and the per-hop latency latency/(2(n-1)) held fixed: nccl-tests defines
    busbw so that it does not depend on n for ring algorithms (doc/PERFORMANCE.md). That is an
    extrapolation from the one measured shape, and `describe()` says so."""

    latency_us: float
    algbw_gbps: float
    world_size: int
    algbw_range_gbps: tuple[float, float] | None = None
    source: str = "bench fit"
    measured_world_size: int | None = None

    def __post_init__(self) -> None:
        _check_positive("algbw_gbps", self.algbw_gbps)
        if self.latency_us < 0:
            raise InputError(f"latency_us must be >= 0, got {self.latency_us}")
        if self.world_size < 1:
            raise InputError(f"world_size must be >= 1, got {self.world_size}")
        if self.measured_world_size is None:
            if self.world_size < 2:
                raise InputError("an all-reduce fit needs world_size >= 2, got 1")
            object.__setattr__(self, "measured_world_size", self.world_size)
        _check_range("algbw_gbps", self.algbw_gbps, self.algbw_range_gbps)

    def _measured(self) -> int:
        m = self.measured_world_size
        assert m is not None  # set by __post_init__
        return m

    def _factor(self) -> float:
        m = self._measured()
        return 2 * (m - 1) / m

    @property
    def bus_bandwidth_gbps(self) -> float:
        return self.algbw_gbps * self._factor()

    def _latency_s(self, hops: str) -> float:
        m = self._measured()
        per_hop_us = self.latency_us / (2 * (m - 1))
        return _hop_count(hops, self.world_size) * per_hop_us * US

    def describe(self) -> dict[str, Any]:
        return {"kind": "fit", "latency_us": self.latency_us, "algbw_gbps": self.algbw_gbps,
                "algbw_range_gbps": self.algbw_range_gbps,
                "bus_bandwidth_gbps": self.bus_bandwidth_gbps,
                "measured_world_size": self.measured_world_size, "world_size": self.world_size,
                "extrapolated": self.world_size != self.measured_world_size,
                "source": self.source, "formula": "allreduce = latency + S/algbw (at the "
                "measured n); other n: busbw and per-hop latency held fixed"}

    def bounds(self) -> tuple[CommModel, CommModel] | None:
        if self.algbw_range_gbps is None:
            return None
        low, high = self.algbw_range_gbps
        return (replace(self, algbw_gbps=low, algbw_range_gbps=None),
                replace(self, algbw_gbps=high, algbw_range_gbps=None))

    def at_shape(self, nodes: int, gpus_per_node: int) -> CommModel:
        return replace(self, world_size=nodes * gpus_per_node)


def curve_s(points: tuple[tuple[float, float], ...], size_bytes: float) -> float | None:
    """A measured curve's time (seconds) at `size_bytes`: interpolated in log-log between the two
    nearest measurements within them, grown at the curve's top slope above them (when noise did
    not invert it); None below them, or from a single point at another size (the caller's fit
    applies then)."""
    pts = points
    if len(pts) == 1 and size_bytes == pts[0][0]:  # a single size measured, asked for exactly
        return pts[0][1] * US
    if len(pts) < 2 or size_bytes < pts[0][0]:
        return None
    if size_bytes > pts[-1][0]:
        (s0, t0), (s1, t1) = pts[-2], pts[-1]
        return (t1 + (size_bytes - s1) * (t1 - t0) / (s1 - s0)) * US if t1 > t0 else None
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if s0 <= size_bytes <= s1:
            if size_bytes == s0 or s1 == s0:
                return t0 * US
            w = (math.log(size_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0))) * US
    return None  # pragma: no cover - the range checks above cover every size


@dataclass(frozen=True)
class MeasuredComm(FitComm):
    """A FitComm that also keeps the measured all-reduce curve: (size_bytes, time_us) points.

    At the measured world size and within the measured sizes, an all-reduce takes the time
    interpolated between the two nearest measurements (linear in log size and log time), so the
    shape of the real curve (protocol switches, TCP windows, cache effects) is kept instead of
    being flattened into two parameters. Above the largest measured size the time grows from the
    largest measurement at the curve's own top slope (the bandwidth between its two largest
    sizes), not the fit's: the fit weighs every size's relative error alike, so on a curve that
    bends late (TCP across nodes) its bandwidth can exceed the plateau the link really reaches.
    Below the measured sizes, and for every other collective and world size, the fit applies.

    `curves` holds other collectives measured the same way, ((name, points), ...) with name
    "all_gather" or "reduce_scatter" and sizes as nccl-tests counts them (the whole buffer: the
    gathered output, the input scattered): at the measured world size they are read like the
    all-reduce curve; elsewhere, and for collectives not measured, the ring model from the fit."""

    points: tuple[tuple[float, float], ...] = ()
    curves: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()

    def _measured_s(self, points, size_bytes: float) -> float | None:
        if self.world_size != self.measured_world_size:
            return None
        return curve_s(points, size_bytes)

    def curve(self, collective: str) -> tuple[tuple[float, float], ...]:
        """The measured points of `collective` (empty when it was not measured)."""
        if collective == "all_reduce":
            return self.points
        return dict(self.curves).get(collective, ())

    def allreduce_s(self, size_bytes: float) -> float:
        measured = self._measured_s(self.points, size_bytes)
        return super().allreduce_s(size_bytes) if measured is None else measured

    def reduce_scatter_s(self, size_bytes: float) -> float:
        measured = self._measured_s(self.curve("reduce_scatter"), size_bytes)
        return super().reduce_scatter_s(size_bytes) if measured is None else measured

    def all_gather_s(self, size_bytes: float) -> float:
        measured = self._measured_s(self.curve("all_gather"), size_bytes)
        return FitComm.all_gather_s(self, size_bytes) if measured is None else measured

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kind": "measured curve + fit", "points": len(self.points),
                "curves": {name: len(pts) for name, pts in self.curves},
                "formula": "allreduce = measured time interpolated in log-log within the measured "
                           "sizes, extended above them at the top slope; latency + S/algbw below them "
                           "and at other n"}


@dataclass(frozen=True)
class SingleGpuComm(CommModel):
    """One GPU: it has no peer, so no collective runs and no link is involved (every
    collective takes 0 s). It has no bus bandwidth; asking for one is an error, not inf."""

    source: str = "one GPU: no link"

    @property
    def world_size(self) -> int:  # type: ignore[override]  # CommModel's field, derived here
        return 1

    @property
    def bus_bandwidth_gbps(self) -> float:
        raise LinkUnknown("one GPU has no link, so no bus bandwidth")

    def _latency_s(self, hops: str) -> float:
        return 0.0

    def describe(self) -> dict[str, Any]:
        return {"kind": "none", "world_size": 1, "source": self.source,
                "formula": "one GPU: no collective, 0 s"}

    def bounds(self) -> tuple[CommModel, CommModel] | None:
        return None

    def at_shape(self, nodes: int, gpus_per_node: int) -> CommModel:
        if nodes * gpus_per_node == 1:
            return self
        raise LinkUnknown(f"{nodes} node(s) x {gpus_per_node} GPU(s): no link is known "
                          "(the input described one GPU)")


@dataclass(frozen=True)
class HierarchicalComm(CommModel):
    """NCCL's ring across nodes: each node's GPUs in a row, then one edge to the next node.

    `intra` is the ring inside a node (world_size = gpus_per_node). `inter.link_bandwidth_gbps`
    is the node's *total* NIC bandwidth per direction, not a per-GPU share: in a ring each node
    boundary is crossed by one edge per channel, NCCL spreads its channels over the node's NICs
    (src/graph/search.cc), and every ring edge carries the same 2(n-1)/n * S. So the node's NICs
    together move 2(n-1)/n * S, like any intra-node edge, and B = min(intra B, node NIC total):
    the slowest level bounds the ring. (A hierarchical reduce-scatter / all-reduce / all-gather
    gives the same bandwidth term: each GPU sends 2(m-1)/m * S/g over a 1/g share of the NICs.)
    Latency follows tuning.cc: 2(m-1) of the 2(n-1) all-reduce steps are network hops.

    With one GPU per node there is no edge inside a node: every ring edge is a network hop,
    B is the node's NICs alone and `intra` may be None (it is ignored if given)."""

    intra: RingComm | None
    inter: RingComm
    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.intra is None and self.gpus_per_node > 1:
            raise LinkUnknown(f"gpus_per_node({self.gpus_per_node}) > 1 needs an intra-node "
                              "link; none was given")
        if self.intra is not None and self.intra.world_size != self.gpus_per_node:
            raise InputError(f"intra.world_size({self.intra.world_size}) != "
                             f"gpus_per_node({self.gpus_per_node})")
        if self.inter.world_size != self.nodes:
            raise InputError(f"inter.world_size({self.inter.world_size}) != nodes({self.nodes})")

    @property
    def world_size(self) -> int:  # type: ignore[override]  # CommModel's field, derived here
        return self.nodes * self.gpus_per_node

    def _used_intra(self) -> RingComm | None:
        """The intra-node ring if the job's ring has edges inside a node (> 1 GPU per node)."""
        return self.intra if self.gpus_per_node > 1 else None

    def _levels(self) -> list[RingComm]:
        intra = self._used_intra()
        return [self.inter] if intra is None else [intra, self.inter]

    @property
    def source(self) -> str:  # type: ignore[override]  # CommModel's field, derived here
        intra = self._used_intra()
        intra_text = "none (one GPU per node)" if intra is None else intra.source
        return f"intra: {intra_text}; inter: {self.inter.source}"

    @property
    def bus_bandwidth_gbps(self) -> float:
        return min(level.link_bandwidth_gbps for level in self._levels())

    def _latency_s(self, hops: str) -> float:
        n, m = self.world_size, self.nodes
        total = _hop_count(hops, n)
        inter = _hop_count(hops, m)
        intra = self._used_intra()
        intra_hop = intra.hop_latency_us if intra is not None else 0.0  # total == inter then
        base = max(level.base_latency_us for level in self._levels())
        us = base + (total - inter) * intra_hop + inter * self.inter.hop_latency_us
        return us * US

    def describe(self) -> dict[str, Any]:
        intra = self._used_intra()
        formula = ("flat ring over all GPUs; B = min(intra link, node NIC total)" if intra is not None
                   else "flat ring, one GPU per node: every edge is a network hop; B = node NIC total")
        return {"kind": "hierarchical", "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "world_size": self.world_size,
                "intra": None if intra is None else intra.describe(),
                "inter": self.inter.describe(), "bus_bandwidth_gbps": self.bus_bandwidth_gbps,
                "formula": formula}

    def bounds(self) -> tuple[CommModel, CommModel] | None:
        intra = self._used_intra()
        intra_b = None if intra is None else intra.bounds()
        inter_b = self.inter.bounds()
        if intra_b is None and inter_b is None:
            return None
        intra_low, intra_high = intra_b or (self.intra, self.intra)
        inter_low, inter_high = inter_b or (self.inter, self.inter)
        return (replace(self, intra=intra_low, inter=inter_low),
                replace(self, intra=intra_high, inter=inter_high))

    def at_shape(self, nodes: int, gpus_per_node: int) -> CommModel:
        if self.intra is None and gpus_per_node > 1:
            raise LinkUnknown(f"{nodes} node(s) x {gpus_per_node} GPUs: no intra-node link is "
                              "known (only the network was given)")
        intra = None if self.intra is None else replace(self.intra, world_size=gpus_per_node)
        if nodes == 1:
            return intra if intra is not None else SingleGpuComm()
        return HierarchicalComm(intra, replace(self.inter, world_size=nodes), nodes, gpus_per_node)
