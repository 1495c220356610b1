"""Validation: real training loops for every strategy, measured against the model's prediction.

One launcher start runs, on the same ranks and links: an all-reduce sweep (the curve the model
interpolates), then rotations (probes/ranks/validation.py) in which every rank's calibration (compute
per micro-batch alone and through DDP's hooks, the optimizer), one step of each DDP mode with its
timeline, each bucket's all-reduce alone and the interference between compute and communication
are measured in turns, so that a drifting machine moves inputs and steps together; then the
numerics check. FSDP2's modes join the rotations when asked for (`--modes`, or `all`), with the
inputs their timeline needs (topoprof.model.fsdp). Every mode is predicted from the measured inputs
(`topoprof.model.validate.rotations` says which statistic of each), with a range from their spread, and compared with
what it measured, part by part: compute, exposed communication, optimizer, the rest.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
from dataclasses import dataclass, field

from topoprof.errors import InputError, NothingMeasured
from topoprof.jsonio import write_text
from topoprof.measure.fit import fit_rows
from topoprof.measure.launch import JobSpec, as_message, external_job, launch_local
from topoprof.measure.runner import run_job
from topoprof.model.comm.collectives import SingleGpuComm
from topoprof.model.comm.links import measured_comm
from topoprof.model.compute.timing import CALIBRATION_KEYS, Compute
from topoprof.model.ddp.buckets import ddp_buckets
from topoprof.model.ddp.gpu_costs import ddp_kernels
from topoprof.model.ddp.timeline import ddp_copy_bytes
from topoprof.model.fsdp.plan import fsdp_plan
from topoprof.model.inputs.request import parse_count
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.predict import predict as model_predict
from topoprof.model.strategies.resolve import resolve
from topoprof.model.strategies.steps import step_components
from topoprof.model.validate import rotations as rot
from topoprof.specs.collective_spec import row_from_dict
from topoprof.specs.fsdp_modes import FSDP_ONE_NODE, FSDP_STRATEGIES
from topoprof.specs.messages import (
    CollectiveRow,
    CollectivesJob,
    NumericsJob,
    NumericsResult,
    PhasesJob,
    Progress,
    TrainingJob,
    TrainingResult,
    ValidationJob,
    ValidationRotations,
    fields_of,
    phase,
    phase_of,
)
from topoprof.workload.checkpointing import parse_checkpointing
from topoprof.workload.layout import Layout
from topoprof.workload.synthetic import SyntheticSpec, spec_for_params, spec_for_preset

DDP_MODES = ("ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only")
# `--modes all`: every mode these ranks run in one launch (dp, one process over the GPUs, is asked
# for by name)
ALL_MODES = DDP_MODES + FSDP_ONE_NODE
# FSDP's own work is timed between collectives that block the rank, as gloo's do; NCCL returns as
# soon as a collective is queued, and those timings are not built for it
FSDP_BACKENDS = ("gloo",)
VALID_MODES = ALL_MODES + ("dp",)
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
    # `--model PATH:CALLABLE`: the user's model, trained instead of `spec`, and its layout as
    # measured (`topoprof.model.inputs.user_record.user_layout`)
    user_model: str | None = None
    user_layout: Layout | None = None
    ac: str = "none"  # the blocks' activation checkpointing (topoprof.workload.checkpointing)

    @property
    def layout(self) -> Layout:
        return self.user_layout if self.user_layout is not None else self.spec.layout()

    @property
    def tokens_per_micro_batch(self) -> int | None:
        return None if self.user_model else self.micro_batch * self.spec.seq_len

    def __post_init__(self):
        if self.nproc < 1:
            raise InputError(f"--nproc {self.nproc}: must be >= 1")
        for name, value in (("--micro-batch", self.micro_batch), ("--accum", self.accum), ("--steps", self.steps)):
            if value < 1:
                raise InputError(f"{name} {value}: must be >= 1")
        hsdp = [m for m in self.modes if m in FSDP_STRATEGIES and m not in FSDP_ONE_NODE]
        if hsdp:
            raise InputError(f"--modes {','.join(hsdp)}: HSDP replicates across nodes and validate runs its "
                             "FSDP modes on one node (use fsdp_full_shard)")
        unknown = [m for m in self.modes if m not in VALID_MODES]
        if unknown:
            raise InputError(f"--modes {','.join(unknown)}: valid modes are all, {', '.join(VALID_MODES)}")
        fsdp = [m for m in self.modes if m in FSDP_ONE_NODE]
        if fsdp and self.backend not in FSDP_BACKENDS:
            raise InputError(f"--modes {','.join(fsdp)}: FSDP is validated on CPU ranks (--backend gloo); "
                             f"with --backend {self.backend} its timings are not built")
        if fsdp and self.user_model:
            raise InputError(f"--modes {','.join(fsdp)}: FSDP wraps the synthetic model's blocks; wrapping a "
                             "--model's modules is not supported")
        if not self.modes:
            raise InputError("--modes: give at least one mode")

        object.__setattr__(self, "ac", parse_checkpointing(self.ac).text)
        if self.user_model and self.ac != "none":
            raise InputError(f"--activation-checkpointing {self.ac}: checkpoints the synthetic model's blocks; a "
                             "--model checkpoints as its own code does")


def parse_modes(text: str, backend: str = "gloo", fsdp_missing: str | None = None) -> tuple[str, ...]:
    """`--modes`: a comma list; `all` stands for ALL_MODES on gloo, and for the DDP modes on a
    backend FSDP is not validated on (ValidateOptions refuses FSDP there) or where the torch
    installed cannot run FSDP's modes: `fsdp_missing` says why (topoprof.measure.torch_support),
    and an FSDP mode named there is refused with that reason."""
    every = ALL_MODES if backend in FSDP_BACKENDS and fsdp_missing is None else DDP_MODES
    out: list[str] = []
    for mode in (m.strip() for m in text.split(",")):
        for m in (every if mode == "all" else (mode,) if mode else ()):
            if m not in out:
                out.append(m)
    fsdp = [m for m in out if m in FSDP_ONE_NODE]
    if fsdp and fsdp_missing is not None:
        raise NothingMeasured(f"--modes {','.join(fsdp)}: {fsdp_missing}")
    return tuple(out)


def cpu_threads_per_rank(nproc: int) -> int:
    """CPU ranks share the cores this process may run on (its affinity: a SLURM or cgroup CPU set,
    taskset), each its share, as torchrun's OMP_NUM_THREADS=1 default intends
    (torch/distributed/run.py), so ranks do not oversubscribe the machine; no more than
    OMP_NUM_THREADS where it is set, as the user or their launcher gave each process. OpenMP
    threads past the cores free spin against each other: two 1-rank validations of the 60K model
    at once on 2 cores took 114 s with 2 threads a rank, 10.5 s with 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cores // nproc)
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    return min(share, int(given)) if given.isdigit() and int(given) > 0 else share


