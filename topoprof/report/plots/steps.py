"""Training-loop charts: step time vs gradient accumulation, and predicted vs measured step time."""
from __future__ import annotations

import math
import statistics

from topoprof.report.plots.base import (
    WIDE,
    finite,
    fmt_num,
    label_log_axis,
    new_figure,
    no_data,
    positive,
    save,
    strategy_style,
)

_SWEEP_TITLE = "Step time and throughput vs gradient accumulation"
_PRED_TITLE = "Predicted vs measured step time"
# `single` runs on one GPU whatever the sweep's world size.
_SINGLE = "single"


def _as_float(value) -> float:
    return float(value) if positive(value) else math.nan


def _series(values, n: int) -> list[float]:
    """Exactly n floats, NaN where the strategy has no figure (matplotlib leaves a gap)."""
    values = list(values or ())[:n]
    return [_as_float(v) for v in values] + [math.nan] * (n - len(values))


def _range_series(ranges, n: int) -> tuple[list[float], list[float]]:
    lows, highs = [], []
    for item in list(ranges or ())[:n] + [None] * max(0, n - len(ranges or ())):
        ok = isinstance(item, (list, tuple)) and len(item) == 2 and positive(item[0]) and positive(item[1])
        lows.append(float(item[0]) if ok else math.nan)
        highs.append(float(item[1]) if ok else math.nan)
    return lows, highs


def world_size_for(name: str, sweep: dict) -> int:
    """Ranks that share one step: 1 for `single`, else the sweep's world_size (1 if absent)."""
    if name == _SINGLE:
        return 1
    ws = sweep.get("world_size")
    return int(ws) if positive(ws) else 1


def throughput(step_s: float, k: int, samples_per_micro_batch: float, world_size: int) -> float:
    """Samples per second: every rank runs K micro-batches per optimizer step."""
    return samples_per_micro_batch * k * world_size / step_s if positive(step_s) else math.nan


def _sweep_data(sweep) -> tuple[list[int], dict[str, list[float]]]:
    if not isinstance(sweep, dict):
        return [], {}
    raw = list(sweep.get("accum") or ())
    keep = [i for i, k in enumerate(raw) if positive(k)]  # indices, so series stay aligned with K
    accum = [int(raw[i]) for i in keep]
    strategies = {str(name): [_series(vals, len(raw))[i] for i in keep]
                  for name, vals in (sweep.get("strategies") or {}).items()}
    return accum, {k: v for k, v in strategies.items() if any(finite(x) for x in v)}


def _draw_strategy(axes, name, accum, times, sweep, seen) -> None:
    time_ax, rate_ax = axes
    style = strategy_style(name, seen)
    ws = world_size_for(name, sweep)
    spmb = sweep.get("samples_per_micro_batch") or 1
    rates = [throughput(t, k, spmb, ws) for t, k in zip(times, accum)]
    line = dict(style, linewidth=1.8, markersize=5, label=name)
    if name == "ddp_no_sync_backward_only":
        line.update(linewidth=2.2, markerfacecolor="none", zorder=4)
    time_ax.plot(accum, times, **line)
    rate_ax.plot(accum, rates, **line)
    lows, highs = _range_series((sweep.get("ranges") or {}).get(name), len(accum))
    if any(finite(v) for v in lows):
        time_ax.fill_between(accum, lows, highs, color=style["color"], alpha=0.15, linewidth=0)
        rate_ax.fill_between(accum, [throughput(h, k, spmb, ws) for h, k in zip(highs, accum)],
                             [throughput(lo, k, spmb, ws) for lo, k in zip(lows, accum)],
                             color=style["color"], alpha=0.15, linewidth=0)


