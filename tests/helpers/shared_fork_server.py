"""One shared fork server for a test process and every command it runs
(`topoprof.probes.ranks.fork_server --listen`).

Each command a test runs would otherwise start its own fork server, a new interpreter that
imports torch, and torch._dynamo once a training rank has run: seconds of a core each, for each of
the suite's commands, and its first ranks wait for the first of them. Started once, the shared
server is named in TOPOPROF_FORK_SERVER to every command the test process starts, which inherit
it. A test that changes what torch reads when imported, or a job's own environment, gets a server
of its own as before (`topoprof.specs.fork_protocol`), and so does a test that removes the name.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from topoprof.specs.fork_protocol import SHARED_SERVER_VAR, server_env


class SharedForkServer:
    """The server, started now (it listens once torch is imported), and the folder of its socket."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="topoprof-fork-server-")
        self.path = os.path.join(self.folder, "socket")
        env = dict(server_env(dict(os.environ)), TOPOPROF_LAUNCHER_PID=str(os.getpid()))
        with open(os.path.join(self.folder, "log"), "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "topoprof.probes.ranks.fork_server", "--listen",
                                          self.path], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def name_it(self) -> None:
        """Name it to this process and every process it starts from now on."""
        os.environ[SHARED_SERVER_VAR] = self.path

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until it listens (it has imported torch and torch._dynamo)."""
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.folder, "log"), errors="replace") as log:
                    raise RuntimeError(f"the shared fork server did not start listening: {log.read()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        os.environ.pop(SHARED_SERVER_VAR, None)
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def own_fork_server(env: dict) -> dict:
    """`env` for a command that starts its own fork server, as a user's command does: where a test
    looks at the server's process tree, or at what its command shows while its ranks import torch."""
    return {k: v for k, v in env.items() if k != SHARED_SERVER_VAR}
