"""Validation: real training loops for every strategy, measured against the model's prediction.

One launcher start runs, on the same ranks and links: an all-reduce sweep (the fit the model
uses), a calibration (every rank trains its own copy alone, at the same time as the DDP runs
will: compute per micro-batch, backward share, optimizer time, and the slowdown of compute while
an all-reduce is in flight), each DDP mode, and the numerics check. Then every mode is predicted
from those measurements and compared with what it measured.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
from dataclasses import dataclass, field

from topoprof.errors import InputError
from topoprof.model.synthetic import SyntheticSpec

DDP_MODES = ("ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only")
# Sizes for the fit: the model all-reduces buckets from a few KiB (tiny models) up to 25 MiB.
FIT_SIZES = tuple(4096 * 2 ** i for i in range(13))  # 4 KiB .. 16 MiB, every power of two


@dataclass(frozen=True)
class ValidateOptions:
    backend: str
    nproc: int
    spec: SyntheticSpec
    label: str
    micro_batch: int = 4
    accum: int = 4
    steps: int = 5
    warmup_steps: int = 2
    modes: tuple[str, ...] = DDP_MODES
    threads: int | None = None
    numerics: bool = True
    timeout_s: float = 300.0
    bench_iters: int = 5

    def __post_init__(self):
        if self.nproc < 2:
            raise InputError(f"--nproc {self.nproc}: validation compares DDP across ranks; it needs >= 2")
        for name, value in (("--micro-batch", self.micro_batch), ("--accum", self.accum), ("--steps", self.steps)):
            if value < 1:
                raise InputError(f"{name} {value}: must be >= 1")
        unknown = [m for m in self.modes if m not in DDP_MODES + ("dp",)]
        if unknown:
            raise InputError(f"--modes {','.join(unknown)}: valid modes are {', '.join(DDP_MODES + ('dp',))}")


def cpu_threads_per_rank(nproc: int) -> int:
    """CPU ranks share the cores: give each its share, as torchrun's OMP_NUM_THREADS=1 default
    intends (torch/distributed/run.py), so ranks do not oversubscribe the machine."""
    return max(1, (os.cpu_count() or 1) // nproc)


def _train(opts: ValidateOptions, mode: str) -> dict:
    return {"spec": dataclasses.asdict(opts.spec), "mode": mode, "micro_batch": opts.micro_batch,
            "accum": opts.accum, "steps": opts.steps, "warmup_steps": opts.warmup_steps,
            "threads": opts.threads, "optimizer": "adamw", "seed": 0}


def phases(opts: ValidateOptions) -> list[dict]:
    bench = {"collectives": ["all_reduce"], "sizes": list(FIT_SIZES), "iters": opts.bench_iters,
             "warmup": 2, "dtype": "float32", "combine": "avg", "check": True}
    out = [{"name": "bench", "worker": "collectives", "config": bench},
           {"name": "calibration", "worker": "training", "config": _train(opts, "single")}]
    # DataParallel is one process over every GPU: it runs in a launch of its own (`dp_phase`).
    out += [{"name": mode, "worker": "training", "config": _train(opts, mode)} for mode in opts.modes
            if mode != "dp"]
    if opts.numerics:
        out.append({"name": "numerics", "worker": "training",
                    "config": {**_train(opts, "numerics"), "steps": 1, "warmup_steps": 0}})
    return out


@dataclass
class ValidateResult:
    label: str
    status: str = "ok"
    error: str | None = None
    bench_rows: list = field(default_factory=list)
    calibration: dict | None = None
    measured: dict = field(default_factory=dict)      # mode -> result message
    numerics: dict | None = None
    predictions: dict = field(default_factory=dict)   # mode -> predicted step seconds
    wall_s: float = 0.0

    def modes(self) -> dict:
        out = {}
        for mode, pred in self.predictions.items():
            meas = self.measured.get(mode, {}).get("step_time_s")
            err = None if meas is None or pred is None else 100.0 * (pred - meas) / meas
            out[mode] = {"measured_step_s": meas, "predicted_step_s": pred, "error_pct": err}
        return out


def collect(result: ValidateResult):
    """An on_message handler that files every rank-0 message under its phase."""
    from topoprof.measure.collectives import row_from_dict

    def on_message(rank: int, msg: dict) -> None:
        kind, phase = msg.get("type"), msg.get("phase")
        if kind == "row" and phase == "bench":
            result.bench_rows.append(row_from_dict(msg["row"]))
        elif kind == "calibration":
            result.calibration = {k: v for k, v in msg.items() if k not in ("type", "phase")}
        elif kind == "result" and phase in DDP_MODES + ("dp",):
            result.measured[phase] = {k: v for k, v in msg.items() if k not in ("type", "phase")}
        elif kind == "numerics":
            result.numerics = {k: v for k, v in msg.items() if k not in ("type", "phase")}
    return on_message


def predict(opts: ValidateOptions, result: ValidateResult) -> None:
    """Fill result.predictions from the measured fit and calibration, with the cost model."""
    from topoprof.model.strategies import Cluster, ModelInputs, Workload
    from topoprof.model.strategies import predict as model_predict
    from topoprof.measure.fit import fit_rows
    from topoprof.model.compute import CALIBRATION_KEYS, Compute
    from topoprof.model.links import measured_comm

    job_rows = [r for r in result.bench_rows if r.level == "job"]
    fit = fit_rows(job_rows, "all_reduce")
    if fit is None or result.calibration is None or not fit.bandwidth_gbps or fit.bandwidth_gbps == float("inf"):
        return
    cal = {k: result.calibration[k] for k in CALIBRATION_KEYS if result.calibration.get(k) is not None}
    workload = Workload(opts.spec.layout(), micro_batch_size=opts.micro_batch,
                        tokens_per_micro_batch=opts.micro_batch * opts.spec.seq_len)
    comm = measured_comm(job_rows, fit, opts.nproc, "all-reduce measured on these ranks")
    inputs = ModelInputs(workload, Compute.from_calibration(cal, optimizer="adamw"),
                         Cluster(comm, nodes=1, gpus_per_node=opts.nproc), accumulation_steps=opts.accum)
    prediction = model_predict(inputs)
    for mode in opts.modes:
        strategy = prediction.strategies.get(mode)
        result.predictions[mode] = getattr(strategy, "step_time_s", None)


def run_validate(opts: ValidateOptions, on_progress=None) -> ValidateResult:
    from topoprof.measure.launch import JobSpec
    from topoprof.measure.runner import run_job

    result = ValidateResult(label=opts.label)
    handler = collect(result)

    def on_message(rank, msg):
        handler(rank, msg)
        if on_progress and msg.get("type") == "progress" and rank == 0:
            on_progress(f"{msg.get('phase')}: {msg.get('step')}")

    spec = JobSpec("phases", {"phases": phases(opts)}, opts.nproc, opts.backend, opts.timeout_s)
    run = run_job(spec, on_message)
    result.wall_s = run.wall_s
    if run.failure is not None:
        result.status, result.error = "error", run.failure.describe()
    elif "dp" in opts.modes:
        _run_dp(opts, result, on_message)
    predict(opts, result)
    return result


def _run_dp(opts: ValidateOptions, result: ValidateResult, on_message) -> None:
    """torch.nn.DataParallel in one process over every visible GPU, after the DDP ranks are gone
    (a rank waiting beside it would hold a GPU it uses)."""
    from topoprof.measure.launch import JobSpec, external_job, launch_local

    if external_job() is not None:
        result.measured["dp"] = {"skipped": "DataParallel is one process: run `topoprof validate --modes dp` "
                                            "outside torchrun/srun"}
        return
    phase = [{"name": "dp", "worker": "training", "config": _train(opts, "dp")}]
    run = launch_local(JobSpec("phases", {"phases": phase}, 1, opts.backend, opts.timeout_s), on_message)
    result.wall_s += run.wall_s
    if run.failure is not None:
        result.status, result.error = "error", f"dp: {run.failure.describe()}"


def summary(results: list[ValidateResult]) -> dict:
    """Median and worst |error| over every DDP mode of every case."""
    errors = [abs(m["error_pct"]) for r in results for m in r.modes().values() if m["error_pct"] is not None]
    if not errors:
        return {"cases": 0}
    return {"cases": len(errors), "median_abs_error_pct": statistics.median(errors), "worst_abs_error_pct": max(errors)}


def spec_from_options(params: str | None, preset: str | None, scale: float, seq_len: int):
    from topoprof.model.synthetic import spec_for_params, spec_for_preset

    if params and preset:
        raise InputError("give --params or --preset, not both")
    if preset:
        return spec_for_preset(preset, scale, seq_len=seq_len), f"{preset} x{scale:g}"
    from topoprof.model.inputs import parse_count

    n = parse_count(params or "2M")
    return spec_for_params(n, seq_len=seq_len), f"synthetic {n / 1e6:g}M"


def validate_payload(result, opts) -> dict:
    from topoprof.measure.fit import fit_rows
    from topoprof.model.validate import summary

    fit = fit_rows(result.bench_rows, "all_reduce") if result.bench_rows else None
    return {"status": result.status, "error": result.error, "label": result.label,
            "modes": result.modes(), "numerics": result.numerics, "calibration": result.calibration,
            "fit": fit, "bench_rows": result.bench_rows, "summary": summary([result]),
            "setup": {"backend": opts.backend, "nproc": opts.nproc, "spec": opts.spec,
                      "params": opts.spec.params, "micro_batch": opts.micro_batch, "accum": opts.accum,
                      "steps": opts.steps, "warmup_steps": opts.warmup_steps, "threads": opts.threads,
                      "step_rule": "a step's time is the max over ranks; the median over timed steps"},
            "wall_s": result.wall_s}


def save_calibration(path: str, payload: dict) -> None:
    from topoprof.model.compute import CALIBRATION_KEYS

    from topoprof.jsonio import write_text

    cal = payload.get("calibration") or {}
    write_text(path, json.dumps({"calibration": {k: cal[k] for k in CALIBRATION_KEYS if k in cal},
                                 "measured_on": payload["setup"]}, indent=2, default=str), "--save-calibration")
