import os
import sys

# tests/ holds shared helpers (fake_nvml, helpers.netns) imported by bare name.
sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first: started last, one of them would leave the other workers
    idle while it ends the run. Otherwise the collected order is kept (every worker collects the
    same order, as pytest-xdist requires)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