def _train(opts: ValidateOptions, mode: str) -> dict:
    """The training job's fields every phase shares (TrainingJob's, ValidationJob's, NumericsJob's)."""
    return {"spec": dataclasses.asdict(opts.spec), "mode": mode, "micro_batch": opts.micro_batch,
            "accum": opts.accum, "steps": opts.steps, "warmup_steps": opts.warmup_steps,
            "threads": opts.threads, "optimizer": "adamw", "seed": 0, "user_model": opts.user_model, "ac": opts.ac}


def phases(opts: ValidateOptions) -> list[dict]:
    bench = CollectivesJob(["all_reduce"], list(FIT_SIZES), iters=opts.bench_iters, warmup=2, dtype="float32",
                           combine="avg", check=True)
    # DataParallel is one process over every GPU: it runs in a launch of its own (`_run_dp`).
    ddp = [mode for mode in opts.modes if mode != "dp"]
    out = [phase("bench", "collectives", bench),
           phase("rotations", "validation", ValidationJob(**_train(opts, "ddp_synced"), modes=ddp))]
    if opts.numerics and not opts.user_model:  # the numerics check trains the synthetic model
        numerics = NumericsJob(**{**_train(opts, "numerics"), "steps": 1, "warmup_steps": 0},
                               fsdp_modes=[m for m in opts.modes if m in FSDP_ONE_NODE])
        out.append(phase("numerics", "numerics", numerics))
    return out


