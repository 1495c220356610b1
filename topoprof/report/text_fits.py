"""What fits, first: the largest micro-batch per strategy and activation checkpointing mode, the
fastest combination that fits, what each mode costs in time and no_sync in memory
(`topoprof.model.strategies.search`), and every part of the memory count with its source. Plain
lines, for `topoprof model`'s text and a scan's Markdown alike."""
from __future__ import annotations

from topoprof.model.strategies.model_report import ModelReport
from topoprof.model.strategies.results import Memory
from topoprof.model.strategies.search import MAX_MICRO_BATCH, FitCell, Fits

# The memory parts in the order shown, with their names in the table.
PARTS = (("params", "weights"), ("grads", "gradients"), ("optimizer", "optimizer state"), ("buckets", "DDP buckets"),
         ("unsharded", "FSDP unsharded"), ("activations", "activations"), ("logits", "logits and loss"),
         ("param_copies", "autocast copies"), ("backward_transient", "backward transient"),
         ("optimizer_transient", "optimizer step transient"), ("cublas_workspace", "cuBLAS workspace"),
         ("cuda_context", "CUDA context"),
         ("driver_reserve", "driver reserve"), ("nccl_buffers", "NCCL buffers"), ("allocator", "allocator reserve"))

# The strategies whose memory the parts table shows (one of DDP's, which all hold the same).
PARTS_COLUMNS = ("single", "dp", "ddp_synced", "fsdp_full_shard", "fsdp_full_shard_no_sync", "fsdp_shard_grad_op",
                 "fsdp_shard_grad_op_no_sync", "hsdp", "hsdp_no_sync")


