"""Collective bandwidth measurement: options, the run, and the result every consumer reads.

`run_bench` starts the ranks (or joins torchrun/SLURM), streams rows as they are measured,
and returns a BenchResult even when a rank fails part-way: rows measured before the failure
are kept and the failure is recorded. Scan and validate reuse it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from topoprof.errors import InputError, NothingMeasured
from topoprof.jsonio import from_jsonable, to_jsonable
from topoprof.measure.fit import FitLine, bus_bandwidth_gbps, fit_all
from topoprof.measure.launch import JobSpec, as_message
from topoprof.measure.nccl_log import explain, parse_nccl_info
from topoprof.measure.nccl_tests import read_nccl_tests_runs
from topoprof.measure.runner import run_job
from topoprof.measure.spread import SlowRank, slow_ranks
from topoprof.probes.ranks.copy_bandwidth import CopyMeasurement, measure_copies
from topoprof.specs.collective_spec import COLLECTIVES, COMBINE_RULES, DTYPES, BenchRow, get_collective, row_from_dict
from topoprof.specs.messages import (
    CollectiveRow,
    CollectivesJob,
    CollectivesMeta,
    CollectiveStopped,
    Progress,
    fields_of,
)

PROTOCOL = (
    "nccl-tests method: per size, a correctness run on small-integer data (#wrong), {warmup} warm-up "
    "iterations, a barrier, {iters} back-to-back timed iterations with device synchronisation, "
    "time per iteration = elapsed / iters on each rank; ranks combined by '{combine}'"
)


@dataclass(frozen=True)
class BenchOptions:
    backend: str
    nproc: int
    collectives: tuple[str, ...] = ("all_reduce",)
    sizes: tuple[int, ...] = ()
    iters: int = 20
    warmup: int = 5
    dtype: str = "float32"
    combine: str = "avg"
    check: bool = True
    timeout_s: float = 120.0
    nccl_debug: bool = True
    log_dir: str | None = None
    corrupt_rank: int | None = None   # test hook: flip one result element on this rank
    levels: tuple[str, ...] = ("job",)  # across nodes: ("intra", "inter", "job")

    def __post_init__(self):
        for name in self.collectives:
            get_collective(name)
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.combine not in COMBINE_RULES:
            raise InputError(f"--combine {self.combine!r}: choose one of {', '.join(COMBINE_RULES)}")
        if self.iters < 1 or self.warmup < 0:
            raise InputError(f"--iters must be >= 1 and --warmup >= 0 (got {self.iters}, {self.warmup})")
        if not self.sizes:
            raise InputError("no sizes to measure: check --min-bytes/--max-bytes/--factor")
        if self.timeout_s <= 0:
            raise InputError(f"--timeout must be > 0 seconds (got {self.timeout_s})")

    def protocol(self) -> str:
        return PROTOCOL.format(warmup=self.warmup, iters=self.iters, combine=self.combine)


@dataclass(frozen=True)
class StoppedSweep:
    """A collective whose sweep of sizes stopped before its last one, and why."""

    collective: str
    reason: str


@dataclass
class BenchResult:
    status: str                              # "ok" or "error"
    rows: list[BenchRow]
    metadata: dict
    stopped: list[StoppedSweep] = field(default_factory=list)
    error: str | None = None
    nccl: list[dict] = field(default_factory=list)   # per-rank NCCL log summaries
    nccl_explained: list[str] = field(default_factory=list)
    wall_s: float | None = 0.0

    def fits(self) -> dict:
        """Per collective, over the whole job's rows (the level every single-node run has). None on
        one rank: its t(S) = a + S/b would give b as a bandwidth of a collective that moved nothing."""
        if self.world_size() == 1:
            return {}
        return fit_all([r for r in self.rows if r.level == "job" and r.busbw_gbps is not None])

    def level_fits(self) -> dict:
        """Across nodes: {"intra node0 (host)": {collective: Fit}, "inter network": ..., "job": ...}."""
        keys = sorted({(r.level, r.group) for r in self.rows if r.busbw_gbps is not None})
        if keys in ([("job", "")], []):
            return {}
        return {f"{level} {group}".strip(): fit_all([r for r in self.rows if (r.level, r.group) == (level, group)])
                for level, group in keys}

    def world_size(self) -> int:
        return int(self.metadata.get("world_size", 0) or 0)


def worker_job(opts: BenchOptions) -> CollectivesJob:
    return CollectivesJob(list(opts.collectives), list(opts.sizes), opts.iters, opts.warmup, opts.dtype,
                          opts.combine, opts.check, opts.corrupt_rank, list(opts.levels))


def add_meta(result: BenchResult, meta: CollectivesMeta) -> None:
    """The ranks' own description (hosts, nodes, versions) added to a bench's metadata."""
    result.metadata.update(fields_of(meta))


def add_stopped(result: BenchResult, stopped: CollectiveStopped) -> None:
    result.stopped.append(StoppedSweep(stopped.collective, stopped.reason))


def nccl_env(opts: BenchOptions) -> dict:
    """Ask NCCL to say which transport, channels and algorithms it chose (in each rank's log)."""
    if opts.backend != "nccl" or not opts.nccl_debug:
        return {}
    return {"NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "INFO"),
            "NCCL_DEBUG_SUBSYS": os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,ENV,TUNING,P2P,SHM,NET")}


def run_bench(opts: BenchOptions, on_row: Callable[[BenchRow], None] | None = None,
              on_progress: Callable[[str], None] | None = None) -> BenchResult:
    result = BenchResult(status="ok", rows=[], metadata={
        "backend": opts.backend, "world_size": opts.nproc, "iters": opts.iters, "warmup": opts.warmup,
        "dtype": opts.dtype, "combine": opts.combine, "check": opts.check, "protocol": opts.protocol(),
    })

    def on_message(rank: int, wire: dict) -> None:
        msg = as_message(wire, CollectiveRow, CollectivesMeta, CollectiveStopped, Progress)
        if isinstance(msg, CollectiveRow):
            row = row_from_dict(msg.row)
            result.rows.append(row)
            if on_row:
                on_row(row)
        elif isinstance(msg, CollectivesMeta):
            add_meta(result, msg)
            result.metadata["hosts"] = sorted({r["host"] for r in msg.ranks})
            result.metadata["nodes"] = sorted({r["node"] for r in msg.ranks})
        elif isinstance(msg, CollectiveStopped):
            add_stopped(result, msg)
        elif isinstance(msg, Progress) and rank == 0 and on_progress:
            on_progress(msg.step)

    spec = JobSpec("collectives", worker_job(opts), opts.nproc, opts.backend, opts.timeout_s,
                   env=nccl_env(opts), log_dir=opts.log_dir)
    run = run_job(spec, on_message)
    result.wall_s = run.wall_s
    if run.failure is not None:
        result.status, result.error = "error", run.failure.describe()
    if opts.backend == "nccl":
        read_nccl_logs(result, run.rank_logs)
    return result


def read_nccl_logs(result: BenchResult, rank_logs: dict[str, str]) -> None:
    """NCCL's own INFO lines in the ranks' output (`RunResult.rank_logs`): its version, the
    transport it chose per pair, and what that means."""
    for path, text in rank_logs.items():
        summary = parse_nccl_info(text, source=path)
        if summary.pairs or summary.nccl_version:
            result.nccl.append({"log": os.path.basename(path), **to_jsonable(summary)})
            for line in explain(summary):
                if line not in result.nccl_explained:
                    result.nccl_explained.append(line)


def default_sizes(backend: str) -> tuple[int, int, int]:
    """(min, max, factor): nccl-tests' common 8 B..1 GiB x2 sweep on GPUs; up to 64 MiB on CPU
    ranks, where gloo over loopback copies through host memory and bigger sizes add time, not
    information (the bandwidth plateau is reached well below 64 MiB)."""
    return (8, 1 << 30, 2) if backend == "nccl" else (8, 64 << 20, 2)


def collectives_option(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return tuple(COLLECTIVES)
    return tuple(get_collective(n).name for n in names)


def result_from_nccl_tests(path: str) -> BenchResult:
    """An nccl-tests *_perf log (one run or several) as a BenchResult: same rows, fit and charts."""
    runs = read_nccl_tests_runs(path)
    rows = [row for run in runs for row in run.rows]
    first = runs[0]
    metadata = {
        "source": f"nccl-tests log {path}", "backend": "nccl (imported)",
        "world_size": first.nranks or 0, "devices": list(first.devices), "hosts": list(first.hosts),
        "nccl_version": first.nccl_version, "nccl_tests_version": first.nccl_tests_version,
        "collectives": [run.collective for run in runs],
        "avg_busbw_gbps_printed": {run.collective: run.avg_busbw_gbps for run in runs},
        "protocol": "as run by nccl-tests (see the log's header); out-of-place columns",
    }
    return BenchResult(status="ok", rows=rows, metadata=metadata)


@dataclass(frozen=True)
class BenchMetadata:
    """What a bench run says of itself (`bench_payload`'s `metadata`) that its readers use."""

    backend: str = ""
    world_size: int | None = None
    protocol: str = ""


@dataclass(frozen=True)
class NcclNotes:
    """NCCL's debug logs of a bench run, and what `nccl_log.explain` read in them."""

    logs: list[dict] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BenchReport:
    """A bench run as its JSON (`bench_payload`) holds it, read back typed for report.md, the
    verdict and the advice: its rows, each collective's fit, NCCL's notes, the ranks that ran
    slow and the error it stopped on."""

    status: str = ""
    error: str | None = None
    metadata: BenchMetadata = BenchMetadata()
    rows: list[BenchRow] = field(default_factory=list)
    fit: dict[str, FitLine] = field(default_factory=dict)
    nccl: NcclNotes | None = None
    slow_ranks: list[SlowRank] = field(default_factory=list)


def read_bench(doc: dict, where: str = "bench") -> BenchReport:
    """A bench payload read back (`jsonio.from_jsonable`: `SchemaError` names where it differs)."""
    return from_jsonable(BenchReport, doc, where)


@dataclass(frozen=True)
class CopiesReport:
    """The host<->GPU copies as a report holds them (`copies_payload`): measured (`status` ok), or
    why not (`detail`)."""

    status: str
    detail: str = ""
    size_bytes: int = 0
    iters: int = 0
    measurements: tuple[CopyMeasurement, ...] = ()
    device_names: tuple[str, ...] = ()


def bench_payload(result, copies=None) -> dict:
    """The JSON body of a bench run (also embedded in scan reports)."""
    fits = result.fits()
    n = result.world_size()
    return {
        "status": result.status,
        "error": result.error,
        "metadata": result.metadata,
        "rows": result.rows,
        "fit": {name: {**_fit_dict(f), "busbw_gbps": bus_bandwidth_gbps(f, n) if n else None}
                for name, f in fits.items() if f is not None},
        "fit_by_level": {key: {name: _fit_dict(f) for name, f in fits.items() if f is not None}
                         for key, fits in result.level_fits().items()},
        "stopped": result.stopped,
        "slow_ranks": slow_ranks(result.rows),
        "nccl": {"logs": result.nccl, "explained": result.nccl_explained},
        "copies": copies,
        "wall_s": result.wall_s,
    }


def _fit_dict(fit) -> dict:
    return to_jsonable(fit)


def copies_payload(enabled: bool) -> dict | None:
    if not enabled:
        return None

    try:
        return {"status": "ok", **to_jsonable(measure_copies())}
    except NothingMeasured as err:
        return {"status": "unsupported", "detail": str(err)}
