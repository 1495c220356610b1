"""The one process launcher behind bench, validate and scan.

Two ways to run rank work:
- local: start N rank processes on this node, rendezvous on a free 127.0.0.1 port, and watch
  them. Each rank is forked from a fork server (`topoprof.measure.forks`), a warm interpreter
  that has imported torch once for every rank of every launch of this process. Each rank reports
  JSON messages on its own pipe; its stdout and stderr go to a per-rank log file (NCCL's INFO
  lines land there).
- external: this process already is one rank of a torchrun or SLURM job; the worker runs in
  this process and only rank 0 reports (see `external_job`).

Watching local ranks: a rank that exits non-zero, or makes no progress for `timeout_s`, ends the
run: every rank is killed (its whole process group), the failure names the rank and what it was
doing, and the messages received before are kept. Each rank starts in a session (and process
group) of its own, which the launcher kills whole. Rank processes also die with this one, so
nothing is orphaned even if the CLI itself is killed: the fork server is started with no Python
between fork and exec (this process may hold a CUDA context and other threads, and subprocess can
then use vfork or posix_spawn) and arms PR_SET_PDEATHSIG itself, first thing, as each rank does
against the server (`topoprof.probes.ranks.rank_main.die_with_launcher`, each checking that the
process named in TOPOPROF_LAUNCHER_PID is still its parent).

No torch here: this module only starts and watches processes.
"""
from __future__ import annotations

import glob
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import BinaryIO, Callable

from topoprof.errors import InputError
from topoprof.measure import forks, slurm
from topoprof.specs.messages import Message, Progress, RankDone, RankError, decode, encode, kind_of

# Messages a rank sends, one JSON object a line, each a typed message of topoprof.specs.messages:
# the launcher's own (RankDone, RankError, Progress) and the workers' (read with `as_message` and
# `worker_result`)
OnMessage = Callable[[int, dict], None]


@dataclass(frozen=True)
class JobSpec:
    worker: str                 # a key of topoprof.probes.ranks.rank_main.WORKERS
    config: Message             # the worker's job: a typed job of topoprof.specs.messages
    nproc: int
    backend: str                # "nccl" or "gloo"
    timeout_s: float            # no progress from a rank for this long means it hung
    env: dict = field(default_factory=dict)
    log_dir: str | None = None  # per-rank stdout/stderr; a temporary folder when None
    # Before its first message a rank imports torch and joins the rendezvous (NCCL set-up on
    # many GPUs takes tens of seconds): that gets its own, longer allowance.
    startup_timeout_s: float = 180.0


@dataclass(frozen=True)
class RankFailure:
    rank: int
    reason: str                 # "exited with code 1", "killed by SIGKILL", "hung: no progress ..."
    last_step: str | None       # the last progress message the rank sent
    log_tail: str               # the last lines of the rank's stderr/stdout
    log_path: str = ""          # the rank's whole output, kept for the user when it failed

    def describe(self) -> str:
        where = f" during {self.last_step}" if self.last_step else ""
        tail = f"; last output: {self.log_tail.splitlines()[-1]}" if self.log_tail.strip() else ""
        log = f" (whole log: {self.log_path})" if self.log_path else ""
        return f"rank {self.rank} {self.reason}{where}{tail}{log}"


@dataclass
class RunResult:
    messages: list[tuple[int, dict]]
    failure: RankFailure | None
    log_dir: str
    wall_s: float
    # every rank's output by file path, read before a temporary folder is removed, when NCCL was
    # asked to log (NCCL_DEBUG): what `topoprof.measure.bench.read_nccl_logs` reads
    rank_logs: dict[str, str] = field(default_factory=dict)


def read_rank_logs(log_dir: str) -> dict[str, str]:
    """The rank*.log files of a job's log folder, by path."""
    logs = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "rank*.log"))):
        with open(path, errors="replace") as f:
            logs[path] = f.read()
    return logs


@dataclass(frozen=True)
class ExternalJob:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str               # "torchrun" or "slurm"
    nodes: int = 1


