"""GPU x GPU heatmaps: the cell drawing shared with the copy chart, and the link matrix."""
from __future__ import annotations

import math
import textwrap

from topoprof.report.plots.base import (
    finite,
    fmt_num,
    label_log_axis,
    new_figure,
    no_data,
    positive,
    save,
    text_color_on,
)

_LINK_TITLE = "GPU link matrix: nominal per-direction bandwidth"
_CMAP = "viridis"
_EMPTY_CELL = "#d9d9d9"
_DIAGONAL = "#f0f0f0"
# Translucent, sparse hatching: marks a cell without hiding its annotation.
_HATCH = "#ffffff66"

# Short meanings for the footnote; the full wording lives in topology.PATH_MEANING.
_PATH_NOTE = {
    "NV": "NV# = number of bonded NVLinks",
    "PIX": "PIX = one PCIe switch",
    "PXB": "PXB = several PCIe switches",
    "PHB": "PHB = via the CPU's PCIe host bridge",
    "NODE": "NODE = across host bridges in one NUMA node",
    "SYS": "SYS = across CPU sockets",
}


def cell_font_size(n: int) -> float:
    """Annotation size that keeps two short lines inside a cell for 2 to 16 GPUs."""
    return 11.0 if n <= 4 else 9.5 if n <= 8 else 8.0 if n <= 12 else 7.0


def _square_size(n: int) -> tuple[float, float]:
    side = min(8.4, 4.2 + 0.3 * n)
    return side + 1.6, side


def log_norm(values: list[float]):
    """Log colour scale over the drawn values; a single value gets a decade around it."""
    from matplotlib.colors import LogNorm  # lazy: matplotlib, loaded only when a chart is drawn

    lo, hi = min(values), max(values)
    if hi / lo < 1.5:
        lo, hi = lo / 3, hi * 3
    return LogNorm(vmin=lo, vmax=hi)


def heatmap(ax, grid: list[list[float]], norm):
    """imshow with NaN cells in light grey; returns the image for the colour bar."""
    import matplotlib  # lazy: matplotlib, loaded only when a chart is drawn
    import numpy as np  # lazy: numpy comes with matplotlib, loaded only when a chart is drawn

    cmap = matplotlib.colormaps[_CMAP].with_extremes(bad=_EMPTY_CELL)
    data = np.ma.masked_invalid(np.array(grid, dtype=float))
    return ax.imshow(data, cmap=cmap, norm=norm, aspect="equal", interpolation="nearest")


def annotate(ax, image, grid, texts, fontsize: float) -> None:
    n = len(grid)
    for i in range(n):
        for j in range(len(grid[i])):
            value = grid[i][j]
            color = text_color_on(image.cmap(image.norm(value))) if finite(value) else "black"
            ax.text(j, i, texts[i][j], ha="center", va="center", fontsize=fontsize, color=color,
                    linespacing=1.15)


def hatch_cell(ax, i: int, j: int, color: str = _HATCH, hatch: str = "//") -> None:
    from matplotlib.patches import Rectangle  # lazy: matplotlib, loaded only when a chart is drawn

    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch=hatch, edgecolor=color,
                           linewidth=0))


def fill_cell(ax, i: int, j: int, color: str) -> None:
    from matplotlib.patches import Rectangle  # lazy: matplotlib, loaded only when a chart is drawn

    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=color, linewidth=0))


def gpu_tick_labels(indices: list[int]) -> list[str]:
    """Column labels: bare numbers past 8 GPUs, so 16 columns fit without rotated text."""
    return [str(i) if len(indices) > 8 else f"GPU{i}" for i in indices]


