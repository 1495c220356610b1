"""`topoprof model`: JSON contract, link sources, and impossible input with the arithmetic shown."""
from __future__ import annotations

import glob
import json
import os

import pytest

from tests.helpers.cli import ModelRuns
from tests.helpers.cli import topoprof as _cli
from topoprof.model.compute.measured import MeasuredCompute

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
NCCL_TESTS_LOG = os.path.join(FIX, "topo", "22_rtx2080ti-2x-pix-autodl.nccl-tests.txt")
H100_TOPO = glob.glob(os.path.join(FIX, "topo", "18_*"))[0]
STRATEGIES = {"single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only", "ddp_fp16_compress",
              "fsdp_full_shard", "fsdp_full_shard_no_sync", "fsdp_shard_grad_op", "fsdp_shard_grad_op_no_sync",
              "hsdp", "hsdp_no_sync"}


def _model_json(*args) -> dict:
    proc = _cli("model", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_text_is_what_the_json_renders():
    """Tests share one `--json` run of a command for its text too (`tests/helpers/cli.py:ModelRun.text`):
    that is what the command prints without --json."""
    args = ("--preset", "gpt2", "--micro-batch-time", "0.05", "--world-size", "8", "--link-bandwidth", "100",
            "--accum", "4")
    text = _cli("model", *args)
    assert text.returncode == 0, text.stderr
    assert ModelRuns(None)(*args).text == text.stdout


def test_json_contract_with_explicit_link():
    doc = _model_json("--params", "350M", "--link-bandwidth", "10", "--link-latency", "5", "--world-size", "4",
                      "--micro-batch-time", "0.2", "--optimizer-time", "0.01", "--accum", "4")
    assert doc["kind"] == "model" and set(doc["strategies"]) == STRATEGIES
    for name, s in doc["strategies"].items():
        if name.startswith("hsdp"):  # one node: nothing to replicate across, and the reason says so
            assert s["step_time_s"] is None and "across nodes" in s["reason"]
            continue
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
      "--optimizer-time", "0.1"], "--micro-batch-time -1: must be > 0 seconds"),
    (["--preset", "gpt5", "--link-bandwidth", "1", "--world-size", "2", "--micro-batch-time", "1"], "valid names"),
    (["--params", "12Q", "--link-bandwidth", "1", "--world-size", "2", "--micro-batch-time", "1"], "--params"),
    (["--preset", "gpt2", "--topology", H100_TOPO, "--gpus", "0,9", "--micro-batch-time", "1"], "GPU(s) [9]"),
    (["--preset", "gpt2", "--params", "1B", "--link-bandwidth", "1", "--world-size", "2"], "exactly one of"),
    (["--preset", "gpt2", "--image-size", "224", "--link-bandwidth", "1", "--world-size", "2",
      "--micro-batch-time", "1"], "--image-size: gpt2 reads tokens, not images"),
    (["--params", "25M", "--image-size", "224", "--link-bandwidth", "1", "--world-size", "2",
      "--micro-batch-time", "1"], "--image-size applies to a vision preset"),
    (["--preset", "resnet50", "--tokens", "2048", "--gpu", "v100-sxm2", "--link-bandwidth", "1", "--world-size", "2"],
     "--tokens: resnet50 is an image model"),
    (["--preset", "gpt2", "--gpu", "h100-sxm", "--world-size", "1"], "--tokens: a --gpu what-if of gpt2 needs"),
    (["--params", "7B", "--gpu", "h100-sxm", "--world-size", "1", "--utilization", "0.4"],
     "--tokens: a --gpu what-if of --params 7B needs"),
])
def test_impossible_input_exit_2_with_arithmetic(args, text):
    proc = _cli("model", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert text in proc.stderr and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


# ---- one GPU, one GPU per node, and the optimizer time (0 or unknown) ------------------------

ONE_GPU = ["--params", "125M", "--world-size", "1", "--micro-batch-time", "0.1", "--optimizer-time", "0.01"]
ONE_PER_NODE = ["--params", "125M", "--nodes", "2", "--world-size", "2", "--network-bandwidth", "12",
                "--micro-batch-time", "0.1", "--optimizer-time", "0.01"]
OPTIMIZER_ZERO = ["--params", "125M", "--link-bandwidth", "10", "--world-size", "2", "--micro-batch-time", "0.1",
                  "--optimizer-time", "0"]
OPTIMIZER_UNKNOWN = ["--params", "125M", "--link-bandwidth", "10", "--world-size", "2", "--micro-batch-time", "0.1"]


@pytest.mark.parametrize("args", [ONE_GPU, ONE_PER_NODE, OPTIMIZER_ZERO, OPTIMIZER_UNKNOWN])
def test_answers_without_error_and_json_is_finite(args):
    text = _cli("model", *args)
    assert text.returncode == 0 and text.stderr == "", text.stderr
    assert "single" in text.stdout and "nan" not in text.stdout.lower()
    raw = _cli("model", *args, "--json")
    assert raw.returncode == 0, raw.stderr
    assert "Infinity" not in raw.stdout and "NaN" not in raw.stdout


def test_one_gpu_is_single_with_its_accumulation():
    proc = _cli("model", *ONE_GPU)
    assert "none needed (one GPU" in proc.stdout and "n/a (one GPU: nothing to all-reduce" in proc.stdout
    assert "DDP exposes" not in proc.stdout  # no DDP, so no hide threshold
    doc = _model_json(*ONE_GPU)
    single = doc["strategies"]["single"]
    assert single["step_time_s"] == pytest.approx(1 * 0.1 + 0.01)  # K*c + T_opt, K = 1
    assert single["speedup_vs_ddp_synced"] is None  # ddp_synced does not apply
    for name in STRATEGIES - {"single"}:
        assert doc["strategies"][name]["step_time_s"] is None
        assert "one GPU" in doc["strategies"][name]["reason"]
    assert doc["sweep"]["strategies"]["single"] == pytest.approx([k * 0.1 + 0.01 for k in doc["sweep"]["accum"]])
    assert doc["hide_threshold"]["reason"] and doc["inputs"]["comm"]["value"]["kind"] == "none"
    assert [o["strategy"] for o in doc["fixed_global_batch"]["options"]] == ["single"]


@pytest.mark.parametrize("args", [
    ["--world-size", "1", "--link-bandwidth", "10", "--link-latency", "5"],  # link options ignored
    ["--gpus", "0"],
    ["--topology", H100_TOPO, "--gpus", "3"],
    ["--nodes", "1", "--gpus-per-node", "1"],
])
def test_every_way_of_saying_one_gpu(args):
    doc = _model_json("--params", "125M", *args, "--micro-batch-time", "0.1", "--optimizer-time", "0.01", "--accum",
                      "4")
    assert doc["inputs"]["world_size"]["value"] == 1
    assert doc["strategies"]["single"]["step_time_s"] == pytest.approx(4 * 0.1 + 0.01)
    assert doc["strategies"]["ddp_synced"]["step_time_s"] is None
    if "--link-bandwidth" in args:
        assert any("--link-bandwidth, --link-latency ignored" in w for w in doc["warnings"])


def test_one_gpu_per_node_needs_only_the_network():
    proc = _cli("model", *ONE_PER_NODE)
    assert "network 12 GB/s per node" in proc.stdout
    doc = _model_json(*ONE_PER_NODE)
    comm = doc["inputs"]["comm"]["value"]
    assert comm["intra"] is None and comm["gpus_per_node"] == 1
    assert comm["bus_bandwidth_gbps"] == 12.0 and comm["inter"]["hop_latency_us"] == 14.0
    assert "single-node" in doc["strategies"]["dp"]["reason"]
    # Every edge of a 2-rank ring across 2 nodes is a network hop: the same all-reduce as a
    # 2-GPU ring whose links run at the network's 12 GB/s and 14 us per hop.
    flat = _model_json("--params", "125M", "--world-size", "2", "--link-bandwidth", "12", "--link-latency", "14",
                       "--micro-batch-time", "0.1", "--optimizer-time", "0.01")
    for name in ("ddp_synced", "ddp_no_sync", "ddp_fp16_compress"):
        assert doc["strategies"][name]["step_time_s"] == pytest.approx(flat["strategies"][name]["step_time_s"])


def test_optimizer_time_zero_is_accepted():
    doc = _model_json(*OPTIMIZER_ZERO)
    assert doc["inputs"]["optimizer_time_s"]["value"] == 0.0
    e = doc["per_micro_batch"]["ddp_exposed_s"]
    assert doc["strategies"]["single"]["step_time_s"] == pytest.approx(0.1)  # K*c, K = 1
    assert doc["strategies"]["ddp_synced"]["step_time_s"] == pytest.approx(0.1 + e)  # K*(c + E)


def test_unknown_optimizer_time_is_assumed_zero_and_said():
    proc = _cli("model", *OPTIMIZER_UNKNOWN)
    assert "optimizer 0.0 ms (unknown: assumed 0)" in proc.stdout
    assert "step times exclude the optimizer step" in proc.stdout
    doc = _model_json(*OPTIMIZER_UNKNOWN)
    assert doc["inputs"]["optimizer_time_s"] == {"value": 0.0, "source": "unknown: assumed 0 s; give --optimizer-time "
                                                                         "or --gpu"}
    assert any("exclude the optimizer" in w for w in doc["warnings"])
    assert doc["strategies"]["single"]["step_time_s"] == pytest.approx(0.1)


def test_negative_optimizer_time_is_refused():
    proc = _cli("model", *OPTIMIZER_UNKNOWN, "--optimizer-time", "-0.01")
    assert proc.returncode == 2 and "--optimizer-time -0.01: must be >= 0 seconds" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- image models: FLOPs per image ------------------------------------------------------------

VISION = ["--preset", "resnet50", "--micro-batch-size", "32", "--gpu", "v100-sxm2", "--precision", "fp32",
          "--world-size", "8", "--link-bandwidth", "20"]


@pytest.mark.slow
def test_resnet50_on_v100_counts_the_micro_batchs_images():
    doc = _model_json(*VISION, "--image-size", "224")
    inputs = doc["inputs"]
    assert inputs["params"]["value"] == 25_557_032 and inputs["model"]["value"] == "resnet50"
    assert inputs["tokens_per_micro_batch"]["value"] == 32  # images, one micro-batch's
    # priced from its own ops: 32 images of 224 px traced, 24.3 GFLOPs each (forward 8.18 +
    # backward 16.12), the layout's count (the trace counts what the layout does)
    flops = 32 * (8_178_368_512 + 16_120_709_120)
    model = inputs["compute_model"]["value"]
    assert model["flops"] == flops and model["shape"].startswith("32x3x224x224")
    assert "model's own ops" in inputs["micro_batch_time_s"]["source"]
    fast, slow = inputs["micro_batch_time_range_s"]["value"]
    assert fast < inputs["micro_batch_time_s"]["value"] < slow
    assert doc["strategies"]["ddp_synced"]["step_time_s"] > 0
    # 224 is the default; another size changes compute, not the parameters
    assert _model_json(*VISION)["inputs"]["micro_batch_time_s"] == inputs["micro_batch_time_s"]
    small = _model_json(*VISION, "--image-size", "112")["inputs"]
    assert small["params"]["value"] == 25_557_032
    from topoprof.workload.presets import get_preset

    assert small["compute_model"]["value"]["flops"] == 32 * get_preset("resnet50", 112).train_flops_per_token
    assert small["micro_batch_time_s"]["value"] < inputs["micro_batch_time_s"]["value"]


def test_a_given_utilization_keeps_the_datasheet_formula():
    # 32 images x 24.3 GFLOPs over 15.7 fp32 TFLOP/s x the utilization given; nothing traced
    inputs = _model_json(*VISION, "--utilization", "0.25")["inputs"]
    flops = 32 * (8_178_368_512 + 16_120_709_120)
    assert inputs["micro_batch_time_s"]["value"] == pytest.approx(flops / (15.7e12 * 0.25), rel=1e-9)
    assert "per image x 32 images" in inputs["micro_batch_time_s"]["source"]
    assert inputs["utilization"] == {"value": 0.25, "source": "given"}
    assert "compute_model" not in inputs and "micro_batch_time_range_s" not in inputs


def test_an_image_preset_on_a_gpu_is_timed_with_its_images(monkeypatch):
    """With the GPU named here, the preset is timed (measure_preset replaced: what it was asked is
    checked)."""
    from click.testing import CliRunner

    from topoprof.cli import main

    asked = []
    monkeypatch.setattr("topoprof.model.inputs.user_model.here_gpu_name", lambda device: "Tesla V100-SXM2-32GB")

    def fake(preset, micro_batch, seq_len, device, precision="bf16", optimizer="adamw", image_size=None,
             ac="none", progress=None):
        asked.append((preset, micro_batch, seq_len, device, precision, image_size))
        return MeasuredCompute(0.2, 0.66, 0.01, f"{preset}: measured on {device}")

    for where in ("topoprof.model.inputs.gather", "topoprof.model.inputs.user_model"):
        monkeypatch.setattr(f"{where}.visible_gpus", lambda: [0])
    monkeypatch.setattr("topoprof.model.inputs.gather.measure_preset", fake)
    result = CliRunner().invoke(main, ["model", *VISION, "--image-size", "160", "--json"])
    assert result.exit_code == 0, result.output
    assert asked == [("resnet50", 32, None, "cuda:0", "fp32", 160)]
    assert json.loads(result.output)["inputs"]["micro_batch_time_s"]["value"] == 0.2
    # another GPU here: a what-if of the V100 never times the preset on it, nor takes its time
    monkeypatch.setattr("topoprof.model.inputs.user_model.here_gpu_name", lambda device: "NVIDIA A100-SXM4-80GB")
    asked.clear()
    result = CliRunner().invoke(main, ["model", *VISION, "--image-size", "160", "--json"])
    assert result.exit_code == 0, result.output
    assert asked == [] and "model's own ops" in json.loads(result.output)["inputs"]["micro_batch_time_s"]["source"]


USER_MODELS = os.path.join(FIX, "user_models")
FLOP_ORDER = ("gradient-ready order: backward FLOPs per tensor (FlopCounterMode on meta at 4x32), "
              "since the compute is given (--micro-batch-time)")


def test_given_compute_orders_the_users_gradients_by_backward_flops():
    args = ("model", "--model", os.path.join(USER_MODELS, "tied.py:build"), "--world-size", "2",
            "--link-bandwidth", "10", "--micro-batch-time", "0.05", "--no-sweep")
    text = _cli(*args)
    assert text.returncode == 0, text.stderr
    (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith("model: ")]
    assert FLOP_ORDER in line
    doc = json.loads(_cli(*args, "--json").stdout)
    assert FLOP_ORDER in doc["inputs"]["model"]["source"]
    assert doc["inputs"]["micro_batch_time_s"]["value"] == 0.05


def test_a_model_that_cannot_run_on_meta_keeps_the_timed_order_with_a_note():
    doc = _model_json("--model", os.path.join(USER_MODELS, "meta.py:reads_a_value"), "--world-size", "2",
                      "--link-bandwidth", "10", "--micro-batch-time", "0.05", "--no-sweep")
    assert "gradient-ready order: measured on cpu, although the compute is given" in doc["inputs"]["model"]["source"]
    (note,) = [w for w in doc["warnings"] if "gradient-ready order" in w]
    assert "Tensor.item() cannot be called on meta tensors" in note


# ---- --gpu without a link: the GPU's standard node -------------------------------------------

def _no_gpu_here(monkeypatch):
    from topoprof.topology.build import Topology

    monkeypatch.setattr("topoprof.model.inputs.gather.collect_topology",
                        lambda: Topology(sources=("this machine",), gpus=(), nics=(), pairs=(), gpu_nic_paths={}))


def _assumed(monkeypatch, gpu: str, **cluster):
    from topoprof.model.compute.datasheet import named_gpu
    from topoprof.model.inputs.gather import gather_links
    from topoprof.model.inputs.link_choice import comm_of
    from topoprof.model.inputs.request import ClusterRequest

    _no_gpu_here(monkeypatch)
    request = ClusterRequest(**cluster)
    return comm_of(gather_links(request), request, named_gpu(gpu))


def test_an_sxm_gpu_without_a_link_is_on_its_nvswitch_board(monkeypatch):
    comm, gpn, described = _assumed(monkeypatch, "h100-sxm", world_size=8)
    # 18 NVLinks x NCCL's sm90 20.6 GB/s .. the datasheet's 25 GB/s (topology/constants.py)
    assert gpn == 8 and comm.world_size == 8 and comm.bandwidth_range_gbps == pytest.approx((18 * 20.6, 18 * 25.0))
    assert comm.rings == 18
    line = described["assumed_node"]
    assert "NVSwitch" in line and "18 NVLinks" in line and "--link-bandwidth or --topology overrides" in line
    assert "\n" not in line


@pytest.mark.parametrize("gpu", ["l40s", "a100-pcie-80gb"])
def test_a_pcie_card_without_a_link_is_on_pcie_of_its_generation(monkeypatch, gpu):
    comm, gpn, described = _assumed(monkeypatch, gpu, world_size=4)
    # PCIe Gen4 x16: NCCL's 16 x 120 / 80 = 24 GB/s .. raw 16 x 16 GT/s x 128/130 / 8 = 31.5 GB/s
    assert gpn == 4 and comm.bandwidth_range_gbps == pytest.approx((24.0, 16 * 16 * 128 / 130 / 8))
    assert "over PCIe" in described["assumed_node"] and "PCIe Gen4 x16" in described["assumed_node"]
    assert "NVSwitch" not in described["assumed_node"]


def test_a_given_link_bandwidth_overrides_the_standard_node(monkeypatch):
    comm, _, described = _assumed(monkeypatch, "h100-sxm", world_size=8, link_bandwidth_gbps=100.0)
    assert comm.link_bandwidth_gbps == 100.0 and "assumed_node" not in described


def test_more_gpus_than_one_standard_node_are_refused_in_one_line(monkeypatch):
    from topoprof.errors import InputError

    with pytest.raises(InputError) as err:
        _assumed(monkeypatch, "h100-sxm", world_size=16)
    assert "holds 8" in str(err.value) and "--nodes 2" in str(err.value) and "\n" not in str(err.value)
    comm, gpn, described = _assumed(monkeypatch, "h100-sxm", world_size=16, nodes=2)
    assert gpn == 8 and "assumed_node" in described  # two nodes: the network is the user's to give


def test_the_assumed_node_is_said_in_text_and_json():
    # V100 SXM2: 6 NVLinks on NVSwitch; CI machines are not DGX-1s
    args = ["--params", "125M", "--gpu", "v100-sxm2", "--world-size", "8", "--micro-batch-time", "0.1"]
    text = _cli("model", *args)
    assert text.returncode == 0, text.stderr
    assert "links: assumed v100-sxm2's standard node: 8 GPUs on NVSwitch" in text.stdout
    doc = _model_json(*args)
    assert doc["links"]["assumed_node"].startswith("assumed v100-sxm2's standard node")
    beyond = _cli("model", *args[:4], "--world-size", "16", "--micro-batch-time", "0.1")
    assert beyond.returncode == 2 and beyond.stderr.count("\n") == 1 and "--link-bandwidth" in beyond.stderr