def external_job(environ: dict | None = None) -> ExternalJob | None:
    """This process's place in a torchrun or SLURM job, or None when run by hand.

    torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT. A task of an
    `srun` step has SLURM_STEP_ID beside SLURM_PROCID and SLURM_NTASKS; the batch script itself has
    SLURM_PROCID 0 and the job's SLURM_NTASKS too, but it is no rank: run there without srun,
    topoprof works alone. The rendezvous address comes from SLURM (topoprof.measure.slurm).
    """
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world, local_world = int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
        return ExternalJob(
            rank=int(env["RANK"]), world_size=world, local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=local_world, launcher="torchrun", nodes=-(-world // max(1, local_world)),
        )
    world = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")))
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and world > 1:
        return ExternalJob(
            rank=int(env["SLURM_PROCID"]), world_size=world, local_rank=int(env.get("SLURM_LOCALID", "0")),
            local_world_size=slurm.tasks_on_this_node(env), launcher="slurm", nodes=slurm.nodes_in_step(env),
        )
    return None


def progress_messages(progress: Callable[[str], None] | None) -> OnMessage | None:
    """An `on_message` that hands each progress message's step to `progress` (None: none)."""
    if progress is None:
        return None

    def on_message(rank: int, wire: dict) -> None:
        msg = as_message(wire, Progress)
        if isinstance(msg, Progress) and msg.step:
            progress(msg.step)
    return on_message


def as_message(msg: dict, *kinds: type[Message]) -> Message | None:
    """The message a rank sent, read by the codec when it is one of `kinds`; None otherwise."""
    if not any(kind_of(msg) == kind.KIND for kind in kinds):
        return None
    return decode(msg)


def worker_result(run: RunResult, *kinds: type[Message]) -> Message | None:
    """The first message of one of `kinds` that the ranks of `run` sent, read by the codec (a
    worker's result or its WorkerFailure); None when none came (the run's failure says why)."""
    found = (as_message(msg, *kinds) for _, msg in run.messages)
    return next((msg for msg in found if msg is not None), None)


def is_reporting_rank() -> bool:
    """True unless this process is a non-zero rank of a torchrun/SLURM job (only rank 0 reports)."""
    job = external_job()
    return job is None or job.rank == 0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Rank:
    rank: int
    proc: forks.ForkedRank
    reader: BinaryIO  # the rank's message pipe, unbuffered
    log_path: str
    buffer: bytes = b""
    last_progress_t: float = 0.0
    started: bool = False           # has sent a first message
    last_step: str | None = None
    done: bool = False
    eof: bool = False
    error: str | None = None        # the message of an "error" report, if the rank sent one
    error_t: float | None = None    # when that report arrived
    exit_seen_t: float | None = None


def _rank_env(spec: JobSpec, rank: int, port: int, job_file: str) -> dict:
    """The rank's whole environment (the fork server adds where its messages go, and itself as the
    launcher the rank dies with)."""
    env = dict(os.environ)
    env.update(spec.env)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "RANK": str(rank), "WORLD_SIZE": str(spec.nproc),
        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(spec.nproc),
        "TOPOPROF_JOB": job_file,
    })
    # Gloo would otherwise resolve the hostname, which may not be loopback; keep ranks on lo.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _start_ranks(spec: JobSpec, log_dir: str, ranks: list) -> None:
    """Start every rank, appending each to `ranks` at once so a failure part-way kills those started."""
    port = free_port()
    job_file = os.path.join(log_dir, "job.json")
    with open(job_file, "w") as f:
        json.dump({"worker": spec.worker, "backend": spec.backend, "timeout_s": spec.timeout_s,
                   **_job_document(spec.config)}, f)
    server = forks.server_for(spec.env)
    for rank in range(spec.nproc):
        read_fd, write_fd = os.pipe()
        reader = os.fdopen(read_fd, "rb", buffering=0)
        log_path = os.path.join(log_dir, f"rank{rank}.log")
        try:
            with open(log_path, "wb") as log:
                proc = server.fork(_rank_env(spec, rank, port, job_file), spec.worker, log.fileno(), write_fd,
                                   spec.startup_timeout_s)
        except BaseException:
            reader.close()
            raise
        finally:
            os.close(write_fd)
        ranks.append(_Rank(rank, proc, reader, log_path, last_progress_t=time.monotonic()))


def _job_document(config: Message) -> dict:
    """The job as the rank reads it: the typed job encoded under "job"
    (topoprof.probes.ranks.rank_main.main)."""
    return {"job": encode(config)}


def _log_tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4000))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def _exit_reason(code: int | None) -> str:
    if code is None:  # pragma: no cover - asked only of a rank seen to exit
        return "ended with no exit status"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _kill_all(ranks: list[_Rank]) -> None:
    for r in ranks:
        if r.proc.poll() is None:
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for r in ranks:
        try:
            r.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        try:
            r.reader.close()
        except OSError:
            pass


def _drain(r: _Rank, on_message: OnMessage, messages: list) -> None:
    """Read what rank r has sent; deliver whole JSON lines."""
    try:
        chunk = r.reader.read(65536)
    except BlockingIOError:
        return
    if not chunk:
        r.eof = True
        return
    r.buffer += chunk
    *lines, r.buffer = r.buffer.split(b"\n")
    for line in lines:
        if not line.strip():
            continue
        msg = json.loads(line)
        r.last_progress_t = time.monotonic()
        r.started = True
        own = as_message(msg, Progress, RankDone, RankError)
        if isinstance(own, Progress):
            r.last_step = own.step
        elif isinstance(own, RankDone):
            r.done = True
        elif isinstance(own, RankError):
            r.error, r.error_t = own.message, time.monotonic()
        messages.append((r.rank, msg))
        on_message(r.rank, msg)


def _failure(r: _Rank, reason: str) -> RankFailure:
    tail = r.error if r.error else _log_tail(r.log_path)
    return RankFailure(r.rank, reason, r.last_step, tail, r.log_path)


