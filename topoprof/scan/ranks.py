"""All rank work of a scan in one launcher start: the bench sweep (at every level of a multi-node
job), the calibration, each DDP mode and the numerics, with a progress line per stage."""
from __future__ import annotations

import os
import platform
import time
from importlib import metadata

from topoprof import __version__
from topoprof.measure.bench import PROTOCOL, BenchOptions, BenchResult, add_meta, add_stopped, nccl_env, read_nccl_logs
from topoprof.measure.launch import JobSpec, as_message, multi_node
from topoprof.measure.runner import run_job
from topoprof.model.validate.run import ValidateResult, collect, phases, predict
from topoprof.probing import attempt
from topoprof.progress import LiveProgress
from topoprof.scan.options import ScanOptions, bench_job, validate_options
from topoprof.specs.messages import (
    CollectivesMeta,
    CollectiveStopped,
    NodesJob,
    NodesResult,
    PhasesJob,
    Progress,
    phase,
    phase_of,
)


def _phases(opts: ScanOptions, vopts) -> list[dict]:
    bench = phase("bench", "collectives", bench_job(opts))
    first = [phase("nodes", "nodes", NodesJob())] if multi_node() else []
    if vopts is None or opts.nproc < 2:
        return first + [bench]
    return first + [bench] + phases(vopts)[1:]


class Stages:
    """Wall time per stage, and the stage on the progress line (`topoprof.progress`, on a terminal)."""

    def __init__(self, progress: LiveProgress):
        self.progress = progress
        self.times: dict[str, float] = {}
        self._t = 0.0
        self.start = time.monotonic()

    def begin(self, name: str) -> None:
        self._name, self._t = name, time.monotonic()
        self.say(name)

    def end(self) -> None:
        self.times[self._name] = time.monotonic() - self._t

    def say(self, text: str) -> None:
        self.progress(text)

    def done(self) -> dict:
        self.progress.close()
        return {**{k: round(v, 2) for k, v in self.times.items()}, "total_s": round(time.monotonic() - self.start, 2)}


def run_ranks(opts: ScanOptions, stages: Stages):
    """Bench and validation in one launch; returns (BenchResult-like dict parts, ValidateResult)."""
    vopts = validate_options(opts) if opts.validate and opts.nproc >= 2 else None

    cfg = bench_job(opts)
    protocol = PROTOCOL.format(warmup=cfg.warmup, iters=cfg.iters, combine=cfg.combine)
    bench = BenchResult(status="ok", rows=[], metadata={"backend": opts.backend, "world_size": opts.nproc,
                                                        "iters": cfg.iters, "warmup": cfg.warmup,
                                                        "combine": cfg.combine, "protocol": protocol})
    vres = ValidateResult(label=vopts.label if vopts else "")
    file_validation = collect(vres)
    nodes: list = []

    def on_message(rank: int, wire: dict) -> None:
        msg = as_message(wire, NodesResult, CollectivesMeta, CollectiveStopped, Progress)
        if isinstance(msg, NodesResult):
            nodes.extend(msg.ranks)
        if phase_of(wire) == "bench":
            if isinstance(msg, CollectivesMeta):
                add_meta(bench, msg)
            elif isinstance(msg, CollectiveStopped):
                add_stopped(bench, msg)
        file_validation(rank, wire)
        if isinstance(msg, Progress) and rank == 0:
            stages.say(f"{phase_of(wire)}: {msg.step}")


    env = nccl_env(BenchOptions(backend=opts.backend, nproc=opts.nproc, sizes=tuple(cfg.sizes)))
    spec = JobSpec("phases", PhasesJob(_phases(opts, vopts)), opts.nproc, opts.backend, opts.timeout_s, env=env)

    run, status = attempt("ranks", lambda: run_job(spec, on_message))
    bench.rows = list(vres.bench_rows)
    bench.wall_s = run.wall_s if run is not None else None
    failure = status.detail if run is None else (run.failure.describe() if run.failure is not None else None)
    if failure is not None:
        bench.status = vres.status = "error"
        bench.error = vres.error = failure
    if run is not None and opts.backend == "nccl":
        read_nccl_logs(bench, run.rank_logs)
    if vopts is not None:
        predict(vopts, vres)
    return bench, vres, vopts, nodes


def versions(bench_metadata: dict | None = None) -> dict:
    """topoprof, Python, and torch's versions as the ranks reported them (CUDA's too), read here
    without importing torch."""
    out: dict[str, str | None] = {"topoprof": __version__, "python": platform.python_version()}
    meta = bench_metadata or {}
    try:
        out["torch"] = meta.get("torch_version") or metadata.version("torch")
    except metadata.PackageNotFoundError:  # pragma: no cover - torch is a dependency
        pass
    out["cuda"] = meta.get("cuda_version")
    return out


def environment() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_VISIBLE", "OMP_NUM"))}
