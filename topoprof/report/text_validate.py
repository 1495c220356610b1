"""The `topoprof validate` result as text: the calibration with each input's spread, measured vs
predicted per mode with the predicted range, where each step's time went, and the numerics."""
from __future__ import annotations

from topoprof.model.validate.report import Calibration, ModeCheck, ValidateReport
from topoprof.model.validate.rotations import Spread

PARTS = ("compute", "exposed_comm", "optimizer", "other")
# The calibration's inputs as a reader knows them, in the order the model uses them.
INPUTS = (("micro_batch_time_s", "forward+backward per micro-batch", "ms"),
          ("ddp_overhead_s", "+ through DDP's hooks (no_sync)", "ms"),
          ("ddp_copies_s", "+ DDP's bucket copies (synced)", "ms"),
          ("optimizer_time_s", "optimizer step", "ms"),
          ("fsdp_forward_cost_s", "+ through FSDP, forward (no comm)", "ms"),
          ("fsdp_backward_cost_s", "+ through FSDP, backward synced", "ms"),
          ("fsdp_backward_no_sync_cost_s", "+ through FSDP, backward no_sync", "ms"),
          ("fsdp_unshard_cost_s", "+ FSDP's all-gathers in backward", "ms"),
          ("fsdp_optimizer_time_s", "optimizer step on FSDP's shards", "ms"),
          ("compute_slowdown_during_comm", "compute slowdown beside an all-reduce", "x"),
          ("comm_slowdown_during_compute", "all-reduce slowdown beside compute", "x"))


def _value(v: float, unit: str) -> str:
    return f"{v * 1e3:.1f} ms" if unit == "ms" else f"x{v:.2f}"


def spread_rows(cal: Calibration) -> list[tuple[Spread, str, str]]:
    """(spread, label, unit) of each input measured: the model's, then the all-reduce beside
    compute by size, then FSDP's collectives between compute by size."""
    spread = cal.spread
    rows = [(spread[key], label, unit) for key, label, unit in INPUTS
            if key != "comm_slowdown_during_compute" and key in spread]
    rows += [(s, f"all-reduce of {_size(key)} beside compute", "x") for key, s in spread.items()
             if key.startswith("comm_slowdown_at_")]
    rows += [(s, f"FSDP {key.split('_at_')[0][5:].replace('_', '-')} of {_size(key)} between compute", "ms")
             for key, s in spread.items() if key.startswith("fsdp_") and "_at_" in key]
    return rows


def calibration_lines(cal: Calibration) -> list[str]:
    out = [f"calibration over {cal.rotations if cal.rotations is not None else '?'} rotation(s) ({cal.combine}):"]
    for s, label, unit in spread_rows(cal):
        out.append(f"  {label:<48} {_value(s.value, unit):>10}   quartiles {_value(s.p25, unit)} .. "
                   f"{_value(s.p75, unit)}, n = {s.n}")
    if cal.ddp_copies_basis:  # how the copies are carried to other models
        out.append(f"  {cal.ddp_copies_basis}")
    return out


def _size(key: str) -> str:
    n = int(key.split("_")[-2])
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def mode_lines(modes: dict[str, ModeCheck]) -> list[str]:
    out = [f"{'mode':<28}{'measured ms':>13}{'predicted ms':>14}{'range ms':>19}{'error':>9}"]
    for mode, m in modes.items():
        rng = m.predicted_range_s
        span = "-" if not rng else f"{_ms(rng[0])}-{_ms(rng[1])}" + ("" if m.inside_range is None else
                                                                      (" in" if m.inside_range else " out"))
        err = "-" if m.error_pct is None else f"{m.error_pct:+.1f}%"
        out.append(f"{mode:<28}{_ms(m.measured_step_s):>13}{_ms(m.predicted_step_s):>14}{span:>19}{err:>9}")
    return out + [MATCHED_NOTE]


# Why the error is not the ratio of the two medians beside it.
MATCHED_NOTE = ("(medians over rotations; the error compares each rotation's prediction with that rotation's "
                "step, median over rotations; the range spans the per-rotation predictions)")


# What a one-rank run is for: DDP's own costs, measured, carried to more GPUs by `model`.
ONE_RANK_NOTE = ("One rank: nothing is all-reduced across ranks, so no mode is predicted here. The calibration "
                 "above is what this run gives: DDP's own costs at world size 1 (its hooks, bucket copies and "
                 "kernels; FSDP's where its modes ran), measured; `--save-calibration FILE` and `topoprof model "
                 "--calibration FILE` carry them to more GPUs.")


def parts_lines(modes: dict[str, ModeCheck]) -> list[str]:
    """Where each step went, measured beside predicted: the part that differs most names the miss."""
    out = ["", "Where the time went (ms, measured / predicted):",
           f"{'mode':<28}" + "".join(f"{p:>19}" for p in PARTS)]
    for mode, m in modes.items():
        meas, pred = m.parts.measured, m.parts.predicted
        if not meas or not pred:
            continue
        out.append(f"{mode:<28}" + "".join(f"{_ms(meas[p]) + ' / ' + _ms(pred[p]):>19}" for p in PARTS))
    return out


def render_validate(report: ValidateReport) -> str:
    s = report.setup
    assert s is not None  # the command's report always carries its setup
    batch = "its example batch per micro-batch" if report.user_model else f"micro-batch {s.micro_batch}"
    ac = f", activation checkpointing {s.activation_checkpointing}" if s.activation_checkpointing else ""
    out = [f"topoprof validate: {report.label} ({s.params:,} params), {s.nproc} rank(s) on "
           f"{s.backend}, {batch}, K = {s.accum}, {s.steps} timed rotation(s){ac}"]
    if report.calibration is not None:
        out += calibration_lines(report.calibration)
    fit = report.fit
    if fit is not None:
        bandwidth = "inf" if fit.bandwidth_gbps is None else f"{fit.bandwidth_gbps:.3f}"
        out.append(f"all-reduce fit on these ranks: {fit.latency_us:.0f} us + S / {bandwidth} GB/s")
    out += [""] + mode_lines(report.modes)
    out += [ONE_RANK_NOTE] if s.nproc == 1 else parts_lines(report.modes)
    num = report.numerics
    if num is not None:
        plain = f" (every mode checkpointed {num.ac}, the process not)" if num.ac != "none" else ""
        out += ["", f"Numerics after one optimizer step on the same global batch ({num.dtype}), "
                    f"vs one process accumulating the whole batch{plain}:"]
        for mode in num.checked():
            check = num.checks[mode]
            out.append(f"  {mode:<28} max |diff| {check.max_abs_diff_vs_single:.2e}  "
                       f"{'agree' if check.allclose else 'DIFFER'}")
    summ = report.summary
    if summ is not None and summ.cases:
        out += ["", f"median |error| {summ.median_abs_error_pct:.1f}%, worst {summ.worst_abs_error_pct:.1f}% "
                    f"over {summ.cases} mode(s); {summ.inside_range} of {summ.cases} inside the predicted range"]
    return "\n".join(out) + "\n"