def _check(ranks: list[_Rank], timeout_s: float, startup_timeout_s: float) -> RankFailure | None:
    now = time.monotonic()
    for r in ranks:
        if r.exit_seen_t is None and r.proc.poll() is not None:
            r.exit_seen_t = now
    # When one rank dies its peers fail too a moment later, with errors about the lost peer:
    # blame the rank whose failure is its own, then the first to report or to exit. A rank that
    # died before it could report says what it lost in its log (two exits can be seen at once).
    dead = [r for r in ranks if r.exit_seen_t is not None and r.proc.returncode != 0 and r.eof]
    if dead:
        lost = {x.rank: _lost_a_peer(x.error or _log_tail(x.log_path)) for x in dead}
        # The kernel closes a dying process's pipe before its exit can be reaped: a rank killed
        # first may still be in its teardown when the peer it left has failed and exited. Wait for
        # it while every failure seen only reflects a lost peer.
        exiting = [x for x in ranks if x.eof and x.exit_seen_t is None]
        if all(lost.values()) and exiting and now - min(x.exit_seen_t or now for x in dead) < EXIT_GRACE_S:
            return None
        r = min(dead, key=lambda x: (lost[x.rank], x.error_t if x.error_t is not None else now, x.exit_seen_t))
        return _failure(r, _exit_reason(r.proc.returncode))
    # A rank stuck while its peers wait for it: blame the one silent the longest.
    def limit(r: _Rank) -> float:
        return timeout_s if r.started else max(timeout_s, startup_timeout_s)

    stale = [r for r in ranks if r.proc.poll() is None and now - r.last_progress_t > limit(r)]
    if stale:
        r = min(stale, key=lambda x: x.last_progress_t)
        state = _proc_state(r.proc.pid)
        what = "hung" if r.started else "never started (no message since launch)"
        return _failure(r, f"{what}: no progress for {now - r.last_progress_t:.0f} s "
                           f"(timeout {limit(r):g} s{state})")
    return None


# How long a rank whose pipe has closed may take to be seen exiting before a peer's failure is
# blamed instead: its teardown (unmapping torch's memory) takes milliseconds, longer on a loaded
# machine; the watch goes on as soon as the exit is seen.
EXIT_GRACE_S = 2.0

# How torch's gloo and NCCL process groups word an error that only reflects a peer's failure.
_PEER_LOSS = ("remote worker", "Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "remote process exited", "communicator was aborted")


def _lost_a_peer(error: str | None) -> bool:
    return error is not None and any(text in error for text in _PEER_LOSS)


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return {"T": ", process stopped", "t": ", process stopped by a tracer", "D": ", in uninterruptible I/O",
            "Z": ", zombie"}.get(state, "")


def launch_local(spec: JobSpec, on_message: OnMessage | None = None) -> RunResult:
    """Run spec.worker on spec.nproc local ranks; never leaves a process behind, nor a temporary
    log folder after a run that went well (a failed run's folder stays, named in its failure)."""
    if spec.nproc < 1:
        raise InputError(f"--nproc must be at least 1 (got {spec.nproc})")
    on_message = on_message or (lambda rank, msg: None)
    log_dir = spec.log_dir or tempfile.mkdtemp(prefix="topoprof-ranks-")
    os.makedirs(log_dir, exist_ok=True)
    start = time.monotonic()
    messages: list[tuple[int, dict]] = []
    ranks: list[_Rank] = []
    failure = None
    interrupted = False
    try:
        _start_ranks(spec, log_dir, ranks)
        failure = _watch(ranks, spec.timeout_s, spec.startup_timeout_s, on_message, messages)
    except forks.ForkServerGone as err:
        failure = RankFailure(len(ranks), f"could not be started: {err}", None, "")
    except KeyboardInterrupt:  # the user stopped it: nothing will read the folder
        interrupted = True
        raise
    finally:
        _kill_all(ranks)
        if interrupted and spec.log_dir is None:
            shutil.rmtree(log_dir, ignore_errors=True)
    logs = read_rank_logs(log_dir) if spec.env.get("NCCL_DEBUG") else {}
    if failure is None and spec.log_dir is None:
        shutil.rmtree(log_dir, ignore_errors=True)
    return RunResult(messages, failure, log_dir, time.monotonic() - start, logs)


def _watch(ranks: list[_Rank], timeout_s: float, startup_timeout_s: float, on_message: OnMessage,
           messages: list) -> RankFailure | None:
    sel = selectors.DefaultSelector()
    for r in ranks:
        os.set_blocking(r.reader.fileno(), False)
        sel.register(r.reader, selectors.EVENT_READ, r)
    while True:
        for key, _ in sel.select(timeout=0.2):
            r = key.data
            _drain(r, on_message, messages)
            if r.eof:
                sel.unregister(r.reader)
        failure = _check(ranks, timeout_s, startup_timeout_s)
        if failure is not None:
            return failure
        if all(r.eof and r.proc.poll() is not None for r in ranks):
            return _final_check(ranks)


def _final_check(ranks: list[_Rank]) -> RankFailure | None:
    for r in ranks:
        if r.proc.returncode != 0:
            return _failure(r, _exit_reason(r.proc.returncode))
        if not r.done:
            return _failure(r, "ended without finishing its work")
    return None


def multi_node() -> bool:
    """Inside a torchrun/SLURM job that spans more than one node."""
    job = external_job()
    return job is not None and job.nodes > 1
