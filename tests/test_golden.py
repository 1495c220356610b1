"""What a user sees does not move unless a change means it to: the outputs of a fixed set of
commands (`tests/golden/outputs.py`) against the files kept beside it. After a change that is
meant to alter them, `python tests/golden/outputs.py --write` writes them anew, and the diff of
those files is what the change shows a user."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers.ci_torch import other_torch_than_ci


def _outputs_module():
    path = Path(__file__).parent / "golden" / "outputs.py"
    spec = importlib.util.spec_from_file_location("golden_outputs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_kept_output_has_its_command():
    golden = _outputs_module()
    kept = {p.stem for p in golden.HERE.glob("*.txt")}
    assert kept == golden.names(), f"kept outputs without a command, or commands without one: {kept ^ golden.names()}"


@pytest.mark.skipif(other_torch_than_ci() is not None, reason=str(other_torch_than_ci()))
@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(_outputs_module().groups()))
def test_every_kept_output_is_what_the_commands_print_now(group):
    golden = _outputs_module()
    found = golden.groups()[group]()
    assert set(found) <= golden.names()
    drifts = golden.drifts(found)
    assert not drifts, "\n".join(drifts)


def test_the_normalisation_hides_only_what_changes_from_run_to_run():
    golden = _outputs_module()
    text = '{"created_utc": "2026-11-26T01:59:16Z", "host": "vm", "tool": {"name": "topoprof", "version": "0.1.0"}}'
    assert golden.normalized(text) == ('{"created_utc": "<time>", "host": "<host>", "tool": {"name": "topoprof", '
                                       '"version": "<version>"}}')
    assert golden.normalized('"step_time_s": 0.0675') == '"step_time_s": 0.0675'
