"""Memory per GPU by strategy: each strategy's parts stacked, against the GPU's memory."""
from __future__ import annotations

from topoprof.report.plots.base import WIDE, new_figure, no_data, save
from topoprof.report.plots.matrix import footnote

# What the step holds at its allocated peak (topoprof.model.memory.holding.Peak's parts), bottom to
# top, each with one colour in every chart; the parts never all coexist, so only those at the peak
# are stacked.
PARTS = (("params", "weights", "#1f77b4"), ("grads", "gradients", "#ff7f0e"),
         ("grads written before", "gradients written by then", "#ffbb78"),
         ("optimizer", "optimizer state", "#2ca02c"), ("buckets", "DDP buckets", "#9467bd"),
         ("unsharded", "FSDP unsharded", "#8c564b"),
         ("micro-batch", "the micro-batch's tensors there (activations, logits, copies, transients)", "#7f7f7f"),
         ("activations", "activations", "#7f7f7f"), ("logits", "logits and loss", "#bcbd22"),
         ("autocast copies", "autocast copies", "#17becf"), ("backward transient", "backward transient", "#e377c2"),
         ("optimizer step's transient", "optimizer step's transient", "#f7b6d2"),
         ("workspace", "cuBLAS workspace", "#dbdb8d"))
# What the peak leaves of the total: the allocator's reserve and the environment at the top of
# their ranges (CUDA context, the driver, NCCL).
REST = ("the rest: allocator reserve, CUDA context, NCCL (top of range)", "#c7c7c7")


def _rows(strategies: dict) -> list[tuple[str, dict]]:
    """(strategy, memory) for every strategy with a memory count; strategies that hold the
    same bytes (the DDP variants) are drawn once, named together."""
    seen: dict[tuple, list[str]] = {}
    memory: dict[tuple, dict] = {}
    for name, s in strategies.items():
        mem = (s or {}).get("memory")
        if not mem:
            continue
        key = tuple(round(_at_peak(mem).get(p) or 0.0, 3) for p, _, _ in PARTS)
        seen.setdefault(key, []).append(name)
        memory[key] = mem
    return [(" = ".join(names) if len(names) < 3 else f"{names[0]} (+{len(names) - 1})", memory[key])
            for key, names in seen.items()]


# The parts' names in a report written before the peak was followed (`parts_gb`), as PARTS names them.
_OLD_NAMES = {"param_copies": "autocast copies", "backward_transient": "backward transient"}


def _at_peak(memory: dict) -> dict:
    """What the step holds at its peak, by part; a report written before the peak was followed has
    only the parts, which its own total added (the optimizer step's transient was then counted
    apart, as the larger of two peaks)."""
    if memory.get("peak_parts_gb"):
        return memory["peak_parts_gb"]
    return {_OLD_NAMES.get(k, k): v for k, v in memory["parts_gb"].items() if k != "optimizer_transient"}


def plot_memory(strategies: dict, path, title: str) -> str:
    """Each strategy's memory per GPU: what it holds at its allocated peak, stacked, then the
    rest of the total; the GPU's memory as a line."""
    rows = _rows(strategies)
    if not rows:
        return no_data(path, title, "no strategy with a memory count")
    fig = new_figure(WIDE, 2.2 + 0.5 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    capacity = next((m["gpu_memory_gb"] for _, m in rows if m.get("gpu_memory_gb")), None)
    labels = [name for name, _ in rows]
    left = [0.0] * len(rows)
    for part, label, color in PARTS:
        widths = [_at_peak(m).get(part) or 0.0 for _, m in rows]
        if any(widths):
            ax.barh(labels, widths, left=left, color=color, label=label, height=0.6)
            left = [a + b for a, b in zip(left, widths)]
    rest = [max(0.0, m["total_gb"] - a) for (_, m), a in zip(rows, left)]
    if any(r > 1e-9 for r in rest):
        ax.barh(labels, rest, left=left, color=REST[1], label=REST[0], height=0.6)
        left = [a + b for a, b in zip(left, rest)]
    for y, (_, m) in enumerate(rows):
        unknown = " + activations?" if m["parts_gb"].get("activations") is None else ""
        mark = "  does not fit" if m.get("fits") is False else ""
        ax.text(left[y], y, f" {m['total_gb']:,.1f} GB{unknown}{mark}", va="center", fontsize=8)
    if capacity:
        ax.axvline(capacity, color="#d62728", linewidth=1.5, label=f"GPU memory {capacity:.1f} GB")
    ax.set_xlim(0, max(left + [capacity or 0]) * 1.3)
    ax.invert_yaxis()
    ax.set_xlabel("GB per GPU (1e9 B)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.2, right=0.8)
    footnote(fig, ax, ["Stacked: what the step holds at its allocated peak, followed over the op trace (where it "
                       "falls: the memory table's 'peak of' line); without a trace, the parts added, a bound. "
                       "Counted: bytes per parameter by dtype and optimizer, DDP's buckets, FSDP's unsharded "
                       "groups, the micro-batch's tensors from the op trace; the rest at the top of its cited "
                       "range"], width=110)
    return save(fig, path)
