"""An op trace priced from a device profile (`topoprof.model.compute.profile`): each op's device
time from the rate the profile measured for its kind and size, as measured on the profiled GPU
or as a range on another (`profile_scale.ScaledProfile`: every rate times the datasheet ratios
that could bind it), and its host time by kind (`host_costs`). The composition is the roofline's
(`topoprof.model.compute.roofline.price`). No torch here.

- A GEMM (`op_kinds.gemm_products`): its FLOPs over the profile's FLOP/s at its m, n, k (a
  batched product, or a grouped convolution, at m x batch: the same tiles, each the same k deep),
  read from the measured shapes (`profile_interp`: exact where measured, a power law between
  neighbours, clamped at the edges). The measured rate is the whole kernel's, its memory traffic
  included. Two corrections, each where the reading does not carry it already:
  - below the smallest measured shape (on any axis) the rate is clamped to the edge's (the
    query with each such axis raised to the smallest measured); where both fill less than a wave of tiles (latency and
    occupancy, not FLOPs, bound them) the smaller kernel runs between that rate (the fast end) and the edge's time
    (the slow end);
  - tile and wave quantization (NVIDIA, "Matrix Multiplication Background User's Guide": ceil(M/T_m)
    x ceil(N/T_n) tiles run in waves of one per SM): a measured shape's rate carries its own, but a
    reading between shapes carries the interpolated quantization of the shapes it was read from,
    not that of its own tiles and waves. So the rate is taken per filled tile: the reading times
    Q(shape) / Q interpolated over those shapes (the same weights, `Grid`), on the target's SMs for
    the shape and the profiled GPU's for the measured ones; the fast end takes the ratio where it
    is above 1, the slow end where it is below. It applies where the interpolation does not carry
    it already and where it holds: on a measured shape of the same GPU the ratio is 1 (the
    measurement is its own quantization); below one wave of tiles cuBLAS splits K or takes smaller
    tiles, and the rate's rise with the shape, which the power law between measured neighbours
    follows, is the partial occupancy; a reading blended from far shapes or clamped at an edge
    says nothing of the query's waves, so none is applied there.
- Fused attention (`op_kinds.attention`): its FLOPs in the profile's count (the trace's, halved
  when causal) over the profile's rate at its sequence and head dim.
- An op with FLOPs that none of these reads (a scaled mm, flex or another attention kernel): its
  FLOPs at the rate of a square GEMM of as many, or its bytes' time where that is longer.
- Memory-bound ops: bytes read + written over the profile's rate for its kind at that many bytes
  (below the smallest measured size: between its rate and its time, as a GEMM); a fused kernel
  (`fusion`) at the fastest of its ops' kinds at the fast end, the slowest at the slow end.
- A reading blended from measured points around it rather than interpolated inside a measured
  box (`profile_interp`: a scattered set, such as shared/gpu-facts' shapes) is as uncertain as
  those points disagree: its range is widened by their spread (x/ e^spread).
- On a CPU the op runs on the calling thread, and a profile point's time per call holds the
  host's cost of making the call; the composition adds that by the op's kind (`host_costs`), so
  the device time is the reading less a plain op's host cost.
- A CPU's first touch of fresh pages (the profile's `cpu` section) adds to an op writing outputs
  of at least its size, as `probes/device_profile/device_costs.py` measured it.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from topoprof.model.compute import op_kinds
from topoprof.model.compute.host_costs import HostCosts, compiled_host_seconds, eager_host_seconds, selective_cost
from topoprof.model.compute.modelled import OptimizerRates
from topoprof.model.compute.profile import DeviceProfile
from topoprof.model.compute.profile_interp import Grid
from topoprof.model.compute.profile_scale import Ratios, ScaledProfile
from topoprof.model.compute.roofline_terms import GEMM_TILE, quantization
from topoprof.specs.traced_pass import ParamEntry, TracedOp, TracedPass


@dataclass(frozen=True)
class ProfiledDevice:
    """A device priced from a profile, as measured (`ratios` None) or scaled to another GPU."""

    name: str
    profile: DeviceProfile
    host: HostCosts
    asynchronous: bool
    choice: str                        # which profile, and by which rule
    ratios: Ratios | None = None
    compiled: bool = False
    profile_sms: int | None = None
    target_sms: int | None = None
    tile: tuple[int, int] = GEMM_TILE
    notes: tuple[str, ...] = ()
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- rates, as ranges ---------------------------------------------------------------------

    def _scaled(self) -> ScaledProfile | None:
        return None if self.ratios is None else ScaledProfile(self.profile, self.ratios)

    def _range(self, what: str, *key) -> tuple[float, float]:
        """The rate `what` (a profile lookup) at `key` as (low, high): scaled where the profile is
        another GPU's, and widened by a blended reading's spread (module docstring)."""
        memo = self._memo.setdefault(what, {})
        if key not in memo:
            read = getattr(self.profile, what)(*key)
            scaled = self._scaled()
            low, high = (read.value, read.value) if scaled is None else _pair(getattr(scaled, what)(*key))
            self._memo.setdefault("reads", Counter())[_how(read.basis)] += 1
            memo[key] = (low * math.exp(-read.spread), high * math.exp(read.spread))
        return memo[key]

    def _gemm_points(self, m: int, n: int, k: int):
        return self.profile.gemm_points_read(m, n, k)

    def _tiles(self, m: int, n: int, batch: int = 1) -> int:
        return math.ceil(m / self.tile[0]) * math.ceil(n / self.tile[1]) * batch

    def _quantization_ratio(self, p: op_kinds.Product, how: str) -> float:
        """Q of the product on the target over Q interpolated over the measured shapes it was read
        from (module docstring): for a reading at or between measured shapes (not blended from
        far ones, nor clamped) of a product that fills a wave; 1 otherwise, or without SM counts."""
        if (self.profile_sms is None or self.target_sms is None or how not in ("measured", "interpolated")
                or self._tiles(p.m, p.n, p.batch) < self.target_sms):
            return 1.0
        m = p.m * p.batch
        points = self._gemm_points(m, p.n, p.k)
        grids = self._memo.setdefault("quantization", {})
        key = tuple(sorted((pt.m, pt.n, pt.k) for pt in points))
        if key not in grids:
            grids[key] = Grid(("m", "n", "k"), [((pt.m, pt.n, pt.k), quantization(pt.m, pt.n, 1, self.profile_sms,
                                                                                  self.tile)) for pt in points])
        return quantization(p.m, p.n, p.batch, self.target_sms, self.tile) / grids[key].read(m, p.n, p.k).value

    def _floor(self, p: op_kinds.Product) -> float:
        """Below the smallest measured shape, a product that fills less than a wave (as that shape
        does) takes between the shape's rate and its time: the slow end's share of the rate,
        its FLOPs over the shape's; 1 elsewhere (module docstring)."""
        m = p.m * p.batch
        query = (m, p.n, p.k)
        # the query raised to the smallest measured size on each axis it is below
        edge = tuple(max(q, smallest) for q, smallest in zip(query, self.profile.gemm_smallest_read(m, p.n, p.k)))
        sms = self.target_sms or 0
        if query == edge or self._tiles(p.m, p.n, p.batch) >= sms or self._tiles(edge[0], edge[1]) >= sms:
            return 1.0
        return math.prod(query) / math.prod(edge)

    def _gemm_s(self, p: op_kinds.Product, end: str) -> float:
        """A product's seconds at `end`, read once per product: a model's blocks repeat the same
        products, and each reading interpolates over the profile's grid."""
        memo = self._memo.setdefault("gemm_s", {})
        if (p, end) not in memo:
            memo[(p, end)] = self._gemm_s_read(p, end)
        return memo[(p, end)]

    def _gemm_s_read(self, p: op_kinds.Product, end: str) -> float:
        m = p.m * p.batch
        low, high = self._range("gemm_flops_per_s", m, p.n, p.k)
        q = self._quantization_ratio(p, _how(self.profile.gemm_flops_per_s(m, p.n, p.k).basis))
        fast = p.flops / (high * max(1.0, q))
        slow = p.flops / (low * min(1.0, q) * self._floor(p))
        return _end(fast, slow, end)

    def _memory_s(self, op: TracedOp, end: str) -> float:
        moved = op.bytes_read + op.bytes_written
        if moved <= 0:
            return 0.0
        kinds = op.fused_kinds or [op_kinds.memory_kind(op)]
        rates = [self._range("memory_bytes_per_s", kind, moved) for kind in kinds]
        floor = min(1.0, moved / (self.profile.smallest_copy_bytes or moved))
        return _end(moved / max(hi for _, hi in rates), moved / (min(lo for lo, _ in rates) * floor), end)

    # ---- the pricer ---------------------------------------------------------------------------

    def device_seconds(self, op: TracedOp, end: str) -> tuple[float, str]:
        products = op_kinds.gemm_products(op)
        attention = None if products else op_kinds.attention(op)
        if products:
            t, kind = sum(self._gemm_s(p, end) for p in products), "matmul"
        elif attention is not None:
            low, high = self._range("sdpa_flops_per_s", attention.seq, attention.head_dim, attention.causal)
            t, kind = _end(attention.flops / high, attention.flops / low, end), "attention"
        elif op.flops > 0:  # FLOPs in an op no kind reads (a scaled mm, flex attention): at a GEMM's rate
            t, kind = max(self._gemm_s(_square_product(op.flops), end), self._memory_s(op, end)), "matmul"
        else:
            t, kind = self._memory_s(op, end), "memory"
        if not self.asynchronous:  # a CPU's point timed the call, its host cost in it: priced apart by kind
            t = max(0.0, t - self.host.kinds["op"].at(end, fast_is_high=False))
        pages = self.profile.cpu
        if pages is not None and pages.fresh_page_s_per_byte and not op.inplace:
            t += sum(b for b in op.outputs or () if b >= pages.fresh_page_min_bytes) * pages.fresh_page_s_per_byte
        return t, kind

    def optimizer_rates(self, params: list[ParamEntry] | None) -> OptimizerRates | None:
        """The optimizer step's figures from the profile, for `timing` to price a what-if's step:
        its rate over the optimizer's bytes (scaled by bandwidth to another GPU) and its host cost
        per parameter tensor (`params`: the trace's parameter list); None where the profile has no
        optimizer rate or the trace no parameters."""
        trainable = [p for p in params or () if p.requires_grad]
        read = self.profile.optimizer_bytes_per_s()
        if read is None or not trainable:
            return None
        scaled = self._scaled()
        rate = (read.value, read.value) if scaled is None else _pair(scaled.optimizer_bytes_per_s())
        host = self.host.get("optimizer_per_tensor")
        return OptimizerRates(len(trainable), rate, (host.low, host.high) if host else (0.0, 0.0),
                              f"{read.basis}; host per tensor " + (f"{host.text(1e6, ' us')}: {host.basis}" if host else
                                                                  "not in the profile: 0"))

    def host_seconds(self, trace: TracedPass, end: str) -> list[float]:
        return (compiled_host_seconds if self.compiled else eager_host_seconds)(trace, self.host, end)

    def trace_lines(self, trace: TracedPass) -> tuple[str, ...]:
        """What this trace adds to the basis: selective op checkpointing's host cost, eager."""
        selective = None if self.compiled else selective_cost(trace, self.host)
        return () if selective is None else (selective.line(),)

    def basis_lines(self) -> tuple[str, ...]:
        p, r = self.profile, self.ratios
        scaled = ("its rates as measured (the GPU priced is the one profiled)" if r is None else
                  f"scaled by {r.basis}: GEMM {_times(r.peak, r.peak / r.sms, r.bandwidth)} (peak, peak per SM, "
                  f"bandwidth), attention {_times(r.peak, r.peak / r.sms)} (peak, peak per SM), memory-bound "
                  f"{_times(r.bandwidth, r.bandwidth / r.sms)} (bandwidth, bandwidth per SM): a rate bound by "
                  "whichever of them binds it (topoprof.model.compute.profile_scale); the same class of host CPU "
                  "assumed")
        reads = self._memo.get("reads") or Counter()
        quant = (f"{self.tile[0]}x{self.tile[1]} tiles over {self.target_sms} SMs, profiled on {self.profile_sms}; "
                 "NVIDIA's Matrix Multiplication Background guide" if self.profile_sms and self.target_sms else
                 "no SM count: not applied")
        return (f"device profile: {p.citation}; {self.choice}", scaled,
                f"GEMM: FLOPs over the profile's FLOP/s at each product's m, n, k (a batched one at m x batch), "
                f"interpolated in log space between measured shapes, clamped at their edges (below the smallest: "
                f"between its rate and its time); x the shape's own tile and wave quantization over the measured "
                f"shapes' ({quant})",
                "attention: FLOPs as the profile counts them (the trace's, halved when causal) over its SDPA rate at "
                "the op's sequence and head dim (forward and backward at the one forward + backward rate)",
                "memory-bound: bytes read + written over the profile's rate for the op's kind at that size",
                "rates read: " + (", ".join(f"{n} {how}" for how, n in sorted(reads.items())) or "none"),
                *self.host.lines(),
                *(["torch.compile: chains of memory-bound ops fused (topoprof.model.compute.fusion); a launch per "
                   f"kernel {self.host.compiled_kernel.text(1e6, ' us')} ({self.host.compiled_kernel.basis}), a call "
                   "per graph"] if self.compiled else []))


def _square_product(flops: float) -> op_kinds.Product:
    """A square GEMM of `flops` (2 n^3 of them): how an op whose FLOPs no kind reads is priced."""
    side = max(1, round((flops / 2) ** (1 / 3)))
    return op_kinds.Product(side, side, side, 1, flops)


def _times(*ratios: float) -> str:
    lo, hi = min(ratios), max(ratios)
    return f"x{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"x{lo:.3g}-{hi:.3g}"


def _pair(rate) -> tuple[float, float]:
    return rate.low, rate.high


def _end(fast: float, slow: float, end: str) -> float:
    return fast if end == "fast" else slow if end == "slow" else math.sqrt(fast * slow)


def _how(basis: str) -> str:
    """How a rate was read, in one word, from its basis (`profile_interp`)."""
    if "clamped" in basis:
        return "clamped at an edge"
    if "blend" in basis:
        return "blended from the nearest"
    if "interpolated" in basis:
        return "interpolated"
    return "measured"