def _accum_axis(ax, accum: list[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator  # lazy: matplotlib, loaded only when a chart is drawn

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(accum))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(accum, [str(k) for k in accum])
    ax.set_xlim(min(accum) / 1.25, max(accum) * 1.25)
    ax.set_xlabel("accumulation K (micro-batches per optimizer step)")
    ax.grid(True, alpha=0.3)


def plot_step_vs_accum(sweep, path, title=None) -> str:
    """Time per optimizer step and samples/s vs K, one line per strategy, shaded spreads."""
    title = title or _SWEEP_TITLE
    accum, strategies = _sweep_data(sweep)
    if not accum or not strategies:
        return no_data(path, title, "no step times in the sweep")
    fig = new_figure(WIDE + 1.5, 4.6)
    axes = fig.subplots(1, 2, gridspec_kw={"wspace": 0.25})
    seen: list[str] = []
    for name, times in strategies.items():
        _draw_strategy(axes, name, accum, times, sweep, seen)
    for ax in axes:
        _accum_axis(ax, accum)
    _style_time_axis(axes[0])
    ws = world_size_for("dp", sweep)
    spmb = sweep.get("samples_per_micro_batch") or 1
    axes[1].set_ylim(bottom=0)
    axes[1].set_ylabel("throughput (samples/s, all ranks)")
    axes[1].set_title(_throughput_title(spmb, ws, sweep, _SINGLE in strategies), fontsize=10)
    note = speedup_note(accum, strategies)
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer).transformed(fig.transFigure.inverted()) for ax in axes]
    # Bottom-anchored just above the panel titles: extra lines grow upwards, never onto them.
    fig.suptitle(title + (f"\n{note}" if note else ""), fontsize=12, va="bottom",
                 y=max(b.y1 for b in boxes) + 0.02)
    handles, labels = axes[0].get_legend_handles_labels()
    # Centred under both panels: one legend serves the two.
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, min(b.y0 for b in boxes) - 0.01),
               ncol=min(len(labels), 3), fontsize=9, frameon=False)
    return save(fig, path)


def _throughput_title(spmb, ws: int, sweep: dict, has_single: bool) -> str:
    ranks = f"{ws} rank{'s' if ws > 1 else ''}"
    if not positive(sweep.get("world_size")):
        ranks += " (world_size not given)"
    elif has_single and ws > 1:
        ranks += " (single: 1)"
    return f"throughput\n{fmt_num(spmb)} samples \u00d7 K \u00d7 {ranks} / step time"


def speedup_note(accum: list[int], strategies: dict[str, list[float]]) -> str:
    """ddp_no_sync's gain over ddp_synced at the largest K both ran: the sweep's headline."""
    fast, slow = strategies.get("ddp_no_sync"), strategies.get("ddp_synced")
    both = [i for i in range(len(accum)) if fast and slow and finite(fast[i]) and finite(slow[i])]
    if not both or not fast or not slow:
        return ""
    i = both[-1]
    return f"at K = {accum[i]}, ddp_no_sync steps {slow[i] / fast[i]:.2f}\u00d7 faster than ddp_synced"


def _style_time_axis(ax) -> None:
    """Log y: step time grows ~linearly with K, and ratios between strategies stay readable."""
    ax.set_yscale("log")
    label_log_axis(ax.yaxis, *ax.get_ylim())
    ax.set_ylabel("time per optimizer step (s, log scale)")
    ax.set_title("time per optimizer step\n(shaded: spread over steps)", fontsize=10)


# ---------------------------------------------------------------------------------------------
# Predicted vs measured


def _usable_cases(cases) -> list[dict]:
    return [c for c in cases or () if positive(c.get("predicted_step_s")) and positive(c.get("measured_step_s"))]


def relative_error(case: dict) -> float:
    """The case's own error where validate matched each rotation's prediction with that
    rotation's step (`error_pct`, the figure the report prints); else (predicted - measured) /
    measured of the two steps."""
    if case.get("error_pct") is not None:
        return case["error_pct"] / 100.0
    return case["predicted_step_s"] / case["measured_step_s"] - 1.0


def _bands(ax, lo: float, hi: float) -> None:
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", linewidth=1.2, label="y = x (exact)")
    ax.fill_between(xs, [x * 0.8 for x in xs], [x * 1.2 for x in xs], color="#bbbbbb", alpha=0.35,
                    linewidth=0, label="\u00b120 %")
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="#888888", alpha=0.35,
                    linewidth=0, label="\u00b110 %")


_LABEL_PT = 7.0


def _text_box(x: float, y: float, dx: float, dy: float, text: str, px_per_pt: float):
    """Approximate display box (x0, y0, x1, y1) of a label anchored at offset (dx, dy) points."""
    w, h = len(text) * _LABEL_PT * 0.6 * px_per_pt, _LABEL_PT * 1.3 * px_per_pt
    left = x + dx * px_per_pt - (w if dx < 0 else 0)
    bottom = y + dy * px_per_pt - (0 if dy > 0 else h)
    return left, bottom, left + w, bottom + h


def _overlaps(box, boxes) -> bool:
    return any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in boxes)


