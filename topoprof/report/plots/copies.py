"""Measured copy bandwidth: GPU -> GPU heatmap and host <-> GPU bars (probes/ranks/copy_bandwidth.py data)."""
from __future__ import annotations

import math

from topoprof.report.plots.base import finite, fmt_bytes, fmt_num, legend_below, new_figure, no_data, positive, save
from topoprof.report.plots.matrix import (
    annotate,
    axes_labels,
    cell_font_size,
    colorbar,
    footnote,
    gpu_tick_labels,
    hatch_cell,
    heatmap,
    log_norm,
)

_TITLE = "Copy bandwidth"
_BAR_COLORS = {"h2d": "#1f77b4", "d2h": "#ff7f0e"}
_BAR_LABELS = {"h2d": "host \u2192 GPU", "d2h": "GPU \u2192 host"}
# An HBM line further than this multiple of the largest bar would squash the bars: noted instead.
_OFF_SCALE = 3.0


def _device(name) -> int | None:
    """N from "cuda:N"; None for "host" or anything else."""
    if isinstance(name, str) and name.startswith("cuda:") and name[5:].isdigit():
        return int(name[5:])
    return None


def _usable(copies) -> list[dict]:
    if not isinstance(copies, dict):
        return []
    return [m for m in copies.get("measurements") or () if positive(m.get("bandwidth_gbps"))]


def _devices(ms: list[dict]) -> list[int]:
    found = {_device(m.get(k)) for m in ms for k in ("src", "dst")}
    return sorted(d for d in found if d is not None)


def _d2d_grid(ms: list[dict], devices: list[int]):
    """(bandwidth grid, no-peer-access cells) over src rows x dst columns."""
    pos = {d: i for i, d in enumerate(devices)}
    n = len(devices)
    grid = [[math.nan] * n for _ in range(n)]
    no_p2p = set()
    for m in ms:
        a, b = _device(m.get("src")), _device(m.get("dst"))
        if m.get("kind") != "d2d" or a is None or b is None:
            continue
        grid[pos[a]][pos[b]] = m["bandwidth_gbps"]
        if a != b and m.get("p2p") is False:
            no_p2p.add((pos[a], pos[b]))
    return grid, no_p2p


def _cell_texts(grid, no_p2p, n: int) -> list[list[str]]:
    """GB/s per cell; past 8 GPUs two significant figures and a star, so 16 columns stay legible."""
    mark = "\nno P2P" if n <= 8 else "*"
    fmt = fmt_num if n <= 8 else (lambda v: f"{v:.0f}" if v >= 10 else f"{v:.1f}")
    return [[("-" if not finite(v) else fmt(v) + (mark if (i, j) in no_p2p else ""))
             for j, v in enumerate(row)] for i, row in enumerate(grid)]


def _draw_d2d(fig, ax, cax, grid, no_p2p, devices, hbm: float | None) -> None:
    n = len(devices)
    values = [v for row in grid for v in row if finite(v)]
    ceiling = hbm / 2 if hbm else None  # see _mark_copy_ceiling
    image = heatmap(ax, grid, log_norm(values + ([ceiling * 1.1] if ceiling else [])))
    bar = colorbar(fig, image, ax, "", cax=cax)
    # Label on top: beside the bar it would sit past the widest tick ("HBM 3350"), in the gap.
    cax.set_title("GB/s\n(log)", fontsize=8.5)
    if ceiling:
        _mark_copy_ceiling(bar, ceiling)
    for i, j in no_p2p:
        hatch_cell(ax, i, j)
    annotate(ax, image, grid, _cell_texts(grid, no_p2p, n), cell_font_size(n) - 0.5)
    axes_labels(ax, gpu_tick_labels(devices), [f"GPU{d}" for d in devices], "destination", "source")
    ax.set_title("GPU \u2192 GPU copies")


