import os
import sys

# tests/ holds shared helpers (fake_nvml, helpers.netns) imported by bare name.
sys.path.insert(0, os.path.dirname(__file__))

# pytest-xdist runs one worker per core: torch in each (and in the commands and ranks they start)
# takes one thread, as torchrun's OMP_NUM_THREADS=1 default for several processes on one machine
# does (torch/distributed/run.py). A thread per core in every process oversubscribes the cores,
# and OpenMP's idle threads spin on them. Set before any test imports torch; a value given is kept.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first: started last, one of them would leave the other workers
    idle while it ends the run. Otherwise the collected order is kept (every worker collects the
    same order, as pytest-xdist requires)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
