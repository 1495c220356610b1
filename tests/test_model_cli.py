"""`topoprof model`: JSON contract, link sources, and impossible input with the arithmetic shown."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
NCCL_TESTS_LOG = os.path.join(FIX, "topo", "22_rtx2080ti-2x-pix-autodl.nccl-tests.txt")
H100_TOPO = glob.glob(os.path.join(FIX, "topo", "18_*"))[0]
STRATEGIES = {"single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only", "ddp_fp16_compress"}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "topoprof", *args], capture_output=True, text=True, timeout=120)


def _model_json(*args) -> dict:
    proc = _cli("model", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_contract_with_explicit_link():
    doc = _model_json("--params", "350M", "--link-bandwidth", "10", "--link-latency", "5", "--world-size", "4",
                      "--micro-batch-time", "0.2", "--optimizer-time", "0.01", "--accum", "4")
    assert doc["kind"] == "model" and set(doc["strategies"]) == STRATEGIES
    for name, s in doc["strategies"].items():
        assert {"step_time_s", "comm_exposed_s", "samples_per_s"} <= set(s), name
    inputs = doc["inputs"]
    assert inputs["world_size"]["value"] == 4 and inputs["accumulation_steps"]["value"] == 4
    assert "given" in inputs["micro_batch_time_s"]["source"]
    s = doc["strategies"]
    assert s["ddp_no_sync"]["step_time_s"] <= s["ddp_synced"]["step_time_s"]
    assert s["ddp_no_sync_backward_only"]["step_time_s"] == s["ddp_synced"]["step_time_s"]
    assert doc["sweep"]["accum"] == [1, 2, 4, 8, 16, 32]


def test_k1_makes_synced_and_no_sync_equal():
    doc = _model_json("--params", "125M", "--link-bandwidth", "5", "--world-size", "2",
                      "--micro-batch-time", "0.1", "--optimizer-time", "0.01")
    s = doc["strategies"]
    assert s["ddp_no_sync"]["step_time_s"] == pytest.approx(s["ddp_synced"]["step_time_s"])


def test_dp_is_null_with_reason_across_nodes():
    doc = _model_json("--preset", "gpt2", "--link-bandwidth", "100", "--world-size", "16", "--nodes", "2",
                      "--network-bandwidth", "25", "--micro-batch-time", "0.1", "--optimizer-time", "0.01")
    assert doc["strategies"]["dp"]["step_time_s"] is None
    assert "single-node" in doc["strategies"]["dp"]["reason"]


def test_bench_fit_as_link_source(tmp_path):
    bench = tmp_path / "bench.json"
    proc = _cli("bench", "--from-nccl-tests", NCCL_TESTS_LOG, "--out", str(bench))
    assert proc.returncode == 0, proc.stderr
    doc = _model_json("--preset", "bert-base", "--bench", str(bench), "--micro-batch-time", "0.05",
                      "--optimizer-time", "0.005", "--accum", "8")
    assert doc["inputs"]["world_size"]["value"] == 2
    assert "bench" in doc["links"]


def test_topology_file_and_gpu_subset_give_a_ring_and_a_range():
    doc = _model_json("--preset", "gpt2", "--topology", H100_TOPO, "--gpus", "0,1,2,3",
                      "--micro-batch-time", "0.1", "--optimizer-time", "0.01", "--accum", "2")
    assert doc["inputs"]["world_size"]["value"] == 4
    assert sorted(doc["links"]["ring"]) == [0, 1, 2, 3]
    lo, hi = doc["links"]["bottleneck_gbps"]  # NV18 without NVML: per-link rate unknown
    assert lo == pytest.approx(18 * 12.0) and hi == pytest.approx(18 * 40.1)
    assert doc["strategies"]["ddp_synced"]["range"] is not None


def test_topo_json_round_trips_as_a_topology_source(tmp_path):
    topo = tmp_path / "topo.json"
    topo.write_text(_cli("topo", "--from-file", H100_TOPO, "--json").stdout)
    doc = _model_json("--preset", "gpt2", "--topology", str(topo), "--micro-batch-time", "0.1",
                      "--optimizer-time", "0.01")
    assert doc["inputs"]["world_size"]["value"] == 8


@pytest.mark.parametrize("args, text", [
    (["--params", "1B", "--link-bandwidth", "1", "--world-size", "8", "--nodes", "3", "--gpus-per-node", "3",
      "--micro-batch-time", "1"], "world_size(8) != nodes(3) * gpus_per_node(3)"),
    (["--params", "1B", "--link-bandwidth", "1", "--world-size", "2", "--micro-batch-time", "1", "--accum", "0"],
     "accumulation steps K must be >= 1"),
    (["--params", "1B", "--link-bandwidth", "1", "--world-size", "2", "--micro-batch-time", "-1",
      "--optimizer-time", "0.1"], "micro_batch_time_s must be > 0"),
    (["--preset", "gpt5", "--link-bandwidth", "1", "--world-size", "2", "--micro-batch-time", "1"], "valid names"),
    (["--params", "12Q", "--link-bandwidth", "1", "--world-size", "2", "--micro-batch-time", "1"], "--params"),
    (["--preset", "gpt2", "--topology", H100_TOPO, "--gpus", "0,9", "--micro-batch-time", "1"], "GPU(s) [9]"),
    (["--preset", "gpt2", "--params", "1B", "--link-bandwidth", "1", "--world-size", "2"], "exactly one of"),
])
def test_impossible_input_exit_2_with_arithmetic(args, text):
    proc = _cli("model", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert text in proc.stderr and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