def _mark_copy_ceiling(bar, ceiling: float) -> None:
    """The most a copy within one GPU can reach, as a line on the colour bar: the diagonal counts
    each byte copied once, while the nominal memory bandwidth counts reads and writes together, so
    a copy's ceiling is half of it. (A bar panel scaled to include it would squash the PCIe-sized
    host bars.)"""
    from matplotlib.ticker import FixedLocator, FuncFormatter  # lazy: matplotlib, loaded only when a chart is drawn

    bar.ax.axhline(ceiling, color="black", linewidth=2)
    ticks = [t for t in bar.ax.yaxis.get_majorticklocs() if not ceiling / 1.6 < t < ceiling * 1.6] + [ceiling]
    bar.ax.yaxis.set_major_locator(FixedLocator(sorted(ticks)))
    bar.ax.yaxis.set_major_formatter(
        FuncFormatter(lambda v, _pos: f"HBM\u00f72 {fmt_num(v)}" if v == ceiling else fmt_num(v)))


def _host_bars(ms: list[dict], devices: list[int]) -> dict[str, list[float]]:
    out = {k: [math.nan] * len(devices) for k in _BAR_COLORS}
    pos = {d: i for i, d in enumerate(devices)}
    for m in ms:
        kind = m.get("kind")
        dev = _device(m.get("dst") if kind == "h2d" else m.get("src"))
        if kind in out and dev in pos:
            out[kind][pos[dev]] = m["bandwidth_gbps"]
    return out


def _draw_bars(ax, bars, devices, pcie: float | None, hbm: float | None) -> None:
    """Horizontal bars per GPU (GPU0 on top, like the heatmap rows) and reference lines."""
    height = 0.38
    for k, (kind, values) in enumerate(bars.items()):
        ys = [i + (k - 0.5) * height for i in range(len(devices))]
        ax.barh(ys, [v if finite(v) else 0 for v in values], height=height, color=_BAR_COLORS[kind],
                label=_BAR_LABELS[kind])
        for y, v in zip(ys, values):
            if finite(v):
                ax.text(v, y, f" {fmt_num(v)}", va="center", ha="left", fontsize=7.5)
    top = max(v for vs in bars.values() for v in vs if finite(v))
    if pcie:
        ax.axvline(pcie, color="#d62728", linestyle="--", linewidth=1.4,
                   label=f"PCIe nominal {fmt_num(pcie)} GB/s")
        top = max(top, pcie)
    if hbm and hbm <= _OFF_SCALE * top:
        ax.axvline(hbm, color="black", linestyle="--", linewidth=1.4,
                   label=f"HBM nominal {fmt_num(hbm)} GB/s")
        top = max(top, hbm)
    elif hbm:
        # A legend entry without a mark: the figure is stated, the bars keep their scale.
        ax.plot([], [], linestyle="none", label=f"HBM nominal {fmt_num(hbm)} GB/s (off this scale)")
    ax.set_xlim(0, top * 1.2)
    ax.set_xlabel("GB/s")
    ax.set_yticks(range(len(devices)), [f"GPU{d}" for d in devices])
    ax.set_ylim(len(devices) - 0.5, -0.5)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("host \u2194 GPU copies (pinned)")


def _subtitle(copies: dict) -> str:
    size = fmt_bytes(copies.get("size_bytes") or 0)
    names = sorted(set(copies.get("device_names") or ()))
    what = f"{size} per copy" if size else ""
    if len(names) == 1:
        what += f", {len(copies['device_names'])} \u00d7 {names[0]}"
    return what.strip(", ")


def _reference(reference, key: str) -> float | None:
    value = (reference or {}).get(key)
    return float(value) if positive(value) else None


