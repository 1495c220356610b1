"""PNG charts of topoprof results, drawn from plain JSON-like data (a saved report re-renders).

    plot_busbw(rows, fits, nominal, path, title=None)      bus bandwidth vs message size
    plot_link_matrix(gpus, pairs, path)                     nominal GPU x GPU link bandwidth
    plot_copy_matrix(copies, path, reference=None)          measured copy bandwidth
    plot_step_vs_accum(sweep, path, title=None)             step time / throughput vs accumulation
    plot_pred_vs_measured(cases, path)                      cost model vs real training loops
    plot_memory(strategies, path, title)                    memory per GPU by strategy vs the GPU's
    plot_what_if(what_if, path, title=None)                 one GPU: what more such GPUs would give

`memory`, `steps` and `whatif` chart the results of `topoprof.model.strategies`' modules of the
same names. Each writes a PNG at path and returns the path; empty input gives a "no data" figure.
Importing this module does not import matplotlib: only drawing does.
"""
from __future__ import annotations

from topoprof.report.plots.base import COLLECTIVE_COLORS, STRATEGY_COLORS
from topoprof.report.plots.busbw import fit_busbw_gbps, plot_busbw
from topoprof.report.plots.copies import plot_copy_matrix
from topoprof.report.plots.matrix import plot_link_matrix
from topoprof.report.plots.memory import plot_memory
from topoprof.report.plots.steps import plot_pred_vs_measured, plot_step_vs_accum, throughput, world_size_for
from topoprof.report.plots.whatif import plot_what_if

__all__ = [
    "COLLECTIVE_COLORS",
    "STRATEGY_COLORS",
    "fit_busbw_gbps",
    "plot_busbw",
    "plot_copy_matrix",
    "plot_link_matrix",
    "plot_memory",
    "plot_pred_vs_measured",
    "plot_step_vs_accum",
    "plot_what_if",
    "throughput",
    "world_size_for",
]