def axes_labels(ax, xlabels: list[str], ylabels: list[str], xlabel: str, ylabel: str) -> None:
    n = len(xlabels)
    ax.set_xticks(range(n), xlabels)
    ax.set_yticks(range(n), ylabels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.tick_params(length=0)
    # Thin white gridlines separate cells of similar colour.
    ax.set_xticks([k - 0.5 for k in range(1, n)], minor=True)
    ax.set_yticks([k - 0.5 for k in range(1, n)], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.2)
    ax.tick_params(which="minor", length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)


def colorbar(fig, image, ax, label: str, cax=None):
    """A log colour bar beside ax (or in cax) labelled with plain numbers."""
    bar = fig.colorbar(image, ax=ax, cax=cax, fraction=0.046, pad=0.03)
    bar.set_label(label)
    label_log_axis(bar.ax.yaxis, image.norm.vmin, image.norm.vmax)
    return bar


# ---------------------------------------------------------------------------------------------
# Link matrix (topology)


def _link_kind(pair: dict) -> str:
    kind = pair.get("path") or "?"
    if kind == "NV":
        return f"NV{pair.get('nvlinks') or ''}"
    return kind


def _link_value(pair: dict) -> tuple[float, str]:
    """(value for the colour, second annotation line) for one pair."""
    rng = pair.get("bandwidth_range_gbps")
    if positive(pair.get("bandwidth_gbps")):
        return pair["bandwidth_gbps"], fmt_num(pair["bandwidth_gbps"]) + ("?" if pair.get("uncertain") else "")
    if rng and len(rng) == 2 and positive(rng[0]) and positive(rng[1]):
        # Geometric midpoint: the middle of the range on the log colour scale.
        return math.sqrt(rng[0] * rng[1]), f"{fmt_num(rng[0])}-{fmt_num(rng[1])}?"
    return math.nan, "?"


def _pair_lookup(pairs) -> dict[tuple[int, int], dict]:
    out = {}
    for p in pairs or ():
        a, b = p.get("gpu_a"), p.get("gpu_b")
        if a is not None and b is not None:
            out[(a, b)] = out[(b, a)] = p
    return out


def _gpu_labels(gpus: list[dict]) -> tuple[list[str], str]:
    """Row labels and a subtitle: one model name goes in the title, mixed names on the rows."""
    names = [g.get("name") or "" for g in gpus]
    rows = [f"GPU{g['index']}" for g in gpus]
    if len(set(names)) == 1:
        return rows, f"{len(gpus)} \u00d7 {names[0]}" if names[0] else f"{len(gpus)} GPUs"
    return [f"{r} {_short(n)}".strip() for r, n in zip(rows, names)], f"{len(gpus)} GPUs"


def _short(name: str) -> str:
    return name.replace("NVIDIA ", "").replace("Tesla ", "")[:18]


def footnote(fig, ax, notes: list[str], width: int = 125) -> None:
    """Small grey notes under the axes and their tick labels: short notes share a line, a note
    longer than `width` characters goes on over indented lines of its own."""
    bbox = ax.get_tightbbox(fig.canvas.get_renderer()).transformed(fig.transFigure.inverted())
    lines: list[str] = []
    for note in notes:
        if lines and len(lines[-1]) + len(note) + 5 <= width:
            lines[-1] += "   \u2022   " + note
        else:
            lines += textwrap.wrap(note, width, subsequent_indent="    ") or [""]
    fig.text(0.02, bbox.y0 - 0.015, "\n".join(lines), fontsize=8, color="#444444", va="top",
             ha="left")


def _link_notes(kinds: set[str], any_uncertain: bool, any_unknown: bool) -> list[str]:
    notes = [_PATH_NOTE[k] for k in ("NV", "PIX", "PXB", "PHB", "NODE", "SYS") if k in kinds]
    if any_uncertain:
        notes.append("? / hatched = uncertain: colour at the range's midpoint")
    if any_unknown:
        notes.append("grey = no bandwidth known")
    return notes


def _link_cells(gpus: list[dict], pairs):
    """(colour values, cell texts, uncertain cells, path kinds seen) over GPU rows x columns."""
    n = len(gpus)
    lookup = _pair_lookup(pairs)
    grid = [[math.nan] * n for _ in range(n)]
    texts = [["X" if i == j else "-" for j in range(n)] for i in range(n)]
    uncertain, kinds = [], set()
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            pair = lookup.get((a["index"], b["index"])) if i != j else None
            if pair is None:
                continue
            grid[i][j], value_text = _link_value(pair)
            texts[i][j] = f"{_link_kind(pair)}\n{value_text}"
            kinds.add(pair.get("path") or "?")
            if "?" in value_text:
                uncertain.append((i, j))
    return grid, texts, uncertain, kinds


def plot_link_matrix(gpus, pairs, path) -> str:
    """Heatmap of nominal per-direction link bandwidth (GB/s) between every pair of GPUs."""
    gpus = sorted((g for g in gpus or () if g.get("index") is not None), key=lambda g: g["index"])
    if not gpus:
        return no_data(path, _LINK_TITLE, "no GPUs in the topology")
    n = len(gpus)
    if n < 2:
        name = gpus[0].get("name") or "GPU"
        return no_data(path, _LINK_TITLE, f"one GPU ({name} as GPU{gpus[0]['index']}): no GPU pairs")
    grid, texts, uncertain, kinds = _link_cells(gpus, pairs)
    fig = new_figure(*_square_size(n))
    ax = fig.add_subplot()
    values = [v for row in grid for v in row if finite(v)]
    image = heatmap(ax, grid, log_norm(values) if values else None)
    if values:
        colorbar(fig, image, ax, "GB/s per direction (log scale)")
    for i in range(n):
        fill_cell(ax, i, i, _DIAGONAL)
    for i, j in uncertain:
        # White hatching reads on every viridis colour; grey (no value) cells need a darker one.
        hatch_cell(ax, i, j, _HATCH if finite(grid[i][j]) else "#999999")
    annotate(ax, image, grid, texts, cell_font_size(n))
    rows, subtitle = _gpu_labels(gpus)
    axes_labels(ax, gpu_tick_labels([g["index"] for g in gpus]), rows, "GPU" if n > 8 else "", "")
    ax.set_title(f"{_LINK_TITLE} (GB/s)\n{subtitle}", fontsize=12)
    unknown = any(not finite(grid[i][j]) and texts[i][j] != "X" for i in range(n) for j in range(n))
    footnote(fig, ax, _link_notes(kinds, bool(uncertain), unknown), width=110)
    return save(fig, path)