def _gb(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _at_ceiling(c: FitCell) -> bool:
    """It fits at the search's largest size, which is as far as the search goes (no size past it
    was counted, so none is known not to fit)."""
    return bool(c.micro_batch) and c.next_gb is None


def _cell(c: FitCell) -> str:
    if c.micro_batch:
        return f"{'>=' if _at_ceiling(c) else ''}{c.micro_batch} ({c.total_gb:,.1f} GB)"
    if c.total_gb is not None:
        return f"0 (1: {c.total_gb:,.0f} GB)"
    return "?"


def fits_lines(fits: Fits | None) -> list[str]:
    """The lead: what fits and what is fastest (module docstring)."""
    if fits is None:
        return []
    gpu = fits.gpu_memory_gb
    seq = f", {fits.tokens_per_sample} tokens per sequence" if fits.tokens_per_sample else ""
    head = (f"What fits on a GPU of {gpu:,.1f} GB ({fits.gpu_memory_source}){seq}, K = {fits.accumulation_steps}:"
            if gpu else "What fits:")
    if fits.reason:
        return [head, f"  not searched: {fits.reason}", ""]
    modes = fits.modes
    out = [head, "  the largest micro-batch (sequences) that fits, per strategy and activation checkpointing mode "
                 "(memory per GPU at that size, the top of its range; 0: not even 1, and what 1 needs):",
           "  " + f"{'strategy':<30}" + "".join(f"{m:>18}" for m in modes)]
    for row in fits.largest:
        names = row.strategies
        label = names[0] if len(names) == 1 else f"{names[0]} (and {len(names) - 1} more)"
        out.append("  " + f"{label:<30}" + "".join(f"{_cell(row.cells[m]):>18}" for m in modes))
    unknown = sorted({c.reason for row in fits.largest for c in (row.cells[m] for m in modes)
                      if not c.micro_batch and c.total_gb is None and c.reason})
    out += [f"  ?: {r}" for r in unknown]
    if any(_at_ceiling(row.cells[m]) for row in fits.largest for m in modes):
        out.append(f"  >=: it fits at {MAX_MICRO_BATCH}, the largest size searched; larger ones were not counted")
    out += _fastest_lines(fits) + _cost_lines(fits) + _no_sync_lines(fits)
    return out + [""]


def _fastest_lines(fits: Fits) -> list[str]:
    if fits.fastest_reason:
        return [f"  Fastest that fits: not priced ({fits.fastest_reason})."]
    best = fits.fastest
    unranked = [f"    not ranked: {name}, as {why}." for name, why in fits.unranked.items()]
    if not best:
        return [f"  Fastest that fits: {'nothing ranked fits' if unranked else 'nothing fits'}."] + unranked
    b = best[0]
    out = [f"  Fastest that fits: {b.strategy} with activation checkpointing {b.mode} at micro-batch "
           f"{b.micro_batch}: {b.samples_per_s:,.2f} samples/s (step {b.step_time_s * 1e3:,.1f} ms, "
           f"{b.memory_gb:,.1f} GB per GPU)" + (", the largest size searched." if b.micro_batch >= MAX_MICRO_BATCH
                                                else ".")]
    if len(best) > 1:
        out.append("    then: " + "; ".join(f"{c.strategy} {c.mode} x{c.micro_batch} {c.samples_per_s:,.2f}"
                                            for c in best[1:]))
    return out + unranked


def _cost_lines(fits: Fits) -> list[str]:
    costs = [c for c in fits.mode_costs if c.mode != "none"]
    if not costs:
        return []
    parts = [f"{c.mode} +{c.extra_s * 1e3:,.0f} ms ({100 * c.extra_s / (c.micro_batch_s - c.extra_s):+.0f} %"
             f", recompute {c.recompute_s * 1e3:,.0f} ms)" for c in costs]
    return [f"  What checkpointing costs per micro-batch of {fits.micro_batch_now} (its compute over none's; its "
            f"recompute priced alone): {'; '.join(parts)}."]


def _no_sync_lines(fits: Fits) -> list[str]:
    if not fits.no_sync:
        return []
    return ["  no_sync holds every group's full-size gradient until the micro-batch that syncs: "
            + "; ".join(f"{r.no_sync} +{r.extra_gb:,.1f} GB per GPU over {r.synced}" for r in fits.no_sync) + "."]


def memory_parts_lines(report: ModelReport) -> list[str]:
    """Every part of the memory per GPU for the strategies that apply, and where each comes from."""
    mems = {n: m for n in PARTS_COLUMNS if (m := _memory(report, n)) is not None}
    columns = list(mems)
    if not columns:
        return []
    gpu = report.value("gpu_memory_gb")
    out = ["", f"Memory per GPU, part by part (GB; GPU {_gb(gpu)} GB: {report.source('gpu_memory_gb')}):"]
    names = [_name_lines(n) for n in columns]
    for i in range(max(map(len, names))):
        head = "part" if i == 0 else ""
        out.append(("  " + f"{head:<26}" + "".join(f"{(lines[i] if i < len(lines) else ''):>15}"
                                                   for lines in names)).rstrip())
    for key, label in PARTS:
        values = [mems[n].parts_gb.get(key) for n in columns]
        if all(v is None or v == 0 for v in values) and key not in ("activations",):
            continue
        out.append("  " + f"{label:<26}" + "".join(f"{_gb(v):>15}" for v in values))
    if all(mems[n].peak_gb is not None for n in columns):
        out.append("  " + f"{'allocated peak':<26}" + "".join(f"{_gb(mems[n].peak_gb):>15}" for n in columns))
        out.append("  " + f"{'reserved (range)':<26}" + "".join(f"{_span(mems[n].reserved_gb):>15}" for n in columns))
    out.append("  " + f"{'total (range)':<26}" + "".join(f"{_range(mems[n]):>15}" for n in columns))
    fit_text = {True: "fits", False: "no", None: "maybe" if gpu is not None else "?"}
    out.append("  " + f"{'fits':<26}" + "".join(f"{fit_text[mems[n].fits]:>15}" for n in columns))
    out += ["  (the parts never all coexist: the allocated peak is the most the step holds at once, the reserved range "
            "adds the caching allocator's reserve above it, the total the rest of the environment at the ends of its "
            "ranges; the fit reads the total)"]
    where: dict[str, list[str]] = {}
    for n in columns:
        if mems[n].peak_at:
            where.setdefault(mems[n].peak_at, []).append(n)
    out += [f"  peak of {', '.join(names)}: at {text}" for text, names in where.items()]
    sources: dict[str, list[str]] = {}
    for n in columns:
        for key, text in mems[n].sources.items():
            sources.setdefault(key, [])
            if text not in sources[key]:
                sources[key].append(text)
    labels = dict(PARTS)
    for key, texts in sources.items():  # a text that another one extends is said once, by the longer
        kept = [t for t in texts if not any(o != t and o.startswith(t) for o in texts)]
        out.append(f"  {labels.get(key, key)}: {' | '.join(kept)}")
    return out


def _name_lines(name: str, width: int = 14) -> list[str]:
    """A strategy's name in lines of at most `width` for a column's head, broken at underscores and
    its `no_sync` on a line of its own: fsdp_full_shard and fsdp_full_shard_no_sync stay apart."""
    base, no_sync = (name[:-len("_no_sync")], True) if name.endswith("_no_sync") else (name, False)
    lines: list[str] = []
    for word in base.split("_"):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += "_" + word
        else:
            lines.append(word)
    return lines + ["no_sync"] if no_sync else lines


def _memory(report: ModelReport, name: str) -> Memory | None:
    result = report.result(name)
    return None if result is None else result.memory


def _span(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return "-"
    lo, hi = pair
    return f"{lo:,.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:,.1f}-{hi:,.1f}"


def _range(mem: Memory) -> str:
    lo, hi = mem.range_gb or (mem.total_gb, mem.total_gb)
    return f"{lo:,.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:,.1f}-{hi:,.1f}"
