"""Shared pieces of the charts: figure creation and saving, colours, byte and number labels.

matplotlib is imported inside the functions only: `topoprof topo` and the other text commands
import this package and must not pay matplotlib's import time. Figures are built from
`matplotlib.figure.Figure` with an Agg canvas, which needs no pyplot state and no display.
"""
from __future__ import annotations

import math
import os
from typing import TypeGuard

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
    "fsdp_full_shard": "#d62728",
    "fsdp_full_shard_no_sync": "#e377c2",
    "fsdp_shard_grad_op": "#8c564b",
    "fsdp_shard_grad_op_no_sync": "#bcbd22",
    "hsdp": "#7f7f7f",
    "hsdp_no_sync": "#aec7e8",
}
STRATEGY_MARKERS = {
    "single": "s",
    "dp": "v",
    "ddp_synced": "o",
    "ddp_no_sync": "^",
    "ddp_no_sync_backward_only": "x",
    "ddp_fp16_compress": "D",
    "fsdp_full_shard": "P",
    "fsdp_full_shard_no_sync": "*",
    "fsdp_shard_grad_op": "p",
    "fsdp_shard_grad_op_no_sync": "h",
    "hsdp": "<",
    "hsdp_no_sync": ">",
}
# ddp_no_sync_backward_only equals ddp_synced by design: dashed so both lines stay visible.
STRATEGY_LINESTYLES = {"ddp_no_sync_backward_only": (0, (5, 3)), "fsdp_full_shard": (0, (1, 1)),
                       "fsdp_full_shard_no_sync": (0, (1, 1)), "fsdp_shard_grad_op": (0, (1, 1)),
                       "fsdp_shard_grad_op_no_sync": (0, (1, 1)), "hsdp": (0, (1, 1)), "hsdp_no_sync": (0, (1, 1))}

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
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib, loaded only when a chart is drawn
    from matplotlib.figure import Figure  # lazy: matplotlib, loaded only when a chart is drawn

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
    ax.text(0.5, 0.55, "no data", ha="center", va="center", fontsize=18, color="#666666",
            transform=ax.transAxes)
    if detail:
        ax.text(0.5, 0.35, detail, ha="center", va="center", fontsize=10, color="#888888",
                transform=ax.transAxes)
    return save(fig, path)


def finite(value) -> bool:
    """A real number that can be drawn (not None, not NaN, not infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(value) -> TypeGuard[float]:
    """A finite number above 0 (None, NaN and the rest are not)."""
    return finite(value) and value > 0


def fmt_num(value: float) -> str:
    """Three significant figures without an exponent for the usual GB/s and us ranges."""
    if not finite(value):
        return "?"
    mag = abs(value)
    if mag >= 100 or mag == 0:
        return f"{value:.0f}"
    if mag >= 10:
        return f"{value:.1f}".removesuffix(".0")
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


def _byte_ticks(k_lo: int, k_hi: int, max_ticks: int) -> list[int]:
    """Exponents to label: every power of two if few, else a pattern keeping 1 KiB, 1 MiB, 1 GiB."""
    ks = range(k_lo, k_hi + 1)
    # 1, 8, 64 per binary unit (8 B, 64 B, 1 KiB, 8 KiB, ...): nine labels for 8 B .. 1 GiB.
    for keep in ({*range(10)}, {0, 2, 4, 6, 8}, {0, 3, 6}, {0, 5}, {0}):
        ticks = [k for k in ks if k % 10 in keep]
        if len(ticks) <= max_ticks:
            return ticks
    return [k for k in ks if k % 10 == 0]


def byte_axis(ax, low: float, high: float, max_ticks: int = 10) -> None:
    """Log2 x axis over [low, high] bytes with non-overlapping labels (8 B, 64 B, 1 KiB, ...)."""
    # lazy: matplotlib, loaded only when a chart is drawn
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    k_lo, k_hi = math.floor(math.log2(low)), math.ceil(math.log2(high))
    ticks = _byte_ticks(k_lo, k_hi, max_ticks)
    ax.xaxis.set_major_locator(FixedLocator([2.0 ** k for k in ticks]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_bytes(v)))
    # Unlabelled minor ticks at every power of two: the sizes nccl-tests steps through.
    ax.xaxis.set_minor_locator(FixedLocator([2.0 ** k for k in range(k_lo, k_hi + 1)]))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(low / 1.3, high * 1.3)


def plain_log_ticks(axis) -> None:
    """Label a log axis with plain numbers (0.5, 2, 300) instead of 10^x."""
    from matplotlib.ticker import FuncFormatter  # lazy: matplotlib, loaded only when a chart is drawn

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_num(v)))


# Mantissas for log-axis labels, densest first: a short axis gets 10, 15, 20; a long one 1, 10, 100.
_MANTISSAS = ((1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1, 3), (1,))


def nice_log_ticks(low: float, high: float, max_ticks: int = 6) -> list[float]:
    """Round values inside [low, high] for a log axis: as many as fit under max_ticks."""
    ticks: list[float] = []
    for mantissas in _MANTISSAS:
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                 for m in mantissas if low * 0.999 <= m * 10.0 ** e <= high * 1.001]
        if len(ticks) <= max_ticks:
            break
    return ticks


def label_log_axis(axis, low: float, high: float, max_ticks: int = 6) -> None:
    """Plain-number labels at nice_log_ticks, no minor labels: readable over any span."""
    from matplotlib.ticker import FixedLocator, NullFormatter  # lazy: matplotlib, loaded only when a chart is drawn

    axis.set_major_locator(FixedLocator(nice_log_ticks(low, high, max_ticks)))
    plain_log_ticks(axis)
    axis.set_minor_formatter(NullFormatter())


def legend_below(fig, ax, handles=None, labels=None, ncol: int = 1, fontsize: float = 8.5) -> None:
    """A legend just under ax's tick and axis labels (fixed layout, so measured before saving)."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    box = ax.get_tightbbox(fig.canvas.get_renderer()).transformed(fig.transFigure.inverted())
    pos = ax.get_position()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=((pos.x0 + pos.x1) / 2, box.y0 - 0.01),
               ncol=ncol, fontsize=fontsize, frameon=False)


def text_color_on(rgba) -> str:
    """Black or white, whichever reads better on a cell of colour rgba (relative luminance)."""
    r, g, b = rgba[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"
