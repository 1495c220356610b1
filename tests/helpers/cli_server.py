"""`python -m topoprof ARGS` for the suite's commands, forked from one process that has imported
the command line already.

Each command a test runs would otherwise be a new interpreter importing click and every command's
modules: 0.7 s of a core before its first line of work, for each of the suite's few hundred
commands. A command forked from this server is still a process of its own, with its own arguments,
environment, working directory, standard streams, exit code and process id; what it has not done is
import those modules itself. So a test that looks at what a command imports, or at how it starts,
runs its own interpreter, and so does a command whose environment changes how Python starts
(`same_start`): those fall back to `subprocess.run`.

The server (`python cli_server.py SOCKET PARENT_PID`; it leaves when that test process is gone)
forks, for each request on its unix socket, a watcher that forks the command and reports its
process id and, once it ends, its wait status: the server itself never waits on a child, and no
thread runs in it when it forks. The client side is `run`, which answers as `subprocess.run`
would, with the same captured text.
"""
from __future__ import annotations

import functools
import importlib.machinery
import json
import locale
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SERVER_VAR = "TOPOPROF_TEST_CLI_SERVER"
_MAX_REQUEST = 1 << 20
# how often a server waiting for a command checks that its test process is still there
_PARENT_CHECK_S = 2.0
# how long a first command waits for the server to import the command line (a second, unloaded)
_START_S = 60
# variables Python or the locale read as an interpreter starts, not as a command runs
_READ_AT_START = ("PYTHON", "LANG", "LC_")


def same_start(env: dict, server_modules: dict[str, str]) -> bool:
    """Whether a command started with `env` would start as one forked from the server: the same
    variables that Python reads as it starts, but for PYTHONPATH, whose folders the fork puts on
    its path as Python would, so long as none of them holds another copy of a module the server
    has imported (`server_modules`: each top-level name -> where it was found)."""
    def read(e):
        return {k: v for k, v in e.items() if k.startswith(_READ_AT_START) and k != "PYTHONPATH"}
    if read(env) != read(os.environ):
        return False
    for folder in _python_path(env):
        for entry in os.listdir(folder) if os.path.isdir(folder) else ():
            name = _module_name(folder, entry)
            if name in server_modules and os.path.realpath(os.path.join(folder, entry)) != server_modules[name]:
                return False
    return True


def _module_name(folder: str, entry: str) -> str | None:
    """The top-level module an entry of a folder on the path would be imported as, if any."""
    if os.path.isdir(os.path.join(folder, entry)):
        return entry if entry.isidentifier() else None
    suffix = next((s for s in importlib.machinery.all_suffixes() if entry.endswith(s)), None)
    return entry.split(".", 1)[0] if suffix else None


def _python_path(env: dict) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


