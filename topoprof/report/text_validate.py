"""The `topoprof validate` result as text: calibration, fit, measured vs predicted per mode, and
the numerics check."""
from __future__ import annotations


def render_validate(payload: dict) -> str:
    s = payload["setup"]
    out = [f"topoprof validate: {payload['label']} ({s['params']:,} params), {s['nproc']} rank(s) on {s['backend']}, "
           f"micro-batch {s['micro_batch']}, K = {s['accum']}, {s['steps']} timed step(s)"]
    cal = payload.get("calibration")
    if cal:
        out.append(f"calibration: forward+backward {cal['micro_batch_time_s'] * 1e3:.1f} ms per micro-batch "
                   f"(backward {cal['backward_fraction']:.0%}), optimizer {cal['optimizer_time_s'] * 1e3:.1f} ms, "
                   f"compute x{cal.get('compute_slowdown_during_comm', 1):.2f} slower beside an all-reduce, "
                   f"all-reduce x{cal.get('comm_slowdown_during_compute', 1):.2f} slower beside compute")
    fit = payload.get("fit")
    if fit is not None:
        out.append(f"all-reduce fit on these ranks: {fit.latency_us:.0f} us + S / {fit.bandwidth_gbps:.3f} GB/s")
    out += ["", f"{'mode':<28}{'measured ms':>13}{'predicted ms':>14}{'error':>9}"]
    for mode, m in payload["modes"].items():
        meas = "-" if m["measured_step_s"] is None else f"{m['measured_step_s'] * 1e3:.1f}"
        pred = "-" if m["predicted_step_s"] is None else f"{m['predicted_step_s'] * 1e3:.1f}"
        err = "-" if m["error_pct"] is None else f"{m['error_pct']:+.1f}%"
        out.append(f"{mode:<28}{meas:>13}{pred:>14}{err:>9}")
    num = payload.get("numerics")
    if num:
        out += ["", f"Numerics after one optimizer step on the same global batch ({num.get('dtype')}), "
                    "vs one process accumulating the whole batch:"]
        for mode in ("ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only"):
            if mode in num:
                ok = "agree" if num[mode]["allclose"] else "DIFFER"
                out.append(f"  {mode:<28} max |diff| {num[mode]['max_abs_diff_vs_single']:.2e}  {ok}")
    summ = payload["summary"]
    if summ.get("cases"):
        out += ["", f"median |error| {summ['median_abs_error_pct']:.1f}%, worst {summ['worst_abs_error_pct']:.1f}% "
                    f"over {summ['cases']} mode(s)"]
    return "\n".join(out) + "\n"
