"""The process every local rank is forked from: `python -m topoprof.probes.ranks.fork_server`.

Importing torch takes seconds, and its first optimizer, DDP wrapper or checkpoint imports
torch._dynamo on first use (torch/_compile.py `_disable_dynamo`), seconds more; a rank started as a
new interpreter pays both before its first message. The launcher starts this server once (per
thread, per job environment; `topoprof.measure.forks`), which imports them once, and asks it for
each rank: the rank is a fork of a process that has imported torch but run nothing on it.
torch supports exactly that (its thread pools are made anew in a forked child; CUDA is never
touched here, which `_fork_rank` checks before each fork).

The protocol, on a SOCK_SEQPACKET unix socket (one message a packet, each a JSON object):
- the launcher sends {"env": {...}, "worker": W} with two descriptors: the rank's log file (its
  stdout and stderr) and the write end of its result pipe;
- the server answers {"pid": N}, or {"error": "..."} when it cannot fork;
- and, as its ranks end, {"exited": N, "code": C}: C is as subprocess.Popen.returncode has it
  (negative: the signal that ended it).
The server leaves when the socket closes, or, by PR_SET_PDEATHSIG, when its launcher dies; each
rank dies with the server the same way (`rank_main.die_with_launcher`, the server named as the
rank's launcher), so nothing outlives the launcher.

`--listen PATH` makes a server that many launchers share (`listen`): whoever runs many commands, as
the test suite does, starts it once and names PATH in TOPOPROF_FORK_SERVER
(`topoprof.specs.fork_protocol`). A launcher connects, says hello, and is served as above by a fork
of that server of its own, which leaves when the launcher's end of the socket closes, as it does
when the launcher dies.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import socket
import sys
import traceback
from collections.abc import Iterator

from topoprof.probes.ranks import rank_main
from topoprof.specs.fork_protocol import how_they_differ, import_fingerprint

# <linux/prctl.h>: set the calling thread's name (15 bytes, what /proc/PID/comm shows)
_PR_SET_NAME = 15

# the largest request: a rank's environment, as JSON
_MAX_PACKET = 1 << 20

# Workers (rank_main.WORKERS) whose ranks build no optimizer, DDP or FSDP wrapper and no
# checkpoint, so never import torch._dynamo: a server that forked only these (a bench) leaves it
# unimported, rather than spend seconds of a core on it beside its ranks or while its launcher
# finishes. A 1-rank gloo bench (`bench --nproc 1 --backend gloo -b 1K -e 64K -n 5 -w 2`) took
# 4.8-5.1 s (4.9-5.0 CPU-s) with the warm-up, 3.4-3.5 s (3.3-3.4 CPU-s) without, on 2 cores.
WITHOUT_DYNAMO = frozenset({"collectives", "sleep", "nodes"})


def _import_torch() -> None:
    """What every rank needs before its first message; the server forks none before it has it."""
    # lazy: torch; this module is imported nowhere else, and leaves before torch if its launcher is gone
    import torch
    import torch.distributed  # noqa: F401

    if torch.cuda.is_initialized():  # pragma: no cover - nothing above touches CUDA
        raise RuntimeError("CUDA was initialised before any rank was forked")


def _import_dynamo() -> None:
    """What a rank's first optimizer, DDP wrapper or checkpoint imports (torch/_compile.py
    `_disable_dynamo`): seconds, which a rank forked later need not spend. Imported while the
    server waits with a core to spare (`_spare_core`), once it has forked a rank that uses it
    (`dynamo_wanted`): a launch's ranks neither wait for it nor share a core with it, and one that
    needs it before imports it itself."""
    # lazy: torch; see _import_torch
    import torch._dynamo  # noqa: F401


def _fork_rank(sock: socket.socket, env: dict, log_fd: int, result_fd: int) -> int:
    """Fork one rank; in the child, never return."""
    # lazy: torch, imported by _import_torch before the first request
    import torch

    if torch.cuda.is_initialized():  # a forked child could not use CUDA (torch's bad-fork check)
        raise RuntimeError("CUDA is initialised in the fork server")
    server = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        sock.close()
        os.setsid()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.environ.clear()
        # the server is the rank's launcher: the rank dies with it (rank_main.die_with_launcher)
        os.environ.update(env, TOPOPROF_RESULT_FD=str(result_fd), TOPOPROF_LAUNCHER_PID=str(server))
        _name_this_process(f"topoprof-rank{env.get('RANK', '')}")
        rank_main.main()
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(1)


def _name_this_process(name: str) -> None:
    """What ps, top and psutil show for a rank (they would show the server's command line)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15])


def _serve_one(sock: socket.socket, running: set[int], workers: set[str]) -> bool:
    """Answer one request, adding the rank's worker to `workers`; False when the launcher has
    closed the socket."""
    data, fds, _, _ = socket.recv_fds(sock, _MAX_PACKET, 2)
    if not data:
        return False
    try:
        log_fd, result_fd = fds
        request = json.loads(data)
        pid = _fork_rank(sock, request["env"], log_fd, result_fd)
        workers.add(request["worker"])
        running.add(pid)
        sock.send(json.dumps({"pid": pid}).encode())
    except (OSError, RuntimeError, ValueError) as err:
        sock.send(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
    finally:
        for fd in fds:
            os.close(fd)
    return True


def _ended_children() -> Iterator[tuple[int, int]]:
    """(pid, exit code as subprocess.Popen.returncode has it) of each child that has ended, reaped."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def _report_exits(sock: socket.socket, running: set[int]) -> None:
    for pid, code in _ended_children():
        running.discard(pid)
        sock.send(json.dumps({"exited": pid, "code": code}).encode())


def dynamo_wanted(workers: set[str]) -> bool:
    """Whether ranks of these workers import torch._dynamo, so that later ones would too."""
    return bool(workers - WITHOUT_DYNAMO)


def _spare_core(running: set[int]) -> bool:
    """A core this process may use that no rank of its own is busy on."""
    return len(running) < len(os.sched_getaffinity(0))


def serve(sock: socket.socket, warm: bool) -> None:
    """Fork the ranks one launcher asks for on `sock` and report their exits, until it closes the
    socket; `warm`: torch._dynamo is imported already."""
    running: set[int] = set()
    workers: set[str] = set()
    try:
        while True:
            # Exits are found by polling: a rank's end is seen within this long, which the
            # launcher's own watch (0.2 s) does not notice. A launch asks for its ranks one after
            # the other, with no such gap between them.
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable and not _serve_one(sock, running, workers):
                return
            _report_exits(sock, running)
            if not readable and not warm and dynamo_wanted(workers) and _spare_core(running):
                _import_dynamo()
                warm = True
    except (BrokenPipeError, ConnectionResetError):  # the launcher is gone
        return


def listen(path: str) -> None:
    """Be the server every launcher that connects to `path` shares: torch and torch._dynamo are
    imported once, here, and each launcher is served by a fork of this process of its own (`serve`),
    which leaves when that launcher closes its socket or dies. The socket exists only once the
    imports are done: a launcher that comes earlier, or whose `import_fingerprint` differs, starts
    a server of its own."""
    rank_main.die_with_launcher()
    fingerprint = import_fingerprint(dict(os.environ))   # before torch adds to the environment
    _import_torch()
    _import_dynamo()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    while True:
        readable, _, _ = select.select([listener], [], [], 1.0)
        if readable:
            conn, _ = listener.accept()
            with conn:
                _welcome(conn, listener, fingerprint)
        _reap_servers()


def _welcome(conn: socket.socket, listener: socket.socket, fingerprint: dict) -> None:
    """Answer a launcher's hello: {"fingerprint": F, "cwd": D} with its server's log file. A
    launcher whose fingerprint differs is refused ({"refused": why}); else a fork of this process
    serves it, from its working directory, and says {"server": PID}."""
    try:
        data, fds, _, _ = socket.recv_fds(conn, _MAX_PACKET, 1)
    except OSError:
        return
    try:
        hello = json.loads(data) if data else {}
        why = _why_refused(hello, fds, fingerprint)
        if why is not None:
            conn.send(json.dumps({"refused": why}).encode())
            return
        cwd = hello["cwd"]  # read before the fork: the fork runs nothing that can raise outside its own try
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            _serve_launcher(conn, listener, fds[0], cwd)
    except (OSError, ValueError):
        return
    finally:
        for fd in fds:
            os.close(fd)


def _why_refused(hello: object, fds: list[int], fingerprint: dict) -> str | None:
    """Why a hello is not served: it is not one, or its fingerprint differs from this server's."""
    if not isinstance(hello, dict) or not isinstance(hello.get("cwd"), str) or len(fds) != 1:
        return "a hello is a JSON object with a working directory (cwd), sent with one log file"
    theirs = hello.get("fingerprint")
    return how_they_differ(fingerprint, theirs) if isinstance(theirs, dict) else "it sent no fingerprint"


def _serve_launcher(conn: socket.socket, listener: socket.socket, log_fd: int, cwd: str) -> None:
    """In the fork that serves one launcher: its own session, its output on the launcher's log,
    its working directory and path as a server the launcher started would have; never return."""
    code = 1
    try:
        listener.close()
        os.setsid()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        if sys.path and sys.path[0] == os.getcwd():  # `python -m` puts its directory first
            sys.path[0] = cwd
        os.chdir(cwd)
        conn.send(json.dumps({"server": os.getpid()}).encode())
        serve(conn, warm=True)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _reap_servers() -> None:
    """Collect the exits of the forks that served launchers which have left."""
    for _ in _ended_children():
        pass


def main() -> None:
    if sys.argv[1:2] == ["--listen"] and len(sys.argv) == 3:
        listen(sys.argv[2])
        return
    rank_main.die_with_launcher()
    sock = socket.socket(fileno=int(os.environ.pop("TOPOPROF_FORK_SERVER_FD")))
    _import_torch()
    serve(sock, warm=False)


if __name__ == "__main__":
    main()