class CliServer:
    """The server, started now, and the folder of its socket."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="topoprof-cli-server-")
        self.path = os.path.join(self.folder, "socket")
        with open(os.path.join(self.folder, "log"), "wb") as log:
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path, str(os.getpid())],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def name_it(self) -> None:
        """Name it to this process's `run`."""
        os.environ[SERVER_VAR] = self.path

    def stop(self) -> None:
        os.environ.pop(SERVER_VAR, None)
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def run(args: list[str], *, env: dict | None = None, cwd: str | os.PathLike | None = None, timeout: float | None = None,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, "-m", "topoprof", *args], ...)` with its output captured
    (`stderr` PIPE or STDOUT), forked from the server named in SERVER_VAR where one listens and
    `env` starts Python as this process was started; otherwise run as that."""
    env = dict(os.environ if env is None else env)
    path = os.environ.get(SERVER_VAR)
    argv = [sys.executable, "-m", "topoprof", *args]
    modules = None if path is None else _server_modules(path)
    if modules is None or stdout is not subprocess.PIPE or not same_start(env, modules):
        return subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, stdout=stdout, stderr=stderr, text=text)
    request = {"args": list(args), "env": env, "cwd": os.fspath(cwd) if cwd is not None else os.getcwd()}
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe() if stderr is subprocess.PIPE else (None, out_w)
    null = os.open(os.devnull, os.O_RDONLY)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], [null, out_w, err_w])
    finally:
        for fd in {null, out_w, err_w}:
            os.close(fd)
    with conn:
        reports = conn.makefile("r")
        pid = int(reports.readline())
        captured = _read_until_closed([out_r] + ([err_r] if err_r is not None else []), pid, argv, timeout)
        status = reports.readline()
    if not status:
        raise RuntimeError(f"the test command server lost command {pid}: {' '.join(args)}")
    code = os.waitstatus_to_exitcode(int(status))
    out, err = (_as_text(b) if text else b for b in (captured[0], captured[1] if err_r is not None else None))
    return subprocess.CompletedProcess(argv, code, out, err)


@functools.cache
def _server_modules(path: str) -> dict[str, str] | None:
    """What the server imported (`_imported`), written beside its socket before it listens; None
    where it never listened (its log says why), and every command then runs as its own."""
    deadline = time.monotonic() + _START_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    with open(path + ".modules") as f:
        return json.load(f)


def _read_until_closed(fds: list[int], pid: int, argv: list[str], timeout: float | None) -> list[bytes]:
    """What the command (and whatever it left holding its streams, as `subprocess.run` waits for)
    wrote to each pipe, until every one is closed; past `timeout` the command is killed and this
    raises `subprocess.TimeoutExpired`, as `subprocess.run` does."""
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    with selectors.DefaultSelector() as sel:
        for fd in fds:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    raise subprocess.TimeoutExpired(argv, timeout or 0, b"".join(chunks[fds[0]]))
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        sel.unregister(key.fd)
        finally:
            for fd in fds:
                os.close(fd)
    return [b"".join(chunks[fd]) for fd in fds]


def _as_text(data: bytes | None) -> str | None:
    """As `subprocess.run(text=True)` decodes it: the locale's encoding, universal newlines."""
    if data is None:
        return None
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


# ---- the server -------------------------------------------------------------------------------


def serve(path: str, parent: int) -> int:
    """Answer requests until killed, or until `parent` (its test process) is gone; in a command's
    process, return its exit code instead."""
    import topoprof.cli  # noqa: F401 - what every command imports first, imported once here

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its watchers are reaped as they end
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".partial")
    listener.listen(64)
    base_path = [p for p in sys.path[1:] if p not in _python_path(dict(os.environ))]
    with open(path + ".modules", "w") as f:
        json.dump(_imported(), f)
    os.rename(path + ".partial", path)
    listener.settimeout(_PARENT_CHECK_S)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if os.getppid() != parent:  # its test process is gone, killed before it could stop it
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                return 0
            continue
        conn.setblocking(True)
        data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
        if os.fork() == 0:
            listener.close()
            return _watch(conn, json.loads(data), fds, base_path)
        conn.close()
        for fd in fds:
            os.close(fd)


def _imported() -> dict[str, str]:
    """Each top-level module imported here that was found in a folder -> the file or package
    folder it was found as."""
    found = {}
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if "." in name or not origin or not os.path.isabs(origin):
            continue
        found[name] = os.path.realpath(os.path.dirname(origin) if origin.endswith("__init__.py") else origin)
    return found


def _watch(conn: socket.socket, request: dict, fds: list[int], base_path: list[str]) -> int:
    """The watcher: fork the command, say its id, then its wait status once it ends."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        return _command(conn, request, fds, base_path)
    for fd in fds:
        os.close(fd)
    _told(conn, pid)
    _, status = os.waitpid(pid, 0)
    _told(conn, status)
    os._exit(0)


def _told(conn: socket.socket, value: int) -> bool:
    """Send a line to the client, which may have gone (a command past its timeout)."""
    try:
        conn.sendall(f"{value}\n".encode())
        return True
    except OSError:
        return False


def _command(conn: socket.socket, request: dict, fds: list[int], base_path: list[str]) -> int:
    """The command's process: its streams, directory, environment, module path and arguments as
    asked, then `python -m topoprof`'s run."""
    import runpy

    conn.close()
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # as `python -m` starts: the working directory first (a user's `--model file.py:fn` is found
    # there), then PYTHONPATH's folders, then the interpreter's own
    sys.path[:] = [request["cwd"], *_python_path(request["env"]), *base_path]
    sys.argv = ["topoprof", *request["args"]]
    try:
        runpy.run_module("topoprof", run_name="__main__", alter_sys=True)
    except SystemExit as end:
        return _exit_code(end.code)
    return 0


def _exit_code(code) -> int:
    """What the interpreter exits with for `sys.exit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], int(sys.argv[2])))