def _inside(box, frame) -> bool:
    return frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1


def _label_spot(x, y, above: bool, text: str, placed, frame, px_per_pt: float):
    """(dx, dy, box) for a label: away from the y = x line first, then the other sides, each
    further out until it sits inside the axes without covering a point or a placed label."""
    sx, sy = (-1, 1) if above else (1, -1)
    fallback = None
    for d in (4, 10, 16, 24, 32, 44):
        for dx, dy in ((sx * d, sy * d), (-sx * d, sy * d), (sx * d, -sy * d), (-sx * d, -sy * d)):
            box = _text_box(x, y, dx, dy, text, px_per_pt)
            if not _inside(box, frame):
                continue
            if not _overlaps(box, placed):
                return dx, dy, box
            fallback = fallback or (dx, dy, box)
    return fallback or (sx * 4, sy * 4, _text_box(x, y, sx * 4, sy * 4, text, px_per_pt))


def _label_points(fig, ax, cases: list[dict]) -> None:
    """Case labels beside their points without covering each other. Skipped for crowded charts."""
    if len(cases) > 20:
        return
    px_per_pt = fig.dpi / 72
    points = [(c["measured_step_s"], c["predicted_step_s"]) for c in cases]
    r = 4 * px_per_pt  # markers are ~7 pt across: keep labels off every one of them
    placed = [(x - r, y - r, x + r, y + r) for x, y in ax.transData.transform(points)]
    for c in sorted(cases, key=lambda c: c["measured_step_s"]):
        point = (c["measured_step_s"], c["predicted_step_s"])
        x, y = ax.transData.transform(point)
        text = str(c.get("label", ""))
        dx, dy, box = _label_spot(x, y, point[1] >= point[0], text, placed, ax.bbox, px_per_pt)
        placed.append(box)
        far = max(abs(dx), abs(dy)) > 10
        ax.annotate(text, point, xytext=(dx, dy), textcoords="offset points",
                    ha="right" if dx < 0 else "left", va="bottom" if dy > 0 else "top",
                    fontsize=_LABEL_PT, color="#333333",
                    arrowprops={"arrowstyle": "-", "color": "#999999", "linewidth": 0.6} if far else None)


def plot_pred_vs_measured(cases, path) -> str:
    """Scatter of measured (x) vs predicted (y) step time on log-log axes, coloured by mode."""
    usable = _usable_cases(cases)
    if not usable:
        return no_data(path, _PRED_TITLE, "no case has both a predicted and a measured step time")
    values = [c[k] for c in usable for k in ("predicted_step_s", "measured_step_s")]
    lo, hi = min(values) / 1.6, max(values) * 1.6
    fig = new_figure(WIDE, 6.4)
    ax = fig.add_subplot()
    _bands(ax, lo, hi)
    seen: list[str] = []
    for mode in dict.fromkeys(str(c.get("mode", "?")) for c in usable):
        group = [c for c in usable if str(c.get("mode", "?")) == mode]
        style = strategy_style(mode, seen)
        ax.scatter([c["measured_step_s"] for c in group], [c["predicted_step_s"] for c in group],
                   color=style["color"], marker=style["marker"], s=46, zorder=3, label=mode,
                   edgecolors="white" if style["marker"] != "x" else None, linewidths=0.6)
    _pred_axes(ax, lo, hi)
    _label_points(fig, ax, usable)
    ax.set_title(_pred_title(usable, len(list(cases or ())) - len(usable)), fontsize=11)
    # Outside on the right: the square plot keeps every corner for points and labels.
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=9, frameon=False)
    return save(fig, path)


def _pred_title(usable: list[dict], skipped: int) -> str:
    errors = [abs(relative_error(c)) for c in usable]
    within = sum(e <= 0.1 for e in errors)
    return (f"{_PRED_TITLE}\nmedian |error| {statistics.median(errors) * 100:.1f} %, "
            f"{within}/{len(usable)} within \u00b110 %"
            + (f" ({skipped} case{'s' if skipped > 1 else ''} without a measurement)" if skipped else ""))


def _pred_axes(ax, lo: float, hi: float) -> None:
    for axis, setter in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        setter("log")
        label_log_axis(axis, lo, hi, max_ticks=8)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured step time (s, log scale)")
    ax.set_ylabel("predicted step time (s, log scale)")
    ax.grid(True, which="major", alpha=0.3)
