"""`topoprof validate` with FSDP2's modes on 2 gloo ranks: each mode measured with its timeline and
predicted, the inputs the FSDP timeline needs, the numerics, and the modes refused."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.cli import topoprof as _cli
from topoprof.errors import InputError, NothingMeasured
from topoprof.measure import torch_support
from topoprof.measure.torch_support import FSDP2_VALIDATE
from topoprof.model.validate.run import ALL_MODES, DDP_MODES, parse_modes

# Its tests share one module fixture of rank launches: one worker runs them all, so the launches
# run once (`--dist loadgroup` in pyproject.toml), not once on each worker that takes a test of it.
pytestmark = pytest.mark.xdist_group("validate_fsdp")

FSDP = ("fsdp_full_shard", "fsdp_full_shard_no_sync", "fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync")
NO_FSDP = torch_support.missing(FSDP2_VALIDATE)  # why this torch cannot run them, or None
needs_fsdp = pytest.mark.skipif(NO_FSDP is not None, reason=str(NO_FSDP))


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    cal = tmp_path_factory.mktemp("cal") / "calibration.json"
    proc = _cli("validate", "--backend", "gloo", "--params", "60K", "--seq-len", "16", "--micro-batch", "2",
                "--accum", "3", "--steps", "2", "--warmup-steps", "1", "--modes", ",".join(FSDP),
                "--save-calibration", str(cal), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), cal


@needs_fsdp
@pytest.mark.slow
def test_every_fsdp_mode_is_measured_and_predicted(fsdp_run):
    doc, _ = fsdp_run
    assert doc["status"] == "ok" and set(doc["modes"]) == set(FSDP)
    for mode, m in doc["modes"].items():
        assert m["measured_step_s"] > 0 and m["predicted_step_s"] > 0, mode
        measured, predicted = m["parts"]["measured"], m["parts"]["predicted"]
        assert set(measured) == set(predicted) == {"compute", "exposed_comm", "optimizer", "other"}
        assert any(sum(measured.values()) == pytest.approx(s) for s in m["per_rotation"]["measured_s"])
        assert 90.0 < m["measured_parts_cover_pct"] <= 100.0
        # gloo blocks on every collective: all of it is exposed, in the step and in the model
        assert measured["exposed_comm"] > 0 and predicted["exposed_comm"] > 0
    # from the same rotation's inputs, the no_sync twins reduce once instead of K = 3 times
    for synced, quiet in (("fsdp_full_shard", "fsdp_full_shard_no_sync"),
                          ("fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync")):
        a, b = (doc["modes"][m]["per_rotation"]["predicted_s"] for m in (quiet, synced))
        assert all(x < y for x, y in zip(a, b))


@needs_fsdp
@pytest.mark.slow
def test_each_fsdp_step_has_its_timeline_and_the_inputs_it_needs(fsdp_run):
    doc, _ = fsdp_run
    rotation = doc["rotations"]["rotations"][0]
    step = rotation[0]["modes"]["fsdp_full_shard"]
    assert len(step["micro"]) == 3
    kinds = [c[0] for c in step["micro"][0]["collectives"]]
    # the synthetic model's blocks and its root: every group all-gathered in forward, the blocks
    # again in backward, every group reduce-scattered
    groups = kinds.count("reduce_scatter")
    assert kinds.count("all_gather") == 2 * groups - 1 and kinds[0] == "all_gather" and kinds[-1] == "reduce_scatter"
    for mb in step["micro"]:
        for _, _, start, end in mb["collectives"]:
            assert mb["forward"][0] <= start <= end <= mb["backward"][1]
    quiet = rotation[0]["modes"]["fsdp_full_shard_no_sync"]["micro"]
    assert [sum(c[0] == "reduce_scatter" for c in mb["collectives"]) for mb in quiet] == [0, 0, groups]
    zero2 = rotation[0]["modes"]["fsdp_shard_grad_op"]["micro"][0]["collectives"]
    assert sum(c[0] == "all_gather" for c in zero2) == groups  # no all-gather again in backward
    cal = doc["calibration"]
    for name in ("fsdp_forward_overhead_s", "fsdp_backward_overhead_s", "fsdp_optimizer_time_s"):
        assert cal[name] >= 0, name
    spread = cal["spread"]
    assert any(k.startswith("fsdp_all_gather_at_") for k in spread)
    assert any(k.startswith("fsdp_reduce_scatter_at_") for k in spread)


@needs_fsdp
@pytest.mark.slow
def test_fsdp_numerics_equal_one_process_accumulating(fsdp_run):
    doc, _ = fsdp_run
    num = doc["numerics"]
    for mode in FSDP:
        assert num[mode]["allclose"] and num[mode]["max_abs_diff_vs_single"] < 1e-9, mode
    assert not num["control_single_not_divided_by_k"]["allclose"]


@needs_fsdp
@pytest.mark.slow
def test_fsdp_calibration_feeds_model(fsdp_run):
    _, cal = fsdp_run
    saved = json.loads(cal.read_text())["calibration"]
    assert saved["fsdp_forward_overhead_s"] >= 0
    proc = _cli("model", "--params", "60K", "--calibration", str(cal), "--link-bandwidth", "1",
                "--world-size", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "calibration" in doc["inputs"]["fsdp_forward_overhead_s"]["source"]
    assert doc["strategies"]["fsdp_full_shard"]["step_time_s"] > 0


def test_modes_all_and_what_is_refused():
    assert parse_modes("all") == ALL_MODES and set(DDP_MODES) | set(FSDP) == set(ALL_MODES)
    assert parse_modes("ddp_synced, all") == ALL_MODES
    proc = _cli("validate", "--modes", "hsdp", "--backend", "gloo")
    assert proc.returncode == 2 and "--modes hsdp" in proc.stderr and "across nodes" in proc.stderr
    proc = _cli("validate", "--modes", "fsdp_nonsense", "--backend", "gloo")
    assert proc.returncode == 2 and "--modes fsdp_nonsense" in proc.stderr
    from topoprof.model.validate.run import ValidateOptions
    from topoprof.workload.synthetic import spec_for_params

    with pytest.raises(InputError, match="--modes fsdp_full_shard"):
        ValidateOptions(backend="gloo", nproc=2, spec=spec_for_params(60_000), label="x", modes=("fsdp_full_shard",),
                        user_model="tests/fixtures/user_models/tied.py:build_1m")


def test_gloo_reduce_scatter_is_an_all_reduce_inside(tmp_path):
    """The fact the stand-in's model prices: gloo runs a reduce-scatter as one all-reduce of the
    whole buffer (ProcessGroupGloo.cpp reduce_scatter_tensor_coalesced), seen by the profiler."""
    code = """
