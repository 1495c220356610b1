"""Latency/bandwidth fit t(S) = alpha + S / beta for each collective.

S is the nccl-tests `size` column (BenchRow.size_bytes): the same bytes nccl-tests divides by
time to get algbw (`algbw = S/t`, doc/PERFORMANCE.md; the gathered output for all_gather, the
full input for reduce_scatter, nranks x chunk for all_to_all). So beta is the asymptotic
*algorithm* bandwidth; bus_bandwidth_gbps() converts it with the collective's busbw factor.
As PERFORMANCE.md puts it, "the time becomes linear with the size (since it is roughly equal to
overhead + size / bw)": alpha is that overhead.

Sizes span 8 B .. 1 GiB (eight decades), so ordinary least squares on t is decided by the
largest sizes alone and alpha comes out as noise, often negative. Instead the fit minimises
the *relative* error sum(((t_i - alpha - S_i/beta) / t_i)^2): weighted least squares with
weights 1/t_i^2, which has a closed form for the two parameters.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from topoprof.errors import InputError
from topoprof.specs.collective_spec import BenchRow, get_collective

# A row is an outlier when |measured/predicted - 1| > OUTLIER_THRESHOLD: 0.5 flags sizes 50 %
# slower (or faster) than the fitted line, well beyond run-to-run noise of a few percent.
OUTLIER_THRESHOLD = 0.5

# A size term below this fraction of the largest time is rounding noise, not a bandwidth.
_NEGLIGIBLE = 1e-9

# GB/s -> bytes per microsecond: 1e9 B/s = 1e3 B/us.
_BYTES_PER_US_PER_GBPS = 1e3


@dataclass(frozen=True)
class Fit:
    """t(S) = latency_us + S / bandwidth_gbps, with S in bytes and t in microseconds.

    bandwidth_gbps is algorithm bandwidth (S/t as nccl-tests defines it); math.inf when the
    times do not grow with size (only latency-bound sizes were measured).
    r2: 1 - SS_res/SS_tot on relative residuals, where SS_res = sum(((t_i - fit_i)/t_i)^2) and
    SS_tot = sum(((t_i - c)/t_i)^2) with c = sum(1/t_i)/sum(1/t_i^2), the best constant under
    the same relative-error weighting. 1.0 is a perfect fit; 0 is no better than a constant.
    max_rel_error: max |t_i - fit_i| / t_i over the fitted rows.
    outliers: (size_bytes, measured/predicted) for rows off by more than the threshold.
    latency_clamped: the unconstrained fit gave alpha < 0, so alpha was set to 0 and beta refit.
    """

    collective: str
    latency_us: float
    bandwidth_gbps: float
    r2: float
    max_rel_error: float
    n_points: int
    outliers: tuple[tuple[int, float], ...] = ()
    latency_clamped: bool = False

    def to_dict(self) -> dict:
        """JSON-safe dict (an infinite bandwidth becomes None)."""
        d = asdict(self)
        d["bandwidth_gbps"] = None if math.isinf(self.bandwidth_gbps) else self.bandwidth_gbps
        d["outliers"] = [list(o) for o in self.outliers]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Fit":
        bw = d.get("bandwidth_gbps")
        return cls(
            collective=d["collective"],
            latency_us=float(d["latency_us"]),
            bandwidth_gbps=math.inf if bw is None else float(bw),
            r2=float(d["r2"]),
            max_rel_error=float(d["max_rel_error"]),
            n_points=int(d["n_points"]),
            outliers=tuple((int(s), float(r)) for s, r in d.get("outliers", ())),
            latency_clamped=bool(d.get("latency_clamped", False)),
        )


@dataclass(frozen=True)
class FitLine:
    """A `Fit` as a report holds it and a renderer reads it: t = latency + S / bandwidth; no
    bandwidth where the times did not grow with the size (the JSON's null for an infinite one)."""

    latency_us: float
    bandwidth_gbps: float | None
    busbw_gbps: float | None = None  # the bandwidth as bus bandwidth (the collective's factor), where written
    r2: float | None = None  # the fit's R², where written


def _usable(rows: Sequence[BenchRow]) -> list[tuple[float, float]]:
    """(S, t) pairs: rows with data errors, zero size (aligned away) or no finite time are dropped."""
    return [
        (float(r.size_bytes), float(r.time_us))
        for r in rows
        if (r.wrong is None or r.wrong == 0) and r.size_bytes > 0 and 0 < r.time_us < math.inf
    ]


def _wls(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha, slope) minimising sum(((t - alpha - slope*S)/t)^2), in centred form for stability."""
    t_min = min(t for _, t in points)
    w = [(t_min / t) ** 2 for _, t in points]  # 1/t^2 scaled to <= 1: same solution, no overflow
    sw = sum(w)
    s_mean = sum(wi * s for wi, (s, _) in zip(w, points)) / sw
    t_mean = sum(wi * t for wi, (_, t) in zip(w, points)) / sw
    sxx = sum(wi * (s - s_mean) ** 2 for wi, (s, _) in zip(w, points))
    sxy = sum(wi * (s - s_mean) * (t - t_mean) for wi, (s, t) in zip(w, points))
    if not sxx > 0:  # every weight but one underflowed: no slope can be measured
        return _latency_only(points), 0.0
    slope = sxy / sxx
    return t_mean - slope * s_mean, slope


def _slope_through_origin(points: list[tuple[float, float]]) -> float:
    """slope minimising sum(((t - slope*S)/t)^2) = sum((1 - slope*S/t)^2)."""
    ratios = [s / t for s, t in points]
    top = max(ratios)  # scaled to <= 1 so the squares cannot overflow
    return sum(r / top for r in ratios) / sum((r / top) * (r / top) for r in ratios) / top


def _latency_only(points: list[tuple[float, float]]) -> float:
    """c minimising sum(((t - c)/t)^2): sum(1/t) / sum(1/t^2)."""
    t_min = min(t for _, t in points)
    return t_min * sum(t_min / t for _, t in points) / sum((t_min / t) ** 2 for _, t in points)


def _solve(points: list[tuple[float, float]]) -> tuple[float, float, bool]:
    """(alpha_us, slope_us_per_byte, clamped) with alpha >= 0 and slope >= 0."""
    alpha, slope = _wls(points)
    clamped = False
    if alpha < 0:
        alpha, slope, clamped = 0.0, _slope_through_origin(points), True
    s_max = max(s for s, _ in points)
    if slope * s_max <= _NEGLIGIBLE * max(t for _, t in points):
        # Times do not grow with size: only the latency is measurable.
        alpha, slope, clamped = _latency_only(points), 0.0, False
    return alpha, slope, clamped


def predict_time_us(fit: Fit, size_bytes: float) -> float:
    """alpha + S/beta in microseconds."""
    if math.isinf(fit.bandwidth_gbps):
        return fit.latency_us
    return fit.latency_us + size_bytes / (fit.bandwidth_gbps * _BYTES_PER_US_PER_GBPS)


def bus_bandwidth_gbps(fit: Fit, nranks: int) -> float:
    """The fitted algorithm bandwidth scaled by nccl-tests' busbw factor for `nranks`."""
    return fit.bandwidth_gbps * get_collective(fit.collective).busbw_factor(nranks)


def _quality(points, alpha: float, slope: float) -> tuple[float, float]:
    rel = [(t - (alpha + slope * s)) / t for s, t in points]
    c = _latency_only(points)
    ss_tot = sum(((t - c) / t) ** 2 for _, t in points)
    ss_res = sum(r * r for r in rel)
    if ss_tot < _NEGLIGIBLE**2:  # constant times: a constant fits them perfectly
        r2 = 1.0 if ss_res < _NEGLIGIBLE**2 else 0.0
    else:
        r2 = 1.0 - ss_res / ss_tot
    return r2, max(abs(r) for r in rel)


def _select(rows: Sequence[BenchRow], collective: str | None) -> tuple[str, list[BenchRow]]:
    if collective is not None:
        return collective, [r for r in rows if r.collective == collective]
    names = sorted({r.collective for r in rows})
    if len(names) > 1:
        raise InputError(f"rows mix collectives {', '.join(names)}: pass collective= or use fit_all()")
    return (names[0] if names else ""), list(rows)


def fit_rows(
    rows: Sequence[BenchRow],
    collective: str | None = None,
    outlier_threshold: float = OUTLIER_THRESHOLD,
) -> Fit | None:
    """Fit one collective's rows; None when fewer than 2 distinct sizes are usable (or the
    times are too extreme for floating point).

    Rows with wrong > 0 (data errors), size 0 or time <= 0 are ignored. Outliers are reported,
    not removed: a protocol switch or a congested size is information, not noise to hide.
    """
    name, chosen = _select(rows, collective)
    points = _usable(chosen)
    if len({s for s, _ in points}) < 2:
        return None
    alpha, slope, clamped = _solve(points)
    if not (math.isfinite(alpha) and math.isfinite(slope)):
        return None  # times so extreme (~1e150 us and beyond) that the sums overflow
    r2, max_rel = _quality(points, alpha, slope)
    bandwidth = math.inf if slope == 0 else 1.0 / (slope * _BYTES_PER_US_PER_GBPS)
    outliers = []
    for s, t in points:
        predicted = alpha + slope * s
        ratio = t / predicted if predicted > 0 else math.inf
        if abs(ratio - 1.0) > outlier_threshold:
            outliers.append((int(s), ratio))
    return Fit(
        collective=name,
        latency_us=alpha,
        bandwidth_gbps=bandwidth,
        r2=r2,
        max_rel_error=max_rel,
        n_points=len(points),
        outliers=tuple(outliers),
        latency_clamped=clamped,
    )


def fit_all(rows: Sequence[BenchRow], outlier_threshold: float = OUTLIER_THRESHOLD) -> dict[str, Fit]:
    """One Fit per collective present in `rows` (collectives with too few sizes are left out)."""
    fits = {}
    for name in sorted({r.collective for r in rows}):
        fit = fit_rows(rows, name, outlier_threshold)
        if fit is not None:
            fits[name] = fit
    return fits
