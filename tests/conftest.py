import os
import sys
import tempfile

import pytest

# Each command a test runs, and each fork server it starts, is a Python process that imports the
# project anew; each pytest-xdist worker rewrites every test module's asserts as it collects them.
# Where bytecode is not written (PYTHONDONTWRITEBYTECODE, as on this project's CI machines) every
# one of them compiles all it imports from source: a command's start took 0.75 s instead of 0.52,
# a worker's collection 14.7 s instead of 5.6. Written once into a cache folder outside the source
# tree (PYTHONPYCACHEPREFIX), the bytecode is read by every later process of the suite.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None or sys.dont_write_bytecode:
    sys.dont_write_bytecode = False
    os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "topoprof-tests-pycache"))
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]

# tests/ holds shared helpers (fake_nvml, helpers.netns) imported by bare name.
sys.path.insert(0, os.path.dirname(__file__))

from helpers.cli import ModelRuns  # noqa: E402 - found through the path set above
from helpers.cli_server import CliServer  # noqa: E402 - found through the path set above
from helpers.shared_fork_server import SharedForkServer  # noqa: E402 - found through the path set above

# pytest-xdist runs one worker per core: torch in each (and in the commands and ranks they start)
# takes one thread, as torchrun's OMP_NUM_THREADS=1 default for several processes on one machine
# does (torch/distributed/run.py). A thread per core in every process oversubscribes the cores,
# and OpenMP's idle threads spin on them. Set before any test imports torch; a value given is kept.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_sessionstart(session):
    """A process that runs tests starts the fork server its commands share (`SharedForkServer`)
    and the server its commands are forked from (`CliServer`), once the environment above is set;
    pytest-xdist's controller runs none."""
    if hasattr(session.config, "workerinput") or not session.config.getoption("numprocesses", None):
        session.config.shared_fork_server = SharedForkServer()
        session.config.shared_fork_server.name_it()
        session.config.cli_server = CliServer()
        session.config.cli_server.name_it()


def pytest_sessionfinish(session):
    for name in ("cli_server", "shared_fork_server"):
        server = getattr(session.config, name, None)
        if server is not None:
            server.stop()


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first: started last, one of them would leave the other workers
    idle while it ends the run. Otherwise the collected order is kept (every worker collects the
    same order, as pytest-xdist requires)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def model_runs(tmp_path_factory, worker_id) -> ModelRuns:
    """`topoprof model ARGS --json`, once per session for each command that times nothing here
    (`tests/helpers/cli.py:ModelRuns`): shared by the workers in the session's temporary folder,
    kept in this process alone without pytest-xdist (the folder above would outlive the session)."""
    if worker_id == "master":
        return ModelRuns(None)
    folder = tmp_path_factory.getbasetemp().parent / "model-runs"
    folder.mkdir(exist_ok=True)
    return ModelRuns(folder)