@dataclass
class ValidateResult:
    label: str
    status: str = "ok"
    error: str | None = None
    bench_rows: list = field(default_factory=list)
    rotations: dict | None = None                     # the `validation` message of rank 0
    calibration: dict | None = None                   # the model's inputs, each with its spread
    measured: dict = field(default_factory=dict)      # mode -> step (and parts) as measured
    numerics: dict | None = None
    predictions: dict = field(default_factory=dict)   # mode -> step, range and parts as predicted
    wall_s: float = 0.0

    def modes(self) -> dict:
        out = {}
        for mode, pred in self.predictions.items():
            meas = self.measured.get(mode, {})
            step, predicted = meas.get("step_time_s"), pred.get("step_time_s")
            err = None if step is None or predicted is None else 100.0 * (predicted - step) / step
            if meas.get("per_rotation_s") and pred.get("per_rotation_s"):  # matched rotations
                ratios = (p / m for p, m in zip(pred["per_rotation_s"], meas["per_rotation_s"]))
                err = 100.0 * (statistics.median(ratios) - 1)
            low, high = pred.get("range_s") or (None, None)
            out[mode] = {"measured_step_s": step, "predicted_step_s": predicted, "error_pct": err,
                         "predicted_range_s": pred.get("range_s"),
                         "inside_range": None if step is None or low is None else low <= step <= high,
                         "parts": {"measured": meas.get("parts"), "predicted": pred.get("parts")},
                         "measured_parts_cover_pct": meas.get("parts_cover_pct"),
                         "per_rotation": {"measured_s": meas.get("per_rotation_s"),
                                          "predicted_s": pred.get("per_rotation_s")}}
        return out


def collect(result: ValidateResult):
    """An on_message handler that files every rank-0 message under its phase."""
    def on_message(rank: int, wire: dict) -> None:
        msg = as_message(wire, CollectiveRow, ValidationRotations, TrainingResult, NumericsResult)
        where = phase_of(wire)
        if isinstance(msg, CollectiveRow) and where == "bench":
            result.bench_rows.append(row_from_dict(msg.row))
        elif isinstance(msg, ValidationRotations):
            result.rotations = fields_of(msg)
        elif isinstance(msg, TrainingResult) and where == "dp":
            result.measured["dp"] = {"step_time_s": msg.step_time_s}
        elif isinstance(msg, NumericsResult):
            result.numerics = msg.report()
    return on_message


def predict(opts: ValidateOptions, result: ValidateResult) -> None:
    """The calibration, what each mode measured, and what the model predicts for it.

    Each rotation is a matched experiment: its inputs were measured within a second of its steps.
    A mode is predicted from every rotation's own inputs, and its error is the median over
    rotations of that rotation's (predicted - measured) / measured: a machine that drifts between
    rotations, or a slow spell in one of them, then moves prediction and measurement together.
    """
    msg = result.rotations
    if not msg or not msg.get("rotations"):
        return
    rotations = msg["rotations"]
    result.calibration = _calibration_payload(rot.calibration(rotations), msg, len(opts.layout.tensors), opts.layout)
    per_rotation = [_inputs(opts, result, [r], rotations) for r in rotations]
    for mode in msg["modes"]:
        measured = rot.measured_mode(rotations, mode)
        result.measured[mode] = {"step_time_s": measured["step"].value, "per_rotation_s": measured["steps"],
                                 "parts": measured["parts"], "parts_cover_pct": measured["parts_cover_pct"]}
        result.predictions[mode] = _predicted(per_rotation, mode, measured["middle"])
    if "dp" in opts.modes:
        result.predictions["dp"] = _predicted([_inputs(opts, result, rotations)], "dp", 0)