def plot_copy_matrix(copies, path, reference=None) -> str:
    """GPU -> GPU copy bandwidth heatmap next to host <-> GPU bars, in GB/s (1e9 B/s).

    reference: {"pcie_gbps", "hbm_gbps"} nominal figures (either may be None; HBM counts reads and
    writes together, as datasheets do). PCIe is a line on the bar panel; half the HBM figure, the
    most a copy within one GPU can reach, a mark on the heatmap's colour bar (next to the on-GPU
    copies); the whole HBM figure on the bar panel when there is no heatmap.
    """
    ms = _usable(copies)
    devices = _devices(ms)
    if not ms or not devices:
        return no_data(path, _TITLE, "no copy measurements")
    grid, no_p2p = _d2d_grid(ms, devices)
    bars = _host_bars(ms, devices)
    has_d2d = any(finite(v) for row in grid for v in row)
    has_bars = any(finite(v) for vs in bars.values() for v in vs)
    fig, heat_ax, cbar_ax, bar_ax = _layout(len(devices), has_d2d, has_bars)
    hbm = _reference(reference, "hbm_gbps")
    if has_d2d:
        _draw_d2d(fig, heat_ax, cbar_ax, grid, no_p2p, devices, hbm)
    if has_bars:
        _draw_bars(bar_ax, bars, devices, _reference(reference, "pcie_gbps"), None if has_d2d else hbm)
        legend_below(fig, bar_ax, fontsize=8)
    subtitle = _subtitle(copies)
    top = max(a.get_position().y1 for a in (heat_ax, bar_ax) if a is not None)
    fig.suptitle(f"{_TITLE} (GB/s = 10\u2079 B/s)" + (f"\n{subtitle}" if subtitle else ""), fontsize=12,
                 y=top + _inches(fig, 0.4, "y"), va="bottom")
    if has_d2d:
        footnote(fig, heat_ax, _copy_notes(grid, no_p2p, hbm), width=64)
    return save(fig, path)


# Panel geometry in inches. Axes are placed by hand rather than by a layout engine: the gap
# between the colour bar and the bar panel must hold the colour bar's labels ("HBM\u00f72 2400") and
# the GPU names, whatever the GPU count, and the bars then line up with the heatmap's rows.
_MARGIN = 1.0        # left of the first panel (row labels) and below the panels (column labels)
_CBAR_PAD, _CBAR_W = 0.15, 0.22
_CBAR_TO_BARS = 1.8
_BARS_W = 2.4
_TITLE_ROOM = 1.2


def _inches(fig, value: float, axis: str) -> float:
    """value inches as a fraction of the figure's width (x) or height (y)."""
    w, h = fig.get_size_inches()
    return value / (w if axis == "x" else h)


def _layout(n: int, has_d2d: bool, has_bars: bool):
    """(figure, heatmap axes, colour bar axes, bar axes); absent panels are None."""
    side = min(5.2, 2.0 + 0.35 * n)
    heat_w = side + _CBAR_PAD + _CBAR_W + _CBAR_TO_BARS if has_d2d else 0.0
    bars_w = (_BARS_W if has_d2d else 2 * _BARS_W) if has_bars else 0.0  # alone, it takes the room
    width = _MARGIN + heat_w + bars_w + 0.4
    height = _MARGIN + side + _TITLE_ROOM
    fig = new_figure(width, height)

    def box(left, w):
        return [left / width, _MARGIN / height, w / width, side / height]

    heat_ax = fig.add_axes(box(_MARGIN, side)) if has_d2d else None
    cbar_ax = fig.add_axes(box(_MARGIN + side + _CBAR_PAD, _CBAR_W)) if has_d2d else None
    bar_ax = fig.add_axes(box(_MARGIN + heat_w, bars_w)) if has_bars else None
    return fig, heat_ax, cbar_ax, bar_ax


def _copy_notes(grid, no_p2p, hbm: float | None) -> list[str]:
    notes = ["rows: source GPU, columns: destination GPU"]
    if any(finite(grid[i][i]) for i in range(len(grid))):
        notes.append("diagonal: bytes copied per second within one GPU's memory (each byte is read "
                     "and written: the memory moves twice this)")
    if hbm:
        notes.append(f"HBM\u00f72 {fmt_num(hbm / 2)} on the colour bar: the most such a copy can reach, half "
                     f"the nominal {fmt_num(hbm)} GB/s of reads and writes together")
    if no_p2p:
        notes.append("hatched" + (" / *" if len(grid) > 8 else "") +
                     ": no peer access, the driver stages the copy through host memory")
    return notes
