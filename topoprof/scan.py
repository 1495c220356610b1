"""`topoprof scan`: topology, collective bandwidth, predictions, a short validation, advice.

All rank work (the bench sweep, the calibration, each DDP mode, the numerics) runs in one
launcher start. What was measured before a failure is kept and reported.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass

from topoprof.errors import InputError

DEFAULT_MODELS = ("125M", "1.3B", "7B")   # the sizes people ask about most
DEFAULT_TOKENS = 2048                     # tokens per GPU per micro-batch when none is given


@dataclass(frozen=True)
class ScanOptions:
    backend: str
    nproc: int
    note: str
    quick: bool = False
    validate: bool = True
    params: str | None = None
    preset: str | None = None
    micro_batch_time_s: float | None = None
    tokens: int | None = None
    micro_batch_size: int = 1
    accum: int = 8
    timeout_s: float = 120.0

    def __post_init__(self):
        if self.params and self.preset:
            raise InputError("give --params or --preset, not both")
        if self.accum < 1:
            raise InputError(f"--accum {self.accum}: accumulation steps K must be >= 1")
        # Bad input is refused before anything runs; a model that fails later is a report note.
        if self.params:
            from topoprof.commands.model import parse_count

            parse_count(self.params)
        if self.preset:
            from topoprof.presets import PRESETS

            if self.preset.strip().lower() not in PRESETS:
                raise InputError(f"--preset {self.preset!r}: valid names: {', '.join(sorted(PRESETS))}")


def multi_node() -> bool:
    """Inside a torchrun/SLURM job that spans more than one node."""
    from topoprof.launch import external_job

    job = external_job()
    return job is not None and job.world_size > job.local_world_size


def bench_config(opts: ScanOptions) -> dict:
    """A quick sweep: enough sizes for the fit and the plateau, little time. Across nodes, three
    levels: each node alone, the network alone (one rank per node), and the whole job."""
    gpu = opts.backend == "nccl"
    if opts.quick:
        sizes, collectives = [4096 * 4 ** i for i in range(7)], ["all_reduce"]       # 4 KiB..16 MiB
    elif gpu:
        sizes, collectives = [8 * 4 ** i for i in range(14)] + [1 << 30], ["all_reduce", "all_gather", "reduce_scatter"]
    else:
        sizes, collectives = [1024 * 2 ** i for i in range(15)], ["all_reduce"]     # 1 KiB..16 MiB
    return {"collectives": collectives, "sizes": sizes, "iters": 5 if opts.quick else 10,
            "warmup": 2, "dtype": "float32", "combine": "avg", "check": True,
            "levels": ["intra", "inter", "job"] if multi_node() else ["job"]}


def validate_options(opts: ScanOptions):
    from topoprof.synthetic import spec_for_params
    from topoprof.validate import ValidateOptions, cpu_threads_per_rank

    gpu = opts.backend == "nccl"
    spec = spec_for_params(25_000_000 if gpu else 1_000_000, seq_len=256 if gpu else 64)
    return ValidateOptions(backend=opts.backend, nproc=opts.nproc, spec=spec, label=f"synthetic {spec.params / 1e6:.1f}M",
                           micro_batch=8 if gpu else 4, accum=4, steps=2 if opts.quick else 4,
                           warmup_steps=1 if opts.quick else 2, numerics=not opts.quick,
                           threads=None if gpu else cpu_threads_per_rank(opts.nproc), timeout_s=opts.timeout_s)


def _phases(opts: ScanOptions, vopts) -> list[dict]:
    from topoprof.validate import phases

    bench = {"name": "bench", "worker": "collectives", "config": bench_config(opts)}
    first = [{"name": "nodes", "worker": "nodes", "config": {}}] if multi_node() else []
    if vopts is None or opts.nproc < 2:
        return first + [bench]
    return first + [bench] + phases(vopts)[1:]


class Stages:
    """Wall time per stage, and a progress line on a terminal."""

    def __init__(self, show: bool):
        self.show, self.times, self._t = show, {}, None
        self.start = time.monotonic()

    def begin(self, name: str) -> None:
        self._name, self._t = name, time.monotonic()
        self.say(name)

    def end(self) -> None:
        self.times[self._name] = time.monotonic() - self._t

    def say(self, text: str) -> None:
        if self.show:
            sys.stderr.write(f"\r\033[K  [{time.monotonic() - self.start:5.1f}s] {text}")
            sys.stderr.flush()

    def done(self) -> dict:
        if self.show:
            sys.stderr.write("\r\033[K")
        return {**{k: round(v, 2) for k, v in self.times.items()}, "total_s": round(time.monotonic() - self.start, 2)}


def run_ranks(opts: ScanOptions, stages: Stages):
    """Bench and validation in one launch; returns (BenchResult-like dict parts, ValidateResult)."""
    from topoprof.bench import BenchResult, nccl_env
    from topoprof.launch import JobSpec
    from topoprof.runner import run_job
    from topoprof.validate import ValidateResult, collect, predict

    vopts = validate_options(opts) if opts.validate and opts.nproc >= 2 else None
    from topoprof.bench import PROTOCOL

    cfg = bench_config(opts)
    protocol = PROTOCOL.format(warmup=cfg["warmup"], iters=cfg["iters"], combine=cfg["combine"])
    bench = BenchResult(status="ok", rows=[], metadata={"backend": opts.backend, "world_size": opts.nproc,
                                                        "iters": cfg["iters"], "warmup": cfg["warmup"],
                                                        "combine": cfg["combine"], "protocol": protocol})
    vres = ValidateResult(label=vopts.label if vopts else "")
    file_validation = collect(vres)
    nodes: list = []

    def on_message(rank: int, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "nodes":
            nodes.extend(msg["ranks"])
        if msg.get("phase") == "bench":
            if kind == "meta":
                bench.metadata.update({k: v for k, v in msg.items() if k not in ("type", "phase")})
            elif kind == "stopped":
                bench.stopped.append({"collective": msg["collective"], "reason": msg["reason"]})
        file_validation(rank, msg)
        if kind == "progress" and rank == 0:
            stages.say(f"{msg.get('phase')}: {msg.get('step')}")

    from topoprof.bench import BenchOptions

    env = nccl_env(BenchOptions(backend=opts.backend, nproc=opts.nproc, sizes=tuple(cfg["sizes"])))
    spec = JobSpec("phases", {"phases": _phases(opts, vopts)}, opts.nproc, opts.backend, opts.timeout_s, env=env)
    from topoprof.probing import attempt

    run, status = attempt("ranks", lambda: run_job(spec, on_message))
    bench.rows = list(vres.bench_rows)
    bench.wall_s = run.wall_s if run is not None else None
    failure = status.detail if run is None else (run.failure.describe() if run.failure is not None else None)
    if failure is not None:
        bench.status = vres.status = "error"
        bench.error = vres.error = failure
    if run is not None and opts.backend == "nccl" and run.log_dir:
        from topoprof.bench import read_nccl_logs

        read_nccl_logs(bench, run.log_dir)
    if vopts is not None:
        predict(vopts, vres)
    return bench, vres, vopts, nodes


def versions() -> dict:
    from topoprof import __version__

    out = {"topoprof": __version__, "python": platform.python_version()}
    try:
        import torch

        out.update(torch=torch.__version__, cuda=torch.version.cuda)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return out


def environment() -> dict:
    return {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_VISIBLE", "OMP_NUM"))}
