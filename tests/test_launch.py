"""The launcher: clean runs, dead, failing and hung ranks, and no orphan processes."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from types import SimpleNamespace

import pytest

from topoprof.measure.launch import JobSpec, as_message, external_job, launch_local
from topoprof.probes.ranks.rank_main import GOING_ON_EVERY_S, RankContext
from topoprof.specs.fork_protocol import SHARED_SERVER_VAR
from topoprof.specs.messages import Progress, SleepJob, SleepStep, decode


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes, but reaped children disappear entirely.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _steps(result) -> list[SleepStep]:
    return [m for m in (as_message(wire, SleepStep) for _, wire in result.messages) if isinstance(m, SleepStep)]


def test_clean_run_delivers_every_rank_message():
    result = launch_local(JobSpec("sleep", SleepJob(steps=3, sleep_s=0.01), 3, "gloo", timeout_s=30))
    assert result.failure is None
    assert sorted((m.rank, m.step) for m in _steps(result)) == [(r, s) for r in range(3) for s in range(3)]
    assert not any(_alive(m.pid) for m in _steps(result))


def test_killed_rank_ends_run_naming_it_and_keeps_earlier_rows():
    pids = {}

    def on_message(rank, wire):
        msg = as_message(wire, SleepStep)
        if isinstance(msg, SleepStep):
            pids[rank] = msg.pid
            if rank == 1 and msg.step == 1:
                os.kill(msg.pid, signal.SIGKILL)

    start = time.monotonic()
    result = launch_local(JobSpec("sleep", SleepJob(steps=50, sleep_s=0.05), 2, "gloo", timeout_s=30), on_message)
    assert result.failure is not None and result.failure.rank == 1
    assert "SIGKILL" in result.failure.describe()
    assert len(_steps(result)) >= 3          # rows from before the kill were kept
    assert time.monotonic() - start < 20    # ended on the death, not on the timeout
    assert not any(_alive(p) for p in pids.values())


def test_ranks_run_the_same_code_as_the_launcher():
    # Not another installed copy of the package: the ranks import probes/ from where this one is.
    import topoprof.probes.ranks.rank_main

    result = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30))
    assert result.failure is None
    assert ({m.probes for m in _steps(result)}
            == {os.path.abspath(topoprof.probes.ranks.rank_main.__file__)})


def test_rank_that_raises_is_named_with_its_error():
    result = launch_local(JobSpec("sleep", SleepJob(steps=3, fail_rank=1, how="raise"), 2, "gloo", timeout_s=30))
    assert result.failure.rank == 1
    assert "injected failure" in result.failure.describe()
    assert result.failure.last_step == "step 1"


def test_a_clean_run_leaves_no_log_folder_and_a_failed_one_names_its_log():
    clean = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30))
    assert clean.failure is None and not os.path.exists(clean.log_dir)
    failed = launch_local(JobSpec("sleep", SleepJob(steps=3, fail_rank=1, how="raise"), 2, "gloo", timeout_s=30))
    try:
        log = failed.failure.log_path
        assert log.endswith("rank1.log") and os.path.isfile(log)
        assert failed.failure.describe().endswith(f"(whole log: {log})")
    finally:
        shutil.rmtree(failed.log_dir)


def test_the_ranks_output_outlives_its_folder_when_nccl_was_asked_to_log():
    run = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30,
                               env={"NCCL_DEBUG": "INFO"}))
    assert run.failure is None and not os.path.exists(run.log_dir)
    assert sorted(run.rank_logs) == [os.path.join(run.log_dir, f"rank{r}.log") for r in range(2)]


def test_a_folder_the_user_named_is_kept(tmp_path):
    run = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 1, "gloo", timeout_s=30,
                               log_dir=str(tmp_path / "logs")))
    assert run.failure is None and os.path.isfile(tmp_path / "logs" / "rank0.log")


def test_stopped_rank_is_detected_as_hung_within_the_timeout():
    stopped = []

    def on_message(rank, wire):
        msg = as_message(wire, SleepStep)
        if isinstance(msg, SleepStep) and rank == 0 and not stopped:
            os.kill(msg.pid, signal.SIGSTOP)
            stopped.append(msg.pid)

    start = time.monotonic()
    result = launch_local(JobSpec("sleep", SleepJob(steps=50, sleep_s=0.05), 2, "gloo", timeout_s=3), on_message)
    elapsed = time.monotonic() - start
    assert result.failure is not None and result.failure.rank == 0
    assert "hung" in result.failure.reason and "stopped" in result.failure.reason
    assert elapsed < 15
    assert not _alive(stopped[0])


def test_a_rank_that_goes_on_says_so_within_its_timeout_and_no_more_often():
    now = [0.0]
    sent: list = []
    env = SimpleNamespace(rank=0, world_size=1, device="cpu")
    ctx = RankContext(env, sent.append, timeout_s=300.0, clock=lambda: now[0])
    ctx.progress("rotation 1/2")
    for _ in range(3):          # micro-batches begun within the interval: a clock read each, no message
        now[0] += 1.0
        ctx.going_on("micro-batch")
    assert [decode(m) for m in sent] == [Progress("rotation 1/2")]
    now[0] = GOING_ON_EVERY_S
    ctx.going_on("micro-batch")
    assert decode(sent[-1]) == Progress("rotation 1/2: micro-batch 4")
    ctx.progress("rotation 2/2")  # a step reported anew counts its units afresh
    now[0] += GOING_ON_EVERY_S
    ctx.going_on("micro-batch")
    assert decode(sent[-1]) == Progress("rotation 2/2: micro-batch 1")
    short = RankContext(env, sent.append, timeout_s=2.0, clock=lambda: now[0])
    now[0] += 0.5                 # a quarter of a short timeout is the longest it stays silent
    short.going_on("micro-batch")
    assert decode(sent[-1]) == Progress("micro-batch 1")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def own_servers(monkeypatch):
    """This process starts fork servers of its own: no shared one is named, and none is kept
    from before."""
    from topoprof.measure import forks

    monkeypatch.delenv(SHARED_SERVER_VAR, raising=False)
    monkeypatch.setattr(forks, "_SERVERS", {})
    yield
    for server in forks._SERVERS.values():
        server.close()


@pytest.fixture
def shared_server(request, monkeypatch):
    """The session's shared fork server, listening, and named to this process, which has no
    server from before."""
    from topoprof.measure import forks

    server = request.config.shared_fork_server
    server.wait_ready()
    monkeypatch.setenv(SHARED_SERVER_VAR, server.path)
    monkeypatch.setattr(forks, "_SERVERS", {})
    yield server
    for own in forks._SERVERS.values():
        own.close()


@pytest.fixture(params=["own", "shared"])
def either_server(request):
    """Each test that uses it runs twice: with a fork server of this process's own, and with a
    fork of the shared one."""
    return request.getfixturevalue("shared_server" if request.param == "shared" else "own_servers")


def test_ranks_are_forked_from_a_server_started_with_no_python_before_exec(monkeypatch, own_servers):
    """No preexec_fn (unsafe with threads and a CUDA context in the launcher, and it forces fork
    over vfork/posix_spawn): the fork server is started in a session of its own by
    start_new_session, and each rank forked from it leads its own session and process group,
    which the launcher kills whole. A second launch forks from the same server."""
    from topoprof.measure import forks, launch

    popen_kwargs = []
    real_popen = subprocess.Popen

    def spy(*args, **kwargs):
        popen_kwargs.append(kwargs)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(launch.forks.subprocess, "Popen", spy)
    seen = {}

    def on_message(rank, wire):
        msg = as_message(wire, SleepStep)
        if isinstance(msg, SleepStep):
            seen[msg.pid] = (msg.session, msg.group, msg.parent)

    for _ in range(2):
        run = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30), on_message)
        assert run.failure is None
    (server,) = forks._SERVERS.values()
    assert len(popen_kwargs) == 1
    assert popen_kwargs[0].get("preexec_fn") is None and popen_kwargs[0].get("start_new_session") is True
    assert len(seen) == 4 and all(sid == pgid == pid for pid, (sid, pgid, _) in seen.items())
    assert {parent for _, _, parent in seen.values()} == {server.pid} and server.proc is not None
    assert os.getsid(0) not in {sid for sid, _, _ in seen.values()}


def test_a_shared_server_serves_each_launcher_by_a_fork_of_its_own_where_its_imports_are_the_same(
        shared_server, monkeypatch, tmp_path):
    """Both launches of one launcher fork their ranks from one fork of the shared server, which runs
    them from the launcher's working directory; a launcher whose environment torch reads on import
    differs, or a job with an environment of its own, gets a server of its own."""
    from topoprof.measure import forks

    parents = {}

    def on_message(rank, wire):
        msg = as_message(wire, SleepStep)
        if isinstance(msg, SleepStep):
            parents[msg.pid] = msg.parent
            assert msg.cwd == str(tmp_path)

    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        run = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30), on_message)
        assert run.failure is None
    (server,) = forks._SERVERS.values()
    assert server.proc is None and _parent(server.pid) == shared_server.proc.pid
    assert len(parents) == 4 and set(parents.values()) == {server.pid}

    own = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 1, "gloo", timeout_s=30, env={"X": "1"}))
    assert own.failure is None and [s.proc is None for s in forks._SERVERS.values()] == [True, False]
    assert forks.ForkServer.join(shared_server.path, dict(os.environ, OMP_NUM_THREADS="3")) is None
    assert forks.ForkServer.join(shared_server.path + ".absent", dict(os.environ)) is None
    for hello in (b"[]", b'{"fingerprint": {}}', b'{"cwd": "/", "fingerprint": 1}'):   # refused, the server kept
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw, tempfile.TemporaryFile() as log:
            raw.connect(shared_server.path)
            socket.send_fds(raw, [hello], [log.fileno()])
            assert "refused" in json.loads(raw.recv(1 << 16))
    again = forks.ForkServer.join(shared_server.path, dict(os.environ))
    assert again is not None and _parent(again.pid) == shared_server.proc.pid
    again.close()
    cpus = os.sched_getaffinity(0)
    if len(cpus) > 1:   # confined to fewer CPUs, as a SLURM job may be: its ranks would not be
        os.sched_setaffinity(0, {min(cpus)})
        try:
            assert forks.ForkServer.join(shared_server.path, dict(os.environ)) is None
        finally:
            os.sched_setaffinity(0, cpus)


def test_fingerprints_that_differ_say_where():
    from topoprof.specs.fork_protocol import how_they_differ, import_fingerprint, server_env

    ours = import_fingerprint(server_env({"PYTHONPATH": "/a::/a", "OMP_NUM_THREADS": "1", "HOME": "/x"}))
    assert how_they_differ(ours, import_fingerprint(server_env({"PYTHONPATH": "/a", "OMP_NUM_THREADS": "1"}))) is None
    theirs = import_fingerprint(server_env({"PYTHONPATH": "/a", "OMP_NUM_THREADS": "2"}))
    assert how_they_differ(ours, theirs) == "its OMP_NUM_THREADS is '2', not '1'"
    moved = dict(ours, process=dict(ours["process"], **{"net namespace": "net:[1]"}))
    assert how_they_differ(ours, moved).startswith("its net namespace is 'net:[1]'")


def test_a_server_whose_end_closed_before_a_fork_was_asked_has_exited_before_it_answered():
    """The launcher may ask for a rank before or after a failing server has exited: its socket's
    closed end says the same as its exit (the launch above races the two)."""
    import socket
    import tempfile

    from topoprof.measure.forks import ForkServer, ForkServerGone

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    with tempfile.TemporaryFile() as log:
        log.write(b"Fatal Python error: init_fs_encoding\nModuleNotFoundError: No module named 'encodings'\n")
        server = ForkServer(ours, log, pid=0)
        with pytest.raises(ForkServerGone, match="the fork server exited before it answered; it said: "
                                                 "ModuleNotFoundError"):
            server.fork({}, "sleep", 1, 2, timeout_s=1.0)
        assert not server.alive()


def test_a_server_that_cannot_start_fails_the_launch_saying_why_and_the_next_starts_anew(own_servers):
    from topoprof.measure import forks

    broken = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30,
                                  env={"PYTHONHOME": "/nonexistent"}))   # no Python can start
    assert broken.failure is not None and broken.failure.rank == 0
    assert "could not be started: the fork server exited before it answered (it exited with code 1)" in \
        broken.failure.describe()
    broken_servers = [s for (_, env), s in forks._SERVERS.items() if ("PYTHONHOME", "/nonexistent") in env]
    assert broken_servers and not any(s.alive() for s in broken_servers)
    again = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30))
    assert again.failure is None


def test_a_killed_server_takes_its_ranks_with_it_and_the_next_launch_starts_another(either_server):
    from topoprof.measure import forks

    pids = {}

    def on_message(rank, wire):
        msg = as_message(wire, SleepStep)
        if isinstance(msg, SleepStep):
            pids[rank] = msg.pid
            if len(pids) == 2 and not killed:
                server = next(s for s in forks._SERVERS.values() if s.pid == msg.parent)
                killed.append(server.pid)
                os.kill(server.pid, signal.SIGKILL)

    killed: list[int] = []
    result = launch_local(JobSpec("sleep", SleepJob(steps=50, sleep_s=0.05), 2, "gloo", timeout_s=30), on_message)
    assert killed and result.failure is not None and "SIGKILL" in result.failure.describe()
    assert not any(_alive(p) for p in pids.values())
    again = launch_local(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 2, "gloo", timeout_s=30))
    assert again.failure is None
    assert [s.pid for s in forks._SERVERS.values() if s.alive()] not in ([], [killed[0]])


def _server_alone(launcher_pid: int):
    """Start the fork server as a child of this process, naming `launcher_pid` as its launcher,
    with a socket whose other end is closed at once: a server that went on would import torch,
    read that the launcher has gone, and leave."""
    import topoprof

    root = os.path.dirname(os.path.dirname(os.path.abspath(topoprof.__file__)))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.close()
    env = dict(os.environ, PYTHONPATH=root, TOPOPROF_LAUNCHER_PID=str(launcher_pid),
               TOPOPROF_FORK_SERVER_FD=str(theirs.fileno()))
    with theirs:
        return subprocess.run([sys.executable, "-X", "importtime", "-m", "topoprof.probes.ranks.fork_server"],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                              pass_fds=(theirs.fileno(),))


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_a_server_whose_launcher_is_gone_leaves_at_once():
    """The launcher died before the server armed PR_SET_PDEATHSIG: its parent is no longer the pid
    it was given, and it leaves before importing torch (each rank checks its server the same way)."""
    gone = _server_alone(launcher_pid=os.getppid())   # anyone but its real parent
    assert gone.returncode == 1
    assert f"the launcher (pid {os.getppid()}) is gone" in gone.stderr and "Traceback" not in gone.stderr
    imported = _imported(gone.stderr)
    assert "json" in imported and not any(name.split(".")[0] == "torch" for name in imported)
    # its real parent named: the server goes on, imports torch, and leaves when its socket closes
    kept = _server_alone(launcher_pid=os.getpid())
    assert kept.returncode == 0, kept.stderr
    assert "is gone" not in kept.stderr and "torch" in _imported(kept.stderr)


def test_the_server_warms_dynamo_only_after_a_rank_that_uses_it():
    """A bench's server (collectives alone) leaves torch._dynamo unimported; a server that has
    forked a training, trace or timing rank imports it for the ranks after it."""
    from topoprof.probes.ranks.fork_server import WITHOUT_DYNAMO, dynamo_wanted
    from topoprof.probes.ranks.rank_main import WORKERS

    assert WITHOUT_DYNAMO < set(WORKERS)
    assert not dynamo_wanted(set()) and not dynamo_wanted({"collectives", "nodes", "sleep"})
    for worker in set(WORKERS) - WITHOUT_DYNAMO:
        assert dynamo_wanted({"collectives", worker}), worker


def test_ranks_die_with_a_killed_launcher(tmp_path, either_server):
    """Even SIGKILL of the CLI itself leaves no rank behind (each rank's PR_SET_PDEATHSIG). The
    ranks are silent when it dies, rank 1 asleep for an hour and rank 0 waiting for it in a
    barrier, so neither notices through its result pipe: only the signal ends them."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from topoprof.measure.launch import JobSpec, as_message, launch_local
        from topoprof.specs.messages import SleepJob, SleepStep
        def on_message(rank, msg):
            step = as_message(msg, SleepStep)
            if step is not None:
                print(step.pid, flush=True)
        launch_local(JobSpec("sleep", SleepJob(steps=3, sleep_s=0.0, fail_rank=1, how="hang"), 2,
                             "gloo", timeout_s=600), on_message)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pids = {int(parent.stdout.readline()) for _ in range(2)}   # step 0 of each rank
    time.sleep(1)                                               # rank 1 into its sleep
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_external_job_detection():
    assert external_job({}) is None
    job = external_job({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert (job.rank, job.world_size, job.local_rank, job.launcher, job.nodes) == (3, 8, 1, "torchrun", 2)
    # what srun set for task 5 of `srun -N2 -n16` (real SLURM 22.05 under tests/helpers/slurm.py)
    job = external_job({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5", "SLURM_NODEID": "0",
                        "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_NUM_NODES": "2",
                        "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_TASKS_PER_NODE": "8(x2)"})
    assert (job.rank, job.world_size, job.local_world_size, job.launcher, job.nodes) == (5, 16, 8, "slurm", 2)
    assert external_job({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}) is None  # one task


def test_the_batch_script_itself_is_not_a_rank():
    # sbatch's script has the job's SLURM_PROCID and SLURM_NTASKS but no step: run there without
    # srun, topoprof must work alone instead of waiting for peers that never come.
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1", "SLURM_NNODES": "2",
             "SLURM_JOB_NODELIST": "tpnode[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS_PER_NODE": "1"}
    assert external_job(batch) is None


def test_a_step_smaller_than_its_job_counts_its_own_tasks_and_nodes():
    # `srun -N1 -n2` inside a 2-node, 4-task allocation
    job = external_job({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "1", "SLURM_LOCALID": "1",
                        "SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "1",
                        "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
                        "SLURM_TASKS_PER_NODE": "2(x2)"})
    assert (job.world_size, job.local_world_size, job.nodes) == (2, 2, 1)


def test_uneven_tasks_per_node_are_read_for_this_node():
    env = {"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_STEP_ID": "0", "SLURM_NODEID": "2",
           "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"}
    assert external_job(env).local_world_size == 1


def test_nproc_below_one_is_refused():
    from topoprof.errors import InputError

    with pytest.raises(InputError):
        launch_local(JobSpec("sleep", SleepJob(), 0, "gloo", timeout_s=5))


def _one_rank_of_an_external_job(monkeypatch) -> None:
    """This process as the only rank of a torchrun job, its rendezvous on a free local port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)


def test_a_rank_under_an_external_launcher_leaves_no_nccl_log_folder(monkeypatch):
    """In a torchrun/srun rank, NCCL's log goes to a file of its own (NCCL_DEBUG_FILE), read into
    the result; afterwards neither the folder nor the variable is left, and a failure names the
    file only where NCCL wrote one (gloo writes none)."""
    from topoprof.measure.runner import run_job

    _one_rank_of_an_external_job(monkeypatch)
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    ok = run_job(JobSpec("sleep", SleepJob(steps=1, sleep_s=0.0), 1, "gloo", timeout_s=30,
                         env={"NCCL_DEBUG": "INFO"}), lambda rank, msg: None)
    assert ok.failure is None and ok.log_dir and not os.path.exists(ok.log_dir)
    assert "NCCL_DEBUG_FILE" not in os.environ
    bad = run_job(JobSpec("sleep", SleepJob(steps=3, fail_rank=0, how="raise"), 1, "gloo", timeout_s=30,
                          env={"NCCL_DEBUG": "INFO"}), lambda rank, msg: None)
    assert "injected failure" in bad.failure.describe() and "whole log" not in bad.failure.describe()
    assert not os.path.exists(bad.log_dir) and "NCCL_DEBUG_FILE" not in os.environ


def test_a_sigterm_while_a_ranks_error_is_explained_is_what_stopped_it(monkeypatch):
    """scancel stops every task: a rank that lost its stopped peer may get its own SIGTERM while it
    explains that loss (the handler raises `Stopped` there); the job was stopped, and says so."""
    from topoprof.measure import runner

    _one_rank_of_an_external_job(monkeypatch)
    explain = runner.explain_job_error

    def interrupted(err, job, timeout_s):
        if not isinstance(err, runner.Stopped):
            os.kill(os.getpid(), signal.SIGTERM)   # delivered before the next bytecode: Stopped here
        return explain(err, job, timeout_s)

    monkeypatch.setattr(runner, "explain_job_error", interrupted)
    before = signal.getsignal(signal.SIGTERM)
    run = runner.run_job(JobSpec("sleep", SleepJob(steps=3, fail_rank=0, how="raise"), 1, "gloo", timeout_s=30),
                         lambda rank, msg: None)
    assert run.failure is not None and "was stopped by SIGTERM" in run.failure.describe()
    assert signal.getsignal(signal.SIGTERM) == before   # the rank's handler is the process's again


def test_two_exits_seen_at_once_blame_the_rank_that_did_not_lose_a_peer(tmp_path):
    """Rank 1 killed, rank 0 failing on the lost connection a moment later, and both exits first
    seen in the same check: the rank whose log says it lost a peer is not the one blamed."""
    from types import SimpleNamespace

    from topoprof.measure.launch import _check, _Rank

    logs = {0: "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:7067: Connection reset by "
               "peer. This is typically caused by a remote worker hanging\n", 1: ""}
    ranks = []
    for rank, code in ((0, 1), (1, -signal.SIGKILL)):
        log = tmp_path / f"rank{rank}.log"
        log.write_text(logs[rank])
        proc = SimpleNamespace(pid=0, returncode=code, poll=lambda code=code: code)
        ranks.append(_Rank(rank, proc, None, str(log), eof=True, started=True))  # type: ignore[arg-type]
    failure = _check(ranks, 60.0, 60.0)
    assert failure is not None and failure.rank == 1 and failure.reason == "was killed by SIGKILL"


def test_a_rank_whose_pipe_closed_is_waited_for_before_its_lost_peer_is_blamed(tmp_path):
    """The kernel closes a killed rank's pipe before its exit can be reaped: while the only
    failure seen is a peer's that lost it, the watch waits for that exit, then blames it."""
    import time
    from types import SimpleNamespace

    from topoprof.measure.launch import EXIT_GRACE_S, _check, _Rank

    exit_codes = {0: 1, 1: None}  # rank 1 killed, not yet reaped
    ranks = []
    for rank, text in ((0, "RuntimeError: Connection reset by peer\n"), (1, "")):
        log = tmp_path / f"rank{rank}.log"
        log.write_text(text)
        proc = SimpleNamespace(pid=0, poll=lambda rank=rank: exit_codes[rank])
        ranks.append(_Rank(rank, proc, None, str(log), eof=True, started=True))  # type: ignore[arg-type]
    ranks[0].proc.returncode = 1
    assert _check(ranks, 60.0, 60.0) is None  # rank 1 is still being torn down
    exit_codes[1] = ranks[1].proc.returncode = -signal.SIGKILL
    failure = _check(ranks, 60.0, 60.0)
    assert failure is not None and failure.rank == 1 and failure.reason == "was killed by SIGKILL"
    # a rank that never comes to be seen exiting: after the grace, the peer's failure is what there is
    exit_codes[1], ranks[1].proc.returncode, ranks[1].exit_seen_t = None, None, None
    ranks[0].exit_seen_t = time.monotonic() - EXIT_GRACE_S - 1
    failure = _check(ranks, 60.0, 60.0)
    assert failure is not None and failure.rank == 0