def _copy_costs(copies_s: float, msg: dict, tensors: int | None) -> dict:
    """DDP's measured copy cost as the model carries it to other models: the memory traffic at
    the bandwidth these ranks measured, and what is left per kernel the reducer launched
    (topoprof.model.ddp.gpu_costs). Where the copies ran faster than that bandwidth, or the tensors are
    not known, as one effective copy rate instead."""
    traffic = ddp_copy_bytes(msg["params"], 4, False)  # fp32 gradients, no bucket view (as the wrapper there)
    bandwidth = msg.get("memory_bandwidth_gbps")
    buckets = len((msg.get("rotations") or [[{}]])[0][0].get("bucket_numel") or [])
    if tensors and bandwidth and buckets and copies_s > traffic / (bandwidth * 1e9):
        left, kernels = copies_s - traffic / (bandwidth * 1e9), ddp_kernels(tensors, buckets, False)
        # No copy rate of its own (ddp_copy_bandwidth_gbps stays None): the traffic moves at the
        # memory bandwidth these ranks measured, and the kernel cost carries the rest.
        return {"ddp_kernel_s": left / kernels, "ddp_copies_basis": (
            f"DDP's copies {copies_s * 1e3:.2f} ms: {traffic / 1e9:.3f} GB of traffic at the measured "
            f"{bandwidth:.0f} GB/s (memory_bandwidth_gbps), the rest {left / kernels * 1e6:.1f} us per kernel "
            f"over {kernels} kernels (ddp_kernel_s)")}
    return {"ddp_copy_bandwidth_gbps": traffic / copies_s / 1e9, "ddp_copies_basis": (
        f"DDP's copies {copies_s * 1e3:.2f} ms for {traffic / 1e9:.3f} GB of traffic: one effective copy rate "
        "(ddp_copy_bandwidth_gbps), as they ran faster than the measured memory bandwidth "
        "or the tensors are not known")}


def _fsdp_per_group(cal: dict, layout: Layout | None) -> dict:
    """FSDP's measured own work per micro-batch (`rotations.fsdp_costs`) as the model takes it: per
    group (forward, backward synced and under no_sync) and per all-gather in backward."""
    if layout is None or "fsdp_forward_cost_s" not in cal:
        return {}
    plan = fsdp_plan(layout)
    groups = sum(1 for g in plan.groups if g.numel)
    resharded = sum(1 for g in plan.groups[:-1] if g.numel)  # the blocks (the root is not)
    out = {}
    for key, name, per in (("fsdp_forward_cost_s", "fsdp_forward_overhead_s", groups),
                           ("fsdp_backward_cost_s", "fsdp_backward_overhead_s", groups),
                           ("fsdp_backward_no_sync_cost_s", "fsdp_backward_no_sync_overhead_s", groups),
                           ("fsdp_unshard_cost_s", "fsdp_unshard_overhead_s", resharded)):
        if key in cal and per:
            out[name] = max(0.0, cal[key].value) / per
    return out


def _calibration_payload(cal: dict, msg: dict, tensors: int | None = None, layout: Layout | None = None) -> dict:
    """The inputs as the model and `model --calibration` take them, their spreads, and the setup."""
    c = cal["micro_batch_time_s"].value
    out = {"micro_batch_time_s": c, "forward_s": cal["forward_s"].value, "backward_s": cal["backward_s"].value,
           "backward_fraction": cal["backward_s"].value / (cal["forward_s"].value + cal["backward_s"].value),
           "optimizer_time_s": cal["optimizer_time_s"].value,
           "ddp_overhead_s": max(0.0, cal["ddp_overhead_s"].value) if "ddp_overhead_s" in cal else 0.0,
           "memory_bandwidth_gbps": msg.get("memory_bandwidth_gbps")}
    copies = cal.get("ddp_copies_s")
    if copies is not None and copies.value > 0 and msg.get("params"):
        out.update(_copy_costs(copies.value, msg, tensors))
    out.update(_fsdp_per_group(cal, layout))
    if "fsdp_optimizer_time_s" in cal:
        out["fsdp_optimizer_time_s"] = cal["fsdp_optimizer_time_s"].value
    spread_of_ranks = rot.rank_spread(msg["rotations"])
    if spread_of_ranks is not None:  # the slowest rank's wait, carried to other world sizes
        out.update(spread_of_ranks)
    for key in ("compute_slowdown_during_comm", "comm_slowdown_during_compute"):
        out[key] = max(1.0, cal[key].value) if key in cal else 1.0
    by_size = rot.comm_slowdowns(msg["rotations"])
    out["comm_slowdown_by_size"] = [[size, max(1.0, s.value)] for size, s in by_size]
    out["spread"] = {k: dataclasses.asdict(v) for k, v in cal.items()}
    out["spread"].update({f"comm_slowdown_at_{size}_bytes": dataclasses.asdict(s) for size, s in by_size})
    out["spread"].update({f"fsdp_{kind}_at_{size}_bytes": dataclasses.asdict(s)
                          for kind, size, s in rot.fsdp_points(msg["rotations"])})
    out.update({k: msg.get(k) for k in ("micro_batch", "accum", "params", "tokens_per_micro_batch", "threads")})
    out["rotations"] = len(msg["rotations"])
    out["combine"] = ("compute and optimizer: the slower rank's, per rotation its median plus the run's "
                      "mean less median; DDP's costs: medians of paired differences; interference: "
                      "medians of ratios")
    return out


