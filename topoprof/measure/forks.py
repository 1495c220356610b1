"""Local ranks forked from a warm interpreter (`topoprof.probes.ranks.fork_server`).

A rank started as a new interpreter imports torch (and torch._dynamo, at its first optimizer)
before its first message: seconds, for every rank of every launch. The launcher keeps one fork
server per thread and per job environment instead, started at its first launch and kept until
this process ends, and asks it for each rank. Where a shared server is running (TOPOPROF_FORK_SERVER,
as the test suite starts one for all its commands), a fork of it serves this process instead, and
not even the first launch waits for torch.

`ForkedRank` answers as much of subprocess.Popen as the launcher uses (pid, returncode, poll,
wait). No torch here.
"""
from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from topoprof.specs.fork_protocol import SHARED_SERVER_VAR, import_fingerprint, server_env

# How long a shared server may take to fork the one that serves this process (it has imported all
# before it listens) before this process starts a server of its own instead.
_JOIN_TIMEOUT_S = 10.0

# this process's servers, by the thread that started each and its job's environment
_SERVERS: dict[tuple, "ForkServer"] = {}


class ForkServerGone(Exception):
    """The fork server could not start a rank: it exited, or refused; says why."""


class ForkServer:
    """One `topoprof.probes.ranks.fork_server` process and its socket: one this process started
    (`start`), or the fork of a shared server that serves this process alone (`join`)."""

    def __init__(self, sock: socket.socket, log, pid: int, proc: subprocess.Popen | None = None):
        self._sock = sock
        # its output, read back to say why it failed; a file with no name, which nothing leaves behind
        self._log = log
        self.pid = pid
        self.proc = proc     # None for a shared server's fork, which is not this process's child
        self._exits: dict[int, int] = {}
        self._gone = False

    @classmethod
    def start(cls, env: dict) -> "ForkServer":
        """A server of this process's own, started with `env`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = tempfile.TemporaryFile()
        env = dict(server_env(env), TOPOPROF_FORK_SERVER_FD=str(theirs.fileno()),
                   TOPOPROF_LAUNCHER_PID=str(os.getpid()))
        proc = subprocess.Popen(
            [sys.executable, "-m", "topoprof.probes.ranks.fork_server"], env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
            start_new_session=True,  # setsid() in subprocess's C code: no preexec_fn
        )
        theirs.close()
        return cls(ours, log, proc.pid, proc)

    @classmethod
    def join(cls, path: str, env: dict) -> "ForkServer | None":
        """A fork of the shared server listening at `path`, serving this process alone; None where
        there is none ready there, or it refuses this process (its imports would differ from those
        of a server started with `env`)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = tempfile.TemporaryFile()
        try:
            sock.connect(path)
            hello = {"fingerprint": import_fingerprint(server_env(env)), "cwd": os.getcwd()}
            socket.send_fds(sock, [json.dumps(hello).encode()], [log.fileno()])
            # the shared server only forks: it answers at once, unless it is stuck
            with selectors.DefaultSelector() as sel:
                sel.register(sock, selectors.EVENT_READ)
                reply = json.loads(sock.recv(1 << 16) or b"{}") if sel.select(_JOIN_TIMEOUT_S) else {}
        except (OSError, ValueError):
            reply = {}
        if "server" not in reply:
            sock.close()
            log.close()
            return None
        return cls(sock, log, int(reply["server"]))

    def alive(self) -> bool:
        return not self._gone and (self.proc is None or self.proc.poll() is None)

    def fork(self, env: dict, worker: str, log_fd: int, result_fd: int, timeout_s: float) -> "ForkedRank":
        """A rank of `worker` with this environment, its stdout and stderr on log_fd, its messages
        on result_fd."""
        try:
            socket.send_fds(self._sock, [json.dumps({"env": env, "worker": worker}).encode()], [log_fd, result_fd])
        except (BrokenPipeError, ConnectionResetError):  # its end is closed: the server has ended
            self._gone = True
            raise ForkServerGone(self._why("exited before it answered")) from None
        except OSError as err:
            raise ForkServerGone(self._why(f"could not be reached ({err})")) from None
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._receive(deadline - time.monotonic())
            if reply is None:
                raise ForkServerGone(self._why("exited before it answered" if self._gone
                                               else f"did not answer within {timeout_s:g} s"))
            if "pid" in reply:
                return ForkedRank(self, reply["pid"])
            if "error" in reply:
                raise ForkServerGone(f"the fork server could not fork a rank: {reply['error']}")

    def returncode(self, pid: int, timeout_s: float = 0.0) -> int | None:
        """The rank's exit code once it has ended; None while it runs (after waiting timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while pid not in self._exits:
            if self._gone:  # its ranks die with it (PR_SET_PDEATHSIG), reaped by another
                if _ended(pid):
                    return -signal.SIGKILL
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.01)
            elif self._receive(max(0.0, deadline - time.monotonic())) is None and time.monotonic() >= deadline:
                return None
        return self._exits[pid]

    def close(self) -> None:
        """End the server now: its ranks have ended (the launcher waits for them), and what it may
        be importing for later ones is not needed."""
        self._sock.close()
        # a shared server's fork leaves by itself once its socket is closed, and is not ours to reap
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def _receive(self, timeout_s: float) -> dict | None:
        """The next message, waiting up to timeout_s; records exits. None: nothing came."""
        if self._gone:
            return None
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            if not sel.select(max(0.0, timeout_s)):
                return None
        try:
            data = self._sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:  # the server is gone
            self._gone = True
            return None
        msg = json.loads(data)
        if "exited" in msg:
            self._exits[msg["exited"]] = msg["code"]
        return msg

    def _why(self, what: str) -> str:
        ended = ""
        if self.proc is not None:
            try:  # a server that closed its socket is exiting: its code comes at once
                code: int | None = self.proc.wait(timeout=5 if self._gone else 0)
            except subprocess.TimeoutExpired:
                code = None
            ended = f" (it {'exited with code %d' % code if code is not None else 'is still running'})"
        self._log.seek(0)
        lines = [line for line in self._log.read().decode(errors="replace").splitlines() if line.strip()]
        # the error a traceback or Python's own fatal error ends with names the cause; else the last line
        errors = [line for line in lines if not line[0].isspace() and "Error" in line]
        tail = f"; it said: {(errors or lines)[-1]}" if lines else ""
        return f"the fork server {what}{ended}{tail}"


def _ended(pid: int) -> bool:
    """The process has exited (reaped, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


class ForkedRank:
    """A forked rank, as the launcher watches it."""

    def __init__(self, server: ForkServer, pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float) -> int:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
        return self.returncode


def server_for(job_env: dict) -> ForkServer:
    """This thread's fork server for jobs with this environment, started on first use.

    Per thread: a server dies with the thread that started it (PR_SET_PDEATHSIG). Per job
    environment: torch reads some of it when imported, which the server does once. A job that
    sets no environment of its own is served by a fork of the shared server that
    TOPOPROF_FORK_SERVER names, where there is one ready that imported what this process's own
    server would (`topoprof.specs.fork_protocol`).
    """
    key = (threading.get_ident(), tuple(sorted(job_env.items())))
    server = _SERVERS.get(key)
    if server is None or not server.alive():
        if server is not None:
            server.close()
        env = dict(os.environ, **job_env)
        shared = os.environ.get(SHARED_SERVER_VAR)
        joined = ForkServer.join(shared, env) if shared and not job_env else None
        server = _SERVERS[key] = joined or ForkServer.start(env)
    return server


@atexit.register
def _close_servers() -> None:
    for server in _SERVERS.values():
        server.close()
    _SERVERS.clear()
