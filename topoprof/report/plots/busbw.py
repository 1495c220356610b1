"""Bus bandwidth vs message size, with the alpha-beta fit and the links' nominal bandwidth."""
from __future__ import annotations

import math
import statistics

from topoprof.report.plots.base import (
    COLLECTIVE_COLORS,
    WIDE,
    byte_axis,
    color_for,
    finite,
    fmt_num,
    legend_below,
    new_figure,
    no_data,
    positive,
    save,
)

_TITLE = "Bus bandwidth vs message size"
_NOMINAL_COLORS = ("#000000", "#8c564b", "#7f7f7f", "#bcbd22")
_FIT_POINTS = 200


def _drawable(rows) -> list[dict]:
    """Rows a log2 size axis can show: positive size and a finite busbw."""
    return [r for r in rows or () if positive(r.get("size_bytes")) and finite(r.get("busbw_gbps"))]


def _by_collective(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(str(r.get("collective", "?")), []).append(r)
    for group in out.values():
        group.sort(key=lambda r: r["size_bytes"])
    return out


def _bus_factor(fit: dict, rows: list[dict]) -> float:
    """busbw / algbw: from the fit when it has both, else the rows' own ratio (it is constant)."""
    bus, alg = fit.get("busbw_gbps"), fit.get("bandwidth_gbps")
    if positive(bus) and positive(alg):
        return bus / alg
    ratios = [r["busbw_gbps"] / r["algbw_gbps"] for r in rows if positive(r.get("algbw_gbps"))]
    return statistics.median(ratios) if ratios else 1.0


def fit_busbw_gbps(size_bytes: float, fit: dict, factor: float) -> float:
    """factor x S / (alpha + S/beta) in GB/s; S bytes, alpha us, beta GB/s (= 1e3 B/us)."""
    alpha = fit.get("latency_us") or 0.0
    beta = fit.get("bandwidth_gbps")
    t_us = alpha + (size_bytes / (beta * 1e3) if positive(beta) else 0.0)
    return factor * size_bytes / t_us / 1e3 if t_us > 0 else math.nan


def _fit_label(name: str, fit: dict, factor: float) -> str:
    parts = [f"{name} fit: \u03b1 {fmt_num(fit.get('latency_us') or 0.0)} \u00b5s"]
    beta = fit.get("bandwidth_gbps")
    if positive(beta):
        parts.append(f"busbw \u03b2 {fmt_num(beta * factor)} GB/s")
    if finite(fit.get("r2")):
        parts.append(f"R\u00b2 {fit['r2']:.3f}")
    return ", ".join(parts)


def _draw_fit(ax, name: str, fit: dict | None, rows: list[dict], color: str) -> None:
    """The fitted busbw curve over the measured sizes (clipped by the axes, never scaling them)."""
    if not isinstance(fit, dict) or not finite(fit.get("latency_us")):
        return
    factor = _bus_factor(fit, rows)
    lo, hi = rows[0]["size_bytes"], rows[-1]["size_bytes"]
    sizes = [lo * (hi / lo) ** (i / (_FIT_POINTS - 1)) for i in range(_FIT_POINTS)] if hi > lo else [lo]
    values = [fit_busbw_gbps(s, fit, factor) for s in sizes]
    ax.plot(sizes, values, color=color, linestyle=(0, (4, 2)), linewidth=1.3, alpha=0.8,
            label=_fit_label(name, fit, factor))


def _draw_wrong(ax, rows: list[dict]) -> None:
    bad = [r for r in rows if finite(r.get("wrong")) and r["wrong"] > 0]
    if bad:
        ax.scatter([r["size_bytes"] for r in bad], [r["busbw_gbps"] for r in bad], marker="x",
                   s=70, linewidths=2.2, color="#d62728", zorder=5,
                   label=f"wrong > 0: data errors ({len(bad)} row{'s' if len(bad) > 1 else ''})")


def _draw_nominal(ax, nominal) -> float:
    """Horizontal lines (or shaded bands for uncertain ranges); returns the highest value drawn."""
    top = 0.0
    for i, item in enumerate(nominal or ()):
        color = _NOMINAL_COLORS[i % len(_NOMINAL_COLORS)]
        label = str(item.get("label", "nominal"))
        if positive(item.get("gbps")):
            ax.axhline(item["gbps"], color=color, linestyle=":", linewidth=1.6, label=label)
            top = max(top, item["gbps"])
        elif finite(item.get("low_gbps")) and positive(item.get("high_gbps")):
            span = f"{fmt_num(item['low_gbps'])}-{fmt_num(item['high_gbps'])} GB/s"
            ax.axhspan(item["low_gbps"], item["high_gbps"], facecolor=color, alpha=0.12,
                       edgecolor=color, hatch="//", linewidth=0.8, label=f"{label}: uncertain, {span}")
            top = max(top, item["high_gbps"])
    return top


def plot_busbw(rows, fits, nominal, path, title=None) -> str:
    """Bus bandwidth (GB/s) vs message size per collective, with fits and nominal link lines."""
    title = title or _TITLE
    drawable = _drawable(rows)
    if not drawable:
        return no_data(path, title, "no benchmark rows with a size and a bus bandwidth")
    fig = new_figure(WIDE, 5.2)
    ax = fig.add_subplot()
    seen: list[str] = []
    top = 0.0
    for name, group in _by_collective(drawable).items():
        color = color_for(name, COLLECTIVE_COLORS, seen)
        ax.plot([r["size_bytes"] for r in group], [r["busbw_gbps"] for r in group], color=color,
                marker="o", markersize=4, linewidth=1.8, label=name)
        top = max(top, max(r["busbw_gbps"] for r in group))
        _draw_fit(ax, name, (fits or {}).get(name), group, color)
    _draw_wrong(ax, drawable)
    top = max(top, _draw_nominal(ax, nominal))
    sizes = [r["size_bytes"] for r in drawable]
    byte_axis(ax, min(sizes), max(sizes))
    ax.set_ylim(0, top * 1.08 if top > 0 else 1.0)
    ax.set_xlabel("message size (bytes, log\u2082 scale)")
    ax.set_ylabel("bus bandwidth (GB/s, 1 GB/s = 10\u2079 B/s)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    # Under the axes: long fit labels never cover the curves.
    legend_below(fig, ax, ncol=2 if len(ax.get_legend_handles_labels()[1]) > 3 else 3)
    return save(fig, path)
