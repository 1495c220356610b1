"""Run rank work locally (spawned ranks) or as one rank of an enclosing torchrun/SLURM job."""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time

from topoprof.errors import InputError, NothingMeasured
from topoprof.measure import slurm
from topoprof.measure.launch import (
    ExternalJob,
    JobSpec,
    OnMessage,
    RankFailure,
    RunResult,
    external_job,
    launch_local,
    read_rank_logs,
)
from topoprof.probes.hardware.nvml import query_nvml
from topoprof.probes.ranks import dist
from topoprof.probes.ranks.rank_main import RankContext, resolve


def visible_gpus() -> int:
    """CUDA GPUs this process can use. Without NVML there is no NVIDIA driver, hence no CUDA GPU,
    and torch (seconds to import) is not needed to say so; with it, torch counts, as it honours
    CUDA_VISIBLE_DEVICES the way the ranks will."""
    try:
        query_nvml()
    except NothingMeasured:
        return 0
    import torch  # lazy: torch; the CLI imports this module and runs without torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_backend_and_nproc(backend: str | None, nproc: int | None) -> tuple[str, int, str]:
    """NCCL with one rank per visible GPU; with no GPU, gloo with 2 CPU ranks. Returns a note too."""
    gpus = visible_gpus()
    if backend is None:
        backend = "nccl" if gpus > 0 else "gloo"
    job = external_job()
    if job is not None:
        if nproc is not None and nproc != job.world_size:
            raise InputError(f"--nproc {nproc} conflicts with the {job.launcher} job's WORLD_SIZE {job.world_size}")
        note = (f"rank {job.rank} of a {job.launcher} job of {job.world_size} rank(s) on {job.nodes} node(s); "
                f"backend {backend}; {gpus} visible GPU(s) on this node")
        if job.launcher == "slurm":
            where = slurm.rendezvous(os.environ)
            note += f"; rendezvous at {where.addr}:{where.port} ({where.source})"
        return backend, job.world_size, note
    if nproc is None:
        nproc = gpus if backend == "nccl" else 2
    note = f"{gpus} visible GPU(s); backend {backend}, {nproc} rank(s)"
    if backend == "nccl" and gpus == 0:
        raise NothingMeasured("--backend nccl needs a CUDA GPU; none is visible (use --backend gloo)")
    if backend == "nccl" and nproc > gpus:
        raise InputError(f"--nproc {nproc} > {gpus} visible GPU(s): NCCL needs one GPU per rank")
    return backend, nproc, note


def run_job(spec: JobSpec, on_message: OnMessage) -> RunResult:
    job = external_job()
    if job is None:
        return launch_local(spec, on_message)
    return _run_in_process(job, spec, on_message)


def explain_job_error(err: Exception, job: ExternalJob, timeout_s: float) -> str:
    """What a torch.distributed error means for the job, in its own words."""
    text = str(err)
    if isinstance(err, Stopped):
        return text
    joined = re.search(r"(\d+)/(\d+) clients joined", text)
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    if joined:
        return (f"timed out after {timeout_s:g} s: only {joined.group(1)} of {joined.group(2)} ranks joined the "
                f"rendezvous at {where}; the ranks of the other node(s) never connected (are they started, "
                "and can they reach that address?)")
    if "Connection closed by peer" in text or "Connection reset by peer" in text:
        peer = re.search(r"\[([^\]]+)\]:\d+", text)
        return (f"lost its connection to a peer rank{' on ' + peer_host(peer.group(1)) if peer else ''}: that rank or "
                "its node stopped (see its log)")
    if "Timed out" in text or "timeout" in text.lower():
        return f"timed out after {timeout_s:g} s waiting for the other ranks (a rank hung or a node is unreachable)"
    return f"raised {type(err).__name__}"


class Stopped(Exception):
    """The launcher asked this rank to stop (scancel, a time limit, a preemption: SIGTERM)."""


def _stop_on_sigterm():
    """SIGTERM becomes `Stopped` in the rank's own code, so what was measured is still written.

    SLURM sends SIGTERM to every task of a cancelled, timed-out or preempted step and SIGKILL only
    KillWait seconds later (slurm.conf(5), 30 s by default); torchrun forwards SIGTERM the same way.
    The handler is one-shot: a second SIGTERM must not interrupt the writing of the report."""
    def stop(signum, _frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Stopped(f"was stopped by {signal.Signals(signum).name} (scancel, the job's time limit or a "
                      "preemption)")

    if threading.current_thread() is not threading.main_thread():
        return signal.getsignal(signal.SIGTERM)  # only the main thread may set handlers
    return signal.signal(signal.SIGTERM, stop)


def _rendezvous_from_slurm() -> None:
    """torch's env:// rendezvous reads MASTER_ADDR/MASTER_PORT: fill them from SLURM's own variables."""
    where = slurm.rendezvous(os.environ)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = where.addr, str(where.port)


def peer_host(addr: str) -> str:
    """A peer's address with the node name the cluster's resolver gives it ("node7 (10.1.0.7)")."""
    try:
        return f"{socket.gethostbyaddr(addr)[0]} ({addr})"
    except (OSError, UnicodeError):
        return addr


def _job_failure(err: Exception, job: ExternalJob, spec: JobSpec) -> RankFailure:
    return RankFailure(job.rank, explain_job_error(err, job, spec.timeout_s), None,
                       str(err).splitlines()[0][:300] if str(err) and not isinstance(err, Stopped) else "")


def _run_in_process(job: ExternalJob, spec: JobSpec, on_message: OnMessage) -> RunResult:
    """This process is one rank of torchrun/SLURM: run the worker here; rank 0 reports."""
    messages: list[tuple[int, dict]] = []

    def emit(msg: dict) -> None:
        messages.append((job.rank, msg))
        if job.rank == 0:
            on_message(0, msg)

    start = time.monotonic()
    failure = None
    log_dir = ""
    if spec.env.get("NCCL_DEBUG") and "NCCL_DEBUG_FILE" not in os.environ:
        # NCCL would print to stdout, into the command's own output (--json): give it a file.
        log_dir = tempfile.mkdtemp(prefix="topoprof-nccl-")
        os.environ["NCCL_DEBUG_FILE"] = os.path.join(log_dir, f"rank{job.rank}.log")
    os.environ.update({k: v for k, v in spec.env.items() if k not in os.environ})
    previous_handler = _stop_on_sigterm()
    try:
        if job.launcher == "slurm":
            _rendezvous_from_slurm()
        env = dist.init(spec.backend, spec.timeout_s)
        resolve(spec.worker)(RankContext(env, emit, spec.timeout_s), spec.config)
    except Exception as err:  # one line; peers see the broken group and stop too
        try:
            failure = _job_failure(err, job, spec)
        except Stopped as stopped:  # the SIGTERM came while the error was explained: the peer's loss was its doing
            failure = _job_failure(stopped, job, spec)
    finally:
        try:
            dist.finish()
        except Stopped as err:  # the SIGTERM came after the work, while the group was torn down
            failure = failure or RankFailure(job.rank, explain_job_error(err, job, spec.timeout_s), None, "")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous_handler)
    rank_logs = read_rank_logs(log_dir) if log_dir else {}
    if log_dir:  # NCCL's log file of this rank: kept and named when the rank failed
        debug_file = os.environ.pop("NCCL_DEBUG_FILE", os.path.join(log_dir, f"rank{job.rank}.log"))
        if failure is not None and os.path.exists(debug_file):
            failure = dataclasses.replace(failure, log_path=debug_file)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)
    return RunResult(messages, failure, log_dir=log_dir, wall_s=time.monotonic() - start, rank_logs=rank_logs)
