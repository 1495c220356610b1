"""NVLink generation pinned by --gpu on a saved topology (fixture 01 is a DGX-1 with V100s: a
hybrid cube-mesh of NV1 and NV2 pairs, 6 NVLinks per GPU)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from fake_nvml import make_fake_nvml
from probes.nvidia_smi import read_topo_file
from probes.nvml import query_nvml
from topoprof.model.links import comm_from_topology
from topoprof.topology.build import build_topology, with_compute_capability

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "topo")
SM70 = 20.0  # NCCL src/graph/topo.h SM70_NVLINK_BW, per link per direction


def _path(prefix: str) -> str:
    return next(p for p in sorted(glob.glob(os.path.join(FIXTURES, f"{prefix}_*.txt")))
                if not p.endswith(".nccl-tests.txt"))


def _topo(prefix: str, nvml: str | None = None):
    return build_topology(smi=read_topo_file(_path(prefix)), nvml=query_nvml(make_fake_nvml(nvml)) if nvml else None)


def _dgx1_sm70():
    topo, notes = with_compute_capability(_topo("01"), (7, 0), "--gpu v100-sxm2")
    assert notes == []
    return topo


# ---- --gpu pins the NVLink generation -------------------------------------------------------

def test_gpu_makes_every_nvlink_pair_exact():
    topo = _dgx1_sm70()
    nv = [p for p in topo.pairs if p.path == "NV"]
    assert len(nv) == 16  # 4 NVLink peers per GPU
    for pair in nv:
        assert pair.bandwidth_gbps == pytest.approx(pair.nvlinks * SM70)
        assert pair.bandwidth_range_gbps is None and not pair.uncertain
        assert "sm70 from --gpu v100-sxm2" in pair.basis
    before = _topo("01")
    for old, new in zip(before.pairs, topo.pairs):  # the other pairs are untouched
        if old.path != "NV":
            assert old == new


def test_a_topology_capability_is_kept_and_a_different_gpu_is_noted():
    topo = _topo("18", nvml="dgx_h100_nvswitch")
    pinned, notes = with_compute_capability(topo, (7, 0), "--gpu v100-sxm2")
    assert pinned == topo
    assert len(notes) == 1 and "--gpu v100-sxm2 is sm70" in notes[0] and "sm90" in notes[0]
    same, none = with_compute_capability(topo, (9, 0), "--gpu h100-sxm")
    assert same == topo and none == []


def test_the_rate_says_where_it_came_from():
    _, pinned = comm_from_topology(_dgx1_sm70(), [0, 1], rate_origin="--gpu v100-sxm2")
    assert pinned["nvlink_rate"] == "NVLink sm70 (20 GB/s per link) per NCCL src/graph/topo.h, from --gpu v100-sxm2"
    assert pinned["bottleneck_gbps"] == [SM70, SM70]
    _, unknown = comm_from_topology(_topo("01"), [0, 1])
    assert "unknown" in unknown["nvlink_rate"] and "--gpu" in unknown["nvlink_rate"]
    _, nvml = comm_from_topology(_topo("18", nvml="dgx_h100_nvswitch"))
    assert nvml["nvlink_rate"].startswith("NVLink sm90 (20.6 GB/s per link)") and nvml["nvlink_rate"].endswith("the topology")
    _, pcie = comm_from_topology(_topo("24"))
    assert "nvlink_rate" not in pcie


# ---- the model command ------------------------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "topoprof", *args], capture_output=True, text=True, timeout=120)


MODEL = ["model", "--params", "25557032", "--micro-batch-time", "0.0964", "--optimizer-time", "0.0008",
         "--precision", "fp32", "--no-sweep", "--topology", _path("01")]


def test_model_text_says_where_the_rate_came_from():
    proc = _cli(*MODEL, "--gpu", "v100-sxm2", "--gpus", "0,1")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[1]
    assert "NVLink 20.0 GB/s per direction" in line and "uncertain" not in line
    assert "NVLink sm70 (20 GB/s per link) per NCCL src/graph/topo.h, from --gpu v100-sxm2" in line


def test_model_notes_a_gpu_that_disagrees_with_the_topology(tmp_path):
    from topoprof.jsonio import dumps, to_jsonable

    saved = tmp_path / "topo.json"
    saved.write_text(dumps(to_jsonable(_topo("18", nvml="dgx_h100_nvswitch"))))
    proc = _cli(*MODEL[:-1], str(saved), "--gpu", "v100-sxm2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert any("--gpu v100-sxm2 is sm70" in w for w in doc["warnings"])
    assert doc["links"]["bottleneck_gbps"] == pytest.approx([18 * 20.6] * 2)  # the topology's sm90 kept


def test_model_refuses_an_unknown_gpu_with_a_topology():
    proc = _cli(*MODEL, "--gpu", "b300-sxm")
    assert proc.returncode == 2 and "--gpu" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