def _inputs(opts: ValidateOptions, result: ValidateResult, rotations: list, run: list | None = None):
    """ModelInputs from what `rotations` measured (part of `run`, every rotation, when given:
    `topoprof.model.validate.rotations.calibration`): compute, optimizer, each bucket's all-reduce alone
    (the bench curve for other sizes), interference, memory bandwidth."""
    assert result.rotations is not None  # the ranks sent their rotations
    values = _calibration_payload(rot.calibration(rotations, run), {**result.rotations, "rotations": run or rotations},
                                  len(opts.layout.tensors), opts.layout)
    values["comm_slowdown_by_size"] = tuple(tuple(p) for p in values["comm_slowdown_by_size"])
    compute = Compute.from_calibration({k: values[k] for k in CALIBRATION_KEYS if values.get(k) is not None},
                                       optimizer="adamw")
    job_rows = [r for r in result.bench_rows if r.level == "job"]
    bucket_rows = [{"collective": "all_reduce", "size_bytes": size, "wrong": 0, "time_us": s.value * 1e6}
                   for size, s in rot.allreduce_points(rotations)]
    # FSDP's all-gathers and reduce-scatters alone at its groups' sizes, measured in the rotations
    bucket_rows += [{"collective": kind, "size_bytes": size, "wrong": 0, "time_us": s.value * 1e6}
                    for kind, size, s in rot.fsdp_points(_neighbours(rotations, run))]
    if opts.nproc == 1:  # DDP's own costs are measured; nothing is all-reduced across ranks

        comm = SingleGpuComm("one rank: nothing to all-reduce")
    else:
        comm = measured_comm(_merged(job_rows, bucket_rows), fit_rows(job_rows, "all_reduce"), opts.nproc,
                             "all-reduce measured on these ranks (bucket sizes in the rotations)")

    workload = Workload(opts.layout, micro_batch_size=opts.micro_batch,
                        tokens_per_micro_batch=opts.tokens_per_micro_batch, checkpointing=parse_checkpointing(opts.ac))
    return ModelInputs(workload, compute, Cluster(comm, nodes=1, gpus_per_node=opts.nproc, backend=opts.backend),
                       accumulation_steps=opts.accum)


def _neighbours(rotations: list, run: list | None) -> list:
    """A single rotation with the rotations beside it in the run, for what it measured of FSDP's
    collectives: one rotation's couple of hundred leave their mean within about 15 % (the slow
    ones are rare and long), three within about 9 %, and the rate of slow ones drifts over tens of
    seconds, not over the few seconds of a rotation."""
    if run is None or len(rotations) != 1:
        return rotations
    i = next((k for k, r in enumerate(run) if r is rotations[0]), None)
    return rotations if i is None else run[max(0, i - 1): i + 2]


def _merged(bench_rows, bucket_rows) -> list[dict]:
    """The bench curve, with each bucket size as the rotations measured it (closer in time to the
    steps than the sweep before them)."""
    sizes = {(r["collective"], r["size_bytes"]) for r in bucket_rows}
    kept = [{"collective": r.collective, "size_bytes": r.size_bytes, "wrong": r.wrong, "time_us": r.time_us}
            for r in bench_rows if (r.collective, r.size_bytes) not in sizes]
    return kept + bucket_rows


