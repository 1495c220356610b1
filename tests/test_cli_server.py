"""A command forked from the suite's command server (`tests/helpers/cli_server.py`) answers as
`python -m topoprof` started anew does: the same output, exit code, working directory and
environment; a command that outlives its timeout is killed; an environment that would start Python
otherwise runs its own interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers import cli_server
from helpers.fake_driver import driver_env

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "topo")


@pytest.fixture(scope="module")
def server():
    """A server of this module's own, named to `cli_server.run` while its tests run."""
    kept = os.environ.get(cli_server.SERVER_VAR)
    started = cli_server.CliServer()
    started.name_it()
    assert cli_server._server_modules(started.path) is not None, "the server never listened"
    yield started
    started.stop()
    if kept is not None:
        os.environ[cli_server.SERVER_VAR] = kept


def _fresh(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoprof", *args], capture_output=True, text=True, timeout=120, **kw)


def _same(forked: subprocess.CompletedProcess, fresh: subprocess.CompletedProcess) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


@pytest.mark.parametrize("args", [["--help"], ["model", "--no-such-option"], ["topo", "--from-file", "missing.txt"]])
def test_a_forked_command_prints_and_exits_as_a_new_interpreter(server, args, tmp_path):
    forked = cli_server.run(args, cwd=tmp_path, timeout=120, text=True)
    assert forked.args[:3] == [sys.executable, "-m", "topoprof"]
    _same(forked, _fresh(args, cwd=tmp_path))


def test_a_forked_command_reads_its_own_directory_environment_and_path(server, tmp_path):
    """A relative file from its working directory, a fake nvidia-smi and NVML from its PATH and
    PYTHONPATH: the fake driver's topology, as a command started with that environment reads it."""
    name = sorted(f for f in os.listdir(FIXTURE) if f.startswith("07_"))[0]
    (tmp_path / "topo.txt").write_bytes(open(os.path.join(FIXTURE, name), "rb").read())
    args = ["topo", "--from-file", "topo.txt"]
    _same(cli_server.run(args, cwd=tmp_path, timeout=120, text=True), _fresh(args, cwd=tmp_path))
    env = driver_env(tmp_path, smi_output=(tmp_path / "topo.txt").read_bytes(), nvml_scenario="h100_vm_1x")
    assert cli_server.same_start(env, cli_server._server_modules(server.path))
    forked = cli_server.run(["topo"], env=env, timeout=120, text=True)
    _same(forked, _fresh(["topo"], env=env))
    assert forked.returncode == 0 and "GPU0" in forked.stdout


def test_stderr_may_join_stdout_as_bytes(server, tmp_path):
    forked = cli_server.run(["model", "--no-such-option"], cwd=tmp_path, stderr=subprocess.STDOUT, timeout=120)
    assert forked.stderr is None and forked.returncode == 2 and b"No such option" in forked.stdout


def test_a_command_past_its_timeout_is_killed(server, tmp_path):
    env = driver_env(tmp_path, smi_script="sleep 60\n")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        cli_server.run(["topo"], env=env, timeout=2, text=True)
    assert time.monotonic() - started < 30


def test_an_environment_python_starts_otherwise_runs_its_own_interpreter(server, tmp_path):
    modules = cli_server._server_modules(server.path)
    assert not cli_server.same_start({**os.environ, "PYTHONHASHSEED": "7"}, modules)
    (tmp_path / "click").mkdir()  # another click than the one the server imported
    assert not cli_server.same_start({**os.environ, "PYTHONPATH": str(tmp_path)}, modules)
    (tmp_path / "elsewhere").mkdir()
    assert cli_server.same_start({**os.environ, "PYTHONPATH": str(tmp_path / "elsewhere")}, modules)
    proc = cli_server.run(["--version"], env={**os.environ, "PYTHONHASHSEED": "7"}, timeout=120, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("topoprof, version ")


def test_a_server_whose_test_process_was_killed_leaves():
    """A test process killed before it could stop its server leaves no server behind."""
    code = ("import os, sys, time; sys.path.insert(0, %r); from helpers.cli_server import CliServer; "
            "s = CliServer(); print(s.proc.pid, flush=True); time.sleep(600)" % os.path.dirname(__file__))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    server = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{server}") and _state(server) != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{server}") or _state(server) == "Z", "the server outlived its test process"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
