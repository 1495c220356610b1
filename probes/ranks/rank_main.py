"""What one rank started by topoprof's launcher runs: `main`, in a process forked from the fork
server (topoprof.probes.ranks.fork_server).

The launcher passes the job in TOPOPROF_JOB (a JSON file: a typed job of topoprof.specs.messages
under "job") and a pipe in TOPOPROF_RESULT_FD; the rank writes one JSON message per line to that
pipe, each a message of topoprof.specs.messages but the launcher's own `done` and `error`.
stdout/stderr stay free for libraries (NCCL's INFO lines) and land in the rank's log file.
TOPOPROF_LAUNCHER_PID names the process this rank must not outlive (`die_with_launcher`): the
fork server, which itself must not outlive the launcher.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import sys
import time
import traceback

from topoprof.probes.ranks import dist
from topoprof.specs.messages import (
    Message,
    PhasesJob,
    PhaseStarted,
    Progress,
    RankDone,
    RankError,
    SleepJob,
    SleepStep,
    decode,
    encode,
)

# <linux/prctl.h>: the signal a process gets when the thread that started it exits
_PR_SET_PDEATHSIG = 1

# worker name -> "module:function"; the function takes (ctx: RankContext, job), job being the
# worker's typed job (topoprof.specs.messages).
WORKERS = {
    "collectives": "topoprof.probes.ranks.collective_timing:run_rank",
    "training": "topoprof.probes.ranks.training:run_rank",
    "numerics": "topoprof.probes.ranks.numerics:run_rank",
    "validation": "topoprof.probes.ranks.validation:run_rank",
    "sleep": "topoprof.probes.ranks.rank_main:_sleep_worker",
    "phases": "topoprof.probes.ranks.rank_main:_phases_worker",
    "nodes": "topoprof.probes.ranks.nodes:run_rank",
    "user_model": "topoprof.probes.ranks.model_timing:run_rank",
    "op_trace": "topoprof.trace.op_trace:run_rank",
    "profile": "topoprof.probes.device_profile.profile_worker:run_rank",
}


# The most a rank that goes on stays silent (`RankContext.going_on`): a few messages a minute, and a
# quarter of the launcher's timeout where that is shorter, so that a rank still working is never
# taken for a hung one.
GOING_ON_EVERY_S = 10.0


class RankContext:
    """What a worker needs: its place in the job and a way to report."""

    def __init__(self, env, emit, timeout_s: float, clock=time.monotonic):
        self.env = env
        self.rank = env.rank
        self.world_size = env.world_size
        self.device = env.device
        self.timeout_s = timeout_s
        self._emit = emit
        self._clock = clock
        self._sent_t = clock()
        self._step = ""
        self._went_on = 0

    def send(self, msg: Message) -> None:
        """Report a typed message, written by the codec."""
        self._sent_t = self._clock()
        self._send(encode(msg))

    def _send(self, msg: dict) -> None:
        self._emit(msg)

    def progress(self, step: str) -> None:
        self._step, self._went_on = step, 0
        self.send(Progress(step))

    def going_on(self, unit: str) -> None:
        """One more `unit` (a micro-batch) begun within the step last reported: said as progress
        where the rank has been silent for `GOING_ON_EVERY_S` (or a quarter of its timeout), so
        that the launcher, which ends a rank silent for its timeout as hung, tells a slow one
        that goes on from a hung one. Costs a clock read otherwise."""
        self._went_on += 1
        if self._clock() - self._sent_t >= min(GOING_ON_EVERY_S, self.timeout_s / 4):
            self.send(Progress(f"{self._step}: {unit} {self._went_on}" if self._step else f"{unit} {self._went_on}"))


class _PhaseContext(RankContext):
    """A RankContext whose messages carry the phase they belong to."""

    def __init__(self, parent: RankContext, phase: str):
        super().__init__(parent.env, parent._emit, parent.timeout_s)
        self.phase = phase

    def _send(self, msg: dict) -> None:
        self._emit({"type": msg["type"], "phase": self.phase, **msg})


def _phases_worker(ctx: RankContext, job: PhasesJob) -> None:
    """Run several workers one after the other in the same process group (one launch for a scan).

    A phase that fails on one rank raises there, which ends the whole run: the launcher stops the
    peers and keeps what the earlier phases reported.
    """
    # lazy: torch; the CLI imports this module, and a rank leaves before torch if its launcher is gone
    import torch.distributed as dist

    for phase in job.phases:
        ctx.send(PhaseStarted(phase["name"]))
        resolve(phase["worker"])(_PhaseContext(ctx, phase["name"]), decode(phase["config"]))
        dist.barrier()


def _sleep_worker(ctx: RankContext, job: SleepJob) -> None:
    """A worker for testing the launcher: reports, waits, optionally fails on one rank."""
    # lazy: torch; the CLI imports this module, and a rank leaves before torch if its launcher is gone
    import torch.distributed as dist

    for i in range(job.steps):
        ctx.progress(f"step {i}")
        if ctx.rank == job.fail_rank and i == job.fail_step:
            if job.how == "exit":
                os._exit(7)
            if job.how == "hang":
                time.sleep(3600)
            raise RuntimeError("injected failure")
        dist.barrier()
        ctx.send(SleepStep(ctx.rank, i, os.getpid(), os.path.abspath(__file__), os.getppid(), os.getsid(0),
                           os.getpgid(0), os.getcwd()))
        time.sleep(job.sleep_s)


def resolve(worker: str):
    module, func = WORKERS[worker].split(":")
    return getattr(importlib.import_module(module), func)


def die_with_launcher() -> None:
    """Be killed when the launcher dies, even by SIGKILL; leave at once if it already has.

    Called first thing by the fork server (whose launcher is the CLI, which runs no Python between
    fork and exec: it may hold a CUDA context and threads), before torch is imported, and by each
    rank forked from it (whose launcher is the server). The launcher may have died before the
    signal was armed: the process then already belongs to init (or a subreaper) and its parent is
    no longer the pid in TOPOPROF_LAUNCHER_PID. Checking after arming leaves no gap (prctl(2)).
    """
    launcher = os.environ.get("TOPOPROF_LAUNCHER_PID")
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            print(f"rank: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
    # Without prctl (not Linux) the launcher kills every rank's process group when it ends in any
    # way Python sees (launch_local's `finally`, KeyboardInterrupt included). A SIGKILLed launcher
    # cannot: its ranks then end at their next message, whose write to the result pipe fails
    # (BrokenPipeError) with no reader left.
    if launcher is not None and os.getppid() != int(launcher):
        print(f"rank: the launcher (pid {launcher}) is gone (parent is now pid {os.getppid()}); "
              "leaving", file=sys.stderr, flush=True)
        os._exit(1)


def _config(job: dict) -> Message:
    """The worker's typed job as the launcher wrote it (topoprof.measure.launch._job_document)."""
    return decode(job["job"])


def main() -> None:
    die_with_launcher()
    with open(os.environ["TOPOPROF_JOB"]) as f:
        job = json.load(f)
    out = os.fdopen(int(os.environ["TOPOPROF_RESULT_FD"]), "w", buffering=1)

    def emit(msg: dict) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()


    try:
        env = dist.init(job["backend"], float(job["timeout_s"]))
        ctx = RankContext(env, emit, float(job["timeout_s"]))
        resolve(job["worker"])(ctx, _config(job))
        # Every rank has finished its collectives before any leaves: a peer closing its sockets
        # early would fail a rank still inside its last operation.
        # lazy: torch; the CLI imports this module, and a rank leaves before torch if its launcher is gone
        import torch.distributed

        torch.distributed.barrier()
        emit(encode(RankDone()))
    except BaseException as err:  # report, then exit non-zero: the launcher stops the peers
        traceback.print_exc()
        emit(encode(RankError(f"{type(err).__name__}: {err}".splitlines()[0][:500])))
        out.close()
        os._exit(1)
    # Leave without tearing the process group down: the work is done and reported, and gloo's
    # teardown can abort the process ("terminate called without an active exception") or take
    # seconds; the operating system releases the sockets and memory.
    out.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

