"""Shared pieces of the charts: figure creation and saving, colours, byte and number labels.

matplotlib is imported inside the functions only: `topoprof topo` and the other text commands
import this package and must not pay matplotlib's import time. Figures are built from
`matplotlib.figure.Figure` with an Agg canvas, which needs no pyplot state and no display.
"""
from __future__ import annotations

import math
import os

DPI = 120
# ~1080 px wide at DPI: fills GitHub's content column without being scaled down much.
WIDE = 9.0

# One colour (and marker) per strategy name, shared by every chart so a reader can match them.
STRATEGY_COLORS = {
    "single": "#4d4d4d",
    "dp": "#ff7f0e",
    "ddp_synced": "#1f77b4",
    "ddp_no_sync": "#2ca02c",
    "ddp_no_sync_backward_only": "#17becf",
    "ddp_fp16_compress": "#9467bd",
}
STRATEGY_MARKERS = {
    "single": "s",
    "dp": "v",
    "ddp_synced": "o",
    "ddp_no_sync": "^",
    "ddp_no_sync_backward_only": "x",
    "ddp_fp16_compress": "D",
}
# ddp_no_sync_backward_only equals ddp_synced by design: dashed so both lines stay visible.
STRATEGY_LINESTYLES = {"ddp_no_sync_backward_only": (0, (5, 3))}

COLLECTIVE_COLORS = {
    "all_reduce": "#1f77b4",
    "all_gather": "#ff7f0e",
    "reduce_scatter": "#2ca02c",
    "broadcast": "#9467bd",
    "reduce": "#8c564b",
    "all_to_all": "#e377c2",
    "send_recv": "#bcbd22",
}
# Names not listed above take these in order of first appearance (stable within one chart).
_SPARE_COLORS = ("#d62728", "#7f7f7f", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#000000")


def color_for(name: str, table: dict[str, str], seen: list[str]) -> str:
    """The table's colour for name, else a spare colour fixed by first appearance in `seen`."""
    if name in table:
        return table[name]
    if name not in seen:
        seen.append(name)
    return _SPARE_COLORS[seen.index(name) % len(_SPARE_COLORS)]


def strategy_style(name: str, seen: list[str]) -> dict:
    """Line keyword arguments for a strategy: colour, marker and dash pattern."""
    return {
        "color": color_for(name, STRATEGY_COLORS, seen),
        "marker": STRATEGY_MARKERS.get(name, "o"),
        "linestyle": STRATEGY_LINESTYLES.get(name, "-"),
    }


def new_figure(width: float, height: float, **kwargs):
    """A Figure with an Agg canvas attached: renders PNGs without pyplot or a display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def save(fig, path) -> str:
    """Write fig as a PNG at path (parent folders created) and return the path as a string."""
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15, format="png")
    return path


def no_data(path, title: str, detail: str | None = None) -> str:
    """A figure that says there is nothing to draw, so callers always get a PNG."""
    fig = new_figure(WIDE, 3.0)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title, fontsize=13)
    text = "no data" + (f"\n{detail}" if detail else "")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=16, color="#666666",
            transform=ax.transAxes)
    return save(fig, path)


def finite(value) -> bool:
    """A real number that can be drawn (not None, not NaN, not infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(value) -> bool:
    return finite(value) and value > 0


def fmt_num(value: float) -> str:
    """Three significant figures without an exponent for the usual GB/s and us ranges."""
    if not finite(value):
        return "?"
    mag = abs(value)
    if mag >= 100 or mag == 0:
        return f"{value:.0f}"
    if mag >= 10:
        return f"{value:.1f}"
    if mag >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(value: float) -> str:
    """8 B, 1 KiB, 256 MiB: binary units, as nccl-tests sizes are powers of two."""
    if not finite(value) or value <= 0:
        return ""
    unit = 0
    while value >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    text = f"{value:.0f}" if value == int(value) else f"{value:.3g}"
    return f"{text} {_BYTE_UNITS[unit]}"


def byte_axis(ax, low: float, high: float, max_ticks: int = 14) -> None:
    """Log2 x axis over [low, high] bytes, labelled at powers of two that include KiB/MiB/GiB."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    k_lo, k_hi = math.floor(math.log2(low)), math.ceil(math.log2(high))
    # A step dividing 10 keeps 1 KiB, 1 MiB and 1 GiB among the labels.
    for step in (1, 2, 5, 10):
        ticks = [k for k in range(k_lo, k_hi + 1) if k % step == 0]
        if len(ticks) <= max_ticks:
            break
    ax.xaxis.set_major_locator(FixedLocator([2.0 ** k for k in ticks]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_bytes(v)))
    ax.xaxis.set_minor_locator(FixedLocator([2.0 ** k for k in range(k_lo, k_hi + 1)]))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(low / 1.3, high * 1.3)


def plain_log_ticks(axis) -> None:
    """Label a log axis with plain numbers (0.5, 2, 300) instead of 10^x."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_num(v)))


def text_color_on(rgba) -> str:
    """Black or white, whichever reads better on a cell of colour rgba (relative luminance)."""
    r, g, b = rgba[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"
