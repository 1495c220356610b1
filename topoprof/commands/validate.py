"""`topoprof validate`: real training loops per strategy, predicted vs measured, and numerics."""
from __future__ import annotations

import json
import sys

import click

from topoprof.errors import InputError, RunFailed


def _spec(params: str | None, preset: str | None, scale: float, seq_len: int):
    from topoprof.synthetic import spec_for_params, spec_for_preset

    if params and preset:
        raise InputError("give --params or --preset, not both")
    if preset:
        return spec_for_preset(preset, scale, seq_len=seq_len), f"{preset} x{scale:g}"
    from topoprof.commands.model import parse_count

    n = parse_count(params or "2M")
    return spec_for_params(n, seq_len=seq_len), f"synthetic {n / 1e6:g}M"


def validate_payload(result, opts) -> dict:
    from topoprof.fit import fit_rows
    from topoprof.validate import summary

    fit = fit_rows(result.bench_rows, "all_reduce") if result.bench_rows else None
    return {"status": result.status, "error": result.error, "label": result.label,
            "modes": result.modes(), "numerics": result.numerics, "calibration": result.calibration,
            "fit": fit, "bench_rows": result.bench_rows, "summary": summary([result]),
            "setup": {"backend": opts.backend, "nproc": opts.nproc, "spec": opts.spec,
                      "params": opts.spec.params, "micro_batch": opts.micro_batch, "accum": opts.accum,
                      "steps": opts.steps, "warmup_steps": opts.warmup_steps, "threads": opts.threads,
                      "step_rule": "a step's time is the max over ranks; the median over timed steps"},
            "wall_s": result.wall_s}


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


def _save_calibration(path: str, payload: dict) -> None:
    from topoprof.gpu_specs import CALIBRATION_KEYS

    from topoprof.jsonio import write_text

    cal = payload.get("calibration") or {}
    write_text(path, json.dumps({"calibration": {k: cal[k] for k in CALIBRATION_KEYS if k in cal},
                                 "measured_on": payload["setup"]}, indent=2, default=str), "--save-calibration")


@click.command()
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None)
@click.option("--nproc", type=click.IntRange(min=1), default=None)
@click.option("--params", help="Synthetic model size (default 2M): 500K, 10M, 125M.")
@click.option("--preset", help="A preset's shape, scaled by --scale: gpt2, gpt2-medium, bert-base, llama-7b.")
@click.option("--scale", type=float, default=0.05, show_default=True, help="Parameter scale for --preset.")
@click.option("--seq-len", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--micro-batch", type=click.IntRange(min=1), default=4, show_default=True, help="Samples per rank per micro-batch.")
@click.option("--accum", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--warmup-steps", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--modes", default="ddp_synced,ddp_no_sync,ddp_no_sync_backward_only", show_default=True,
              help="Comma list; add dp where >= 2 GPUs exist.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads per CPU rank (default: the cores divided among the ranks).")
@click.option("--numerics/--no-numerics", default=True, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--save-calibration", type=click.Path(dir_okay=False), help="Write the calibration for `topoprof model --calibration`.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="Also write the JSON here.")
def validate(backend, nproc, params, preset, scale, seq_len, micro_batch, accum, steps, warmup_steps, modes,
             threads, numerics, timeout_s, save_calibration, as_json, out_path):
    """Run short real training loops for each strategy and compare with the model's prediction."""
    from topoprof.jsonio import dumps, envelope, write_text
    from topoprof.runner import default_backend_and_nproc
    from topoprof.validate import ValidateOptions, cpu_threads_per_rank, run_validate

    from topoprof.jsonio import check_writable

    check_writable(out_path, "--out")
    check_writable(save_calibration, "--save-calibration")
    backend, nproc, note = default_backend_and_nproc(backend, nproc)
    spec, label = _spec(params, preset, scale, seq_len)
    if threads is None and backend == "gloo":
        threads = cpu_threads_per_rank(nproc)
    opts = ValidateOptions(backend=backend, nproc=nproc, spec=spec, label=label, micro_batch=micro_batch,
                           accum=accum, steps=steps, warmup_steps=warmup_steps,
                           modes=tuple(m.strip() for m in modes.split(",") if m.strip()), threads=threads,
                           numerics=numerics, timeout_s=timeout_s)
    progress = None
    if not as_json and sys.stderr.isatty():
        progress = lambda step: (sys.stderr.write(f"\r\033[K  {step}"), sys.stderr.flush())  # noqa: E731
    result = run_validate(opts, on_progress=progress)
    if progress:
        sys.stderr.write("\r\033[K")
    from topoprof.launch import is_reporting_rank

    if not is_reporting_rank():
        if result.status != "ok":
            raise RunFailed(f"{result.error}")
        return  # rank 0 of the job prints and writes
    payload = validate_payload(result, opts)
    doc = envelope("validate", payload)
    if out_path:
        write_text(out_path, dumps(doc) + "\n", "--out")
    if save_calibration and result.calibration:
        _save_calibration(save_calibration, payload)
    click.echo(dumps(doc) if as_json else render_validate(payload))
    if result.status != "ok":
        raise RunFailed(f"{result.error}; results measured before the failure were kept")