import os, torch, torch.distributed as dist
from torch.profiler import profile
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=int(os.environ["RANK"]),
                        world_size=2)
out, inp = torch.zeros(2), torch.arange(4, dtype=torch.float32)
with profile() as p:
    dist.reduce_scatter_tensor(out, inp)
names = {e.name for e in p.events()}
print("gloo:all_reduce" in names, "gloo:reduce_scatter" in names)
dist.destroy_process_group()
"""
    import os

    # a file store and the loopback: no port for another test to take between choosing and binding it
    env = {**os.environ, "STORE": str(tmp_path / "store"), "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:  # a rank that hangs is not left behind
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    assert outs[0][0].split()[-2:] == ["True", "False"]


def test_fsdp_is_validated_on_gloo_only():
    from topoprof.model.validate.run import ValidateOptions
    from topoprof.workload.synthetic import spec_for_params

    with pytest.raises(InputError, match="--modes fsdp_full_shard: FSDP is validated on CPU ranks"):
        ValidateOptions(backend="nccl", nproc=2, spec=spec_for_params(60_000), label="x", modes=("fsdp_full_shard",))
    assert ValidateOptions(backend="nccl", nproc=2, spec=spec_for_params(60_000), label="x").modes == DDP_MODES
    assert parse_modes("all", "nccl") == DDP_MODES and parse_modes("all", "gloo") == ALL_MODES


def test_the_floor_is_pyprojects():
    import re
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=(\d+\.\d+)"', pyproject).group(1)
    assert torch_support.parse_version(floor) == torch_support.TORCH_FLOOR


def test_which_torch_runs_fsdps_modes():
    assert torch_support.missing(FSDP2_VALIDATE, "2.9.0") is None
    assert torch_support.missing(FSDP2_VALIDATE, "2.10.0+cu126") is None      # 10 > 9, not "1" < "9"
    assert torch_support.missing(FSDP2_VALIDATE, "2.9.0.dev20250601+cpu") is None
    why = torch_support.missing(FSDP2_VALIDATE, "2.8.0+cu128")
    assert why.startswith("validate's FSDP2 modes need torch >= 2.9 (") and why.endswith("; this is torch 2.8.0+cu128")
    assert "set_custom_all_gather" in why


def test_fsdp_modes_on_a_torch_too_old_are_refused_and_all_leaves_them_out():
    why = torch_support.missing(FSDP2_VALIDATE, "2.5.1")
    assert parse_modes("all", "gloo", why) == DDP_MODES
    assert parse_modes("ddp_synced", "gloo", why) == ("ddp_synced",)
    with pytest.raises(NothingMeasured, match=r"^--modes fsdp_full_shard,fsdp_shard_grad_op: validate's FSDP2 "
                                              r"modes need torch >= 2\.9 .*; this is torch 2\.5\.1$"):
        parse_modes("ddp_synced,fsdp_full_shard,fsdp_shard_grad_op", "gloo", why)


def test_the_command_says_so_in_one_line_on_a_torch_too_old(monkeypatch):
    """As `topoprof validate` answers with torch 2.5 installed (its version read from the package
    metadata, replaced here): one line, exit 1, before any rank starts."""
    from click.testing import CliRunner

    from topoprof.cli import main

    monkeypatch.setattr(torch_support, "torch_version_text", lambda: "2.5.1")
    refused = CliRunner().invoke(main, ["validate", "--backend", "gloo", "--modes", "fsdp_full_shard"])
    assert refused.exit_code == 1
    lines = refused.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("topoprof: error: --modes fsdp_full_shard: validate's FSDP2")
    assert "this is torch 2.5.1" in lines[0]
    # `all` goes on without them and says so (here it stops next, at a --params it cannot read)
    noted = CliRunner().invoke(main, ["validate", "--backend", "gloo", "--modes", "all", "--params", "lots"])
    assert "topoprof: note: --modes all runs the DDP modes only: validate's FSDP2 modes need torch >= 2.9" \
        in noted.output


@pytest.mark.skipif(NO_FSDP is None, reason="this torch runs FSDP's modes")
def test_this_torch_is_too_old_for_fsdp_and_the_command_says_so():
    proc = _cli("validate", "--backend", "gloo", "--modes", "fsdp_full_shard")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"topoprof: error: --modes fsdp_full_shard: {NO_FSDP}"