def _predicted(per_rotation: list, mode: str, middle: int) -> dict:
    """The mode predicted from each rotation's inputs, and the parts of the prediction for the
    rotation whose measured step is the median (the one whose measured parts are shown)."""
    steps = [getattr(model_predict(inputs, parts=False).strategies.get(mode), "step_time_s", None)
             for inputs in per_rotation]
    if any(s is None for s in steps):
        return {"step_time_s": None}
    known = [s for s in steps if s is not None]  # all of them
    parts = None
    if mode != "dp":
        inputs = per_rotation[middle]
        work = inputs.workload
        buckets = ddp_buckets(work.layout, work.grad_bytes, work.bucket_cap_mb)
        parts = {**step_components(resolve(inputs), buckets, inputs.cluster.comm, mode), "other": 0.0}
    return {"step_time_s": statistics.median(known), "per_rotation_s": known, "range_s": [min(known), max(known)],
            "parts": parts}


def run_validate(opts: ValidateOptions, on_progress=None) -> ValidateResult:
    result = ValidateResult(label=opts.label)
    handler = collect(result)

    def on_message(rank, wire):
        handler(rank, wire)
        msg = as_message(wire, Progress)
        if on_progress and isinstance(msg, Progress) and rank == 0:
            on_progress(f"{phase_of(wire)}: {msg.step}")

    spec = JobSpec("phases", PhasesJob(phases(opts)), opts.nproc, opts.backend, opts.timeout_s)
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
    if external_job() is not None:
        result.measured["dp"] = {"skipped": "DataParallel is one process: run `topoprof validate --modes dp` "
                                            "outside torchrun/srun"}
        return
    dp = [phase("dp", "training", TrainingJob(**_train(opts, "dp")))]
    run = launch_local(JobSpec("phases", PhasesJob(dp), 1, opts.backend, opts.timeout_s), on_message)
    result.wall_s += run.wall_s
    if run.failure is not None:
        result.status, result.error = "error", f"dp: {run.failure.describe()}"


def summary(results: list[ValidateResult]) -> dict:
    """Median and worst |error| over every DDP mode of every case."""
    modes = [m for r in results for m in r.modes().values() if m["error_pct"] is not None]
    if not modes:
        return {"cases": 0}
    errors = [abs(m["error_pct"]) for m in modes]
    return {"cases": len(errors), "median_abs_error_pct": statistics.median(errors), "worst_abs_error_pct": max(errors),
            "mean_signed_error_pct": statistics.fmean(m["error_pct"] for m in modes),
            "inside_range": sum(1 for m in modes if m.get("inside_range"))}


def spec_from_options(params: str | None, preset: str | None, scale: float, seq_len: int):
    if params and preset:
        raise InputError("give --params or --preset, not both")
    if preset:
        return spec_for_preset(preset, scale, seq_len=seq_len), f"{preset} x{scale:g}"

    n = parse_count(params or "2M")
    return spec_for_params(n, seq_len=seq_len), f"synthetic {n / 1e6:g}M"


def validate_payload(result, opts) -> dict:
    # one rank all-reduces with nobody: its timings fit no link
    fit = fit_rows(result.bench_rows, "all_reduce") if result.bench_rows and opts.nproc > 1 else None
    return {"status": result.status, "error": result.error, "label": result.label,
            "modes": result.modes(), "numerics": result.numerics, "calibration": result.calibration,
            "fit": fit, "bench_rows": result.bench_rows, "summary": summary([result]),
            "setup": {"backend": opts.backend, "nproc": opts.nproc,
                      "spec": {"user_model": opts.user_model} if opts.user_model else opts.spec,
                      "params": opts.layout.params, "micro_batch": opts.micro_batch, "accum": opts.accum,
                      "steps": opts.steps, "warmup_steps": opts.warmup_steps, "threads": opts.threads,
                      "step_rule": "a step's time is the max over ranks; the median over timed steps",
                      **({"activation_checkpointing": opts.ac} if opts.ac != "none" else {})},
            "wall_s": result.wall_s,
            # every rank's raw timelines and samples, rotation by rotation (probes/ranks/validation.py)
            "rotations": result.rotations}


def save_calibration(path: str, payload: dict):
    """Write the calibration file; the jsonio.Moved when it had to go elsewhere (see write_text)."""
    cal = payload.get("calibration") or {}
    return write_text(path, json.dumps({"calibration": {k: cal[k] for k in CALIBRATION_KEYS if k in cal},
                                        "measured_on": payload["setup"]}, indent=2, default=str), "--save-calibration")
