"""Text rendering of bench results in nccl-tests' layout, plus the footer, fit and flags."""
from __future__ import annotations

from typing import Sequence

from topoprof.measure.bench import CopiesReport
from topoprof.measure.spread import slow_ranks
from topoprof.specs.collective_spec import get_collective

HEADER = (
    "#       size         count      type       time     algbw     busbw  #wrong\n"
    "#        (B)    (elements)                 (us)    (GB/s)    (GB/s)"
)


def _gbps(value: float | None) -> str:
    return f"{value:8.2f}" if value is not None else f"{'N/A':>8}"


def format_row(row) -> str:
    wrong = "N/A" if row.wrong is None else str(row.wrong)
    return (f"{row.size_bytes:12d}  {row.count:12d}  {row.dtype:>8}  {row.time_us:9.1f}  "
            f"{_gbps(row.algbw_gbps)}  {_gbps(row.busbw_gbps)}  {wrong:>6}")


def footer(rows: Sequence) -> list[str]:
    """nccl-tests' '# Avg bus bandwidth' plus the peak and where it is reached."""
    if rows and all(r.busbw_gbps is None for r in rows):
        return ["# No bandwidth: one rank moves nothing between GPUs"]
    good = [r for r in rows if not r.wrong and r.busbw_gbps is not None]
    if not good:
        return ["# no correct rows"]
    avg = sum(r.busbw_gbps for r in good) / len(good)
    peak = max(good, key=lambda r: r.busbw_gbps)
    bad = sum(1 for r in rows if r.wrong)
    lines = [f"# Avg bus bandwidth    : {avg:.4f} GB/s",
             f"# Peak bus bandwidth   : {peak.busbw_gbps:.4f} GB/s at {peak.size_bytes} B"]
    if bad:
        lines.append(f"# Rows with wrong results: {bad} (their bandwidth is not trusted)")
    return lines


def fit_lines(fits: dict, nranks: int) -> list[str]:
    lines = []
    for name, fit in fits.items():
        if fit is None:
            continue
        bus = fit.bandwidth_gbps * get_collective(name).busbw_factor(nranks)
        lines.append(f"# Fit {name}: t(S) = {fit.latency_us:.1f} us + S / {fit.bandwidth_gbps:.3f} GB/s "
                     f"(busbw {bus:.3f} GB/s), r2 {fit.r2:.3f} over {fit.n_points} sizes")
        for size, ratio in fit.outliers:
            lines.append(f"#   off the fit: {size} B took {ratio:.2f}x the fitted time")
    return lines


def spread_lines(flags: Sequence) -> list[str]:
    return [f"# Slow rank: rank {f.rank} took {f.median_excess_pct:+.0f}% over the median on "
            f"{f.slower_sizes}/{f.sizes} {f.collective} sizes" for f in flags]


def copy_lines(copies: CopiesReport) -> list[str]:
    """Copy bandwidth: host<->device per GPU and the GPU x GPU matrix."""
    if copies.status != "ok":
        return [f"# copies: skipped: {copies.detail}"]
    ms = copies.measurements
    lines = [f"# copies ({copies.size_bytes} B, {copies.iters} iterations, GB/s)"]
    for m in ms:
        if m.kind in ("h2d", "d2h"):
            lines.append(f"#   {m.kind} {m.src} -> {m.dst}: {m.bandwidth_gbps:.1f}")
    d2d = [m for m in ms if m.kind == "d2d"]
    devs = sorted({m.src for m in d2d})
    if devs:
        lines.append("#   GPU->GPU " + " ".join(f"{d:>9}" for d in devs))
        for a in devs:
            cells = []
            for b in devs:
                m = next(x for x in d2d if x.src == a and x.dst == b)
                mark = "" if m.p2p in (True, None) else "*"
                cells.append(f"{m.bandwidth_gbps:8.1f}{mark or ' '}")
            lines.append(f"#   {a:>8} " + " ".join(cells))
        lines.append("#   (* = no peer access: staged through host memory)")
    return lines


def summary_lines(result) -> list[str]:
    """What follows the rows of a live run: nccl-tests' footer per collective, the fits, slow
    ranks, stopped sweeps, NCCL's transports, and the one-rank note."""
    out = []
    by_coll: dict[tuple, list] = {}
    for row in result.rows:
        by_coll.setdefault((row.collective, row.level, row.group), []).append(row)
    for (name, level, group), rows in by_coll.items():
        out.append(f"# {name}" + ("" if level == "job" else f" ({level} {group})".replace(" )", ")")))
        out += footer(rows)
    out += fit_lines(result.fits(), result.world_size())
    out += spread_lines(slow_ranks(result.rows))
    out += [f"# {stop.collective}: {stop.reason}" for stop in result.stopped]
    out += [f"# NCCL: {line}" for line in result.nccl_explained]
    if result.world_size() == 1:
        out.append("# One rank: nothing crosses a link, so no bandwidth is given (N/A); "
                   "these rows time the collective's local overhead only.")
    return out


def imported_lines(result) -> list[str]:
    """The rows of an imported nccl-tests log, in nccl-tests' columns."""
    meta = result.metadata
    out = [f"# topoprof bench: {meta['source']}, {meta['world_size'] or '?'} rank(s)"]
    current = None
    for row in result.rows:
        if row.collective != current:
            current = row.collective
            out.append(f"#\n# {current}\n{HEADER}")
        out.append(format_row(row))
    return out
