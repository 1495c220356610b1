"""What more GPUs like this one would give: a one-GPU scan's what-if table as a chart.

Each job (2-8 GPUs over NVLink or PCIe, 2-4 nodes over a network) is drawn as its throughput
over this one GPU's, at the same batch per GPU and accumulation: world size x one GPU's step /
the job's step, for DDP synced every micro-batch and with `no_sync()`. Behind each pair, an
outline at the world size: what the job would give if nothing were exposed. A whisker spans the
job's range (the links' nominal low and high).
"""
from __future__ import annotations

from topoprof.report.plots.base import STRATEGY_COLORS, WIDE, new_figure, no_data, positive, save
from topoprof.report.plots.matrix import footnote

_TITLE = "What more GPUs like this one would give"
_MODES = (("ddp_synced", "DDP, all-reduce every micro-batch"), ("ddp_no_sync", "DDP with no_sync()"))
_GROUPS = {"NVLink": "one node, NVLink", "PCIe": "one node, PCIe", "network": "several nodes"}
_BAR = 0.36


def _speedups(case: dict, single_s: float, mode: str) -> tuple[float, float, float] | None:
    """(middle, low, high) throughput over one GPU for `mode`, or None where not priced."""
    span = (case.get("step_time_s") or {}).get(mode)
    if not span or not all(positive(t) for t in span):
        return None
    fast, slow = min(span), max(span)
    n = case["world_size"]
    return n * single_s / ((fast + slow) / 2), n * single_s / slow, n * single_s / fast


def _drawable(what_if: dict | None) -> list[dict]:
    if not what_if or not positive(what_if.get("single_step_s")):
        return []
    return [c for c in what_if.get("cases") or () if positive(c.get("world_size"))
            and any(_speedups(c, what_if["single_step_s"], m) for m, _ in _MODES)]


def plot_what_if(what_if: dict | None, path, title: str | None = None) -> str:
    """Horizontal bars per job, grouped by how its GPUs are joined; x: throughput over one GPU."""
    cases = _drawable(what_if)
    if not what_if or not cases:
        return no_data(path, title or _TITLE, "no what-if job priced")
    single_s = what_if["single_step_s"]
    fig = new_figure(WIDE, 1.9 + 0.42 * len(cases))
    ax = fig.add_subplot(1, 1, 1)
    ideal_drawn = False
    for y, case in enumerate(cases):
        ax.barh(y, case["world_size"], height=2 * _BAR + 0.08, fill=False, edgecolor="#999999", linewidth=0.8,
                label=None if ideal_drawn else "ideal: world size, nothing exposed")
        ideal_drawn = True
        for k, (mode, label) in enumerate(_MODES):
            got = _speedups(case, single_s, mode)
            if got is None:
                continue
            middle, low, high = got
            at = y + (k - 0.5) * _BAR
            ax.barh(at, middle, height=_BAR, color=STRATEGY_COLORS[mode], label=label if y == 0 else None,
                    xerr=[[middle - low], [high - middle]], error_kw={"elinewidth": 0.8, "capsize": 2})
            ax.text(high, at, f" {middle:.2f}x", va="center", ha="left", fontsize=7)
    _group_marks(ax, cases)
    ax.set_yticks(range(len(cases)), [c["label"] for c in cases], fontsize=8)
    ax.set_ylim(len(cases) - 0.5, -0.5)
    ax.set_xlim(0, max(c["world_size"] for c in cases) * 1.15)
    ax.set_xlabel(f"throughput over this one GPU (x), same batch per GPU, K = {what_if.get('accum') or '?'}")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower right", frameon=True)
    ax.set_title(title or f"{_TITLE}: {what_if.get('label') or ''}", fontsize=10)
    fig.subplots_adjust(left=0.33, right=0.97, top=1 - 0.45 / fig.get_size_inches()[1],
                        bottom=1.25 / fig.get_size_inches()[1])
    footnote(fig, ax, [f"one GPU: {single_s * 1e3:,.1f} ms per optimizer step; a job's throughput = world size x that "
                       "/ its step", "whiskers: the links' nominal low and high",
                       str(what_if.get("note") or "modelled from nominal figures, not measured")], width=110)
    return save(fig, path)


def _group_marks(ax, cases: list[dict]) -> None:
    """A thin line between groups of jobs (NVLink, PCIe, nodes), the group named at its right."""
    start = 0
    for y in range(1, len(cases) + 1):
        if y == len(cases) or cases[y].get("kind") != cases[start].get("kind"):
            if y < len(cases):
                ax.axhline(y - 0.5, color="#666666", linewidth=0.6)
            kind: str = cases[start].get("kind", "")
            ax.text(1.0, (start + y - 1) / 2, " " + _GROUPS.get(kind, kind),
                    transform=ax.get_yaxis_transform(), rotation=90, va="center", ha="left", fontsize=7,
                    color="#444444")
            start = y
