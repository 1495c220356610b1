"""The what-if compute from the model's own operations, end to end: `topoprof model --gpu` for a
preset, `--params` and `--model` priced from their op trace (a worker traces on the meta device),
eager vs `--compiled`, the datasheet range where the ops cannot be priced, and a GPU that is here
(its timing replaced: this project's test machine has none) showing the modelled range beside the
measured time, in `model` and in a scan."""
from __future__ import annotations

import json
import os

import pytest
from tests.helpers.cli import topoprof as _cli

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
USER_MODELS = os.path.join(FIX, "user_models")
H100 = "NVIDIA H100 80GB HBM3"
GPT2 = ["--preset", "gpt2", "--tokens", "1024", "--gpu", "h100-sxm", "--world-size", "1", "--no-sweep"]


def _json(*args) -> dict:
    proc = _cli("model", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def gpt2_eager():
    return _json(*GPT2)


def test_a_preset_on_a_gpu_not_here_is_priced_from_its_ops(gpt2_eager):
    inputs = gpt2_eager["inputs"]
    model = inputs["compute_model"]["value"]
    fast, slow = inputs["micro_batch_time_range_s"]["value"]
    middle = inputs["micro_batch_time_s"]["value"]
    assert fast < middle < slow and model["seconds"] == [fast, middle, slow]
    assert "model's own ops" in inputs["micro_batch_time_s"]["source"] and "utilization" not in inputs
    assert model["shape"].startswith("1x1024") and model["kernels"] > 100 and model["views"] > 0
    # one forward + backward of GPT-2's matmuls: at least 6 x its non-embedding weights x 1024 tokens
    assert model["flops"] > 6 * 85_000_000 * 1024
    assert inputs["backward_fraction"]["value"] == pytest.approx(model["backward_fraction"])
    basis = " ".join(model["basis"])
    for source in ("datasheet", "FlashAttention-2", "FastIceFlo", "pytorch/pytorch#41383", "sam2#768",
                   "Matrix Multiplication Background"):
        assert source in basis, source
    single = gpt2_eager["strategies"]["single"]
    lo, hi = single["range"]["step_time_s"]
    assert lo < single["step_time_s"] < hi


def test_the_text_says_what_the_compute_rests_on():
    text = _cli("model", *GPT2).stdout
    assert "a what-if from the model's own ops" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("compute model: ")]
    assert "h100-sxm (bf16, eager)" in line and "kernels" in line


def test_compiled_drops_the_per_op_host_cost(gpt2_eager):
    compiled = _json(*GPT2, "--compiled")["inputs"]
    eager = gpt2_eager["inputs"]
    assert compiled["compute_model"]["value"]["kernels"] == eager["compute_model"]["value"]["kernels"]
    for c, e in zip(compiled["compute_model"]["value"]["seconds"], eager["compute_model"]["value"]["seconds"]):
        assert c < e
    assert "compiled" in compiled["compute_model"]["value"]["device"]
    assert any("fusion" in n for n in compiled["compute_model"]["value"]["notes"])
    measured = _json("--preset", "gpt2", "--tokens", "1024", "--world-size", "1", "--no-sweep", "--micro-batch-time",
                     "0.02", "--compiled")
    assert any("--compiled applies to compute modelled" in w for w in measured["warnings"])


def test_params_n_is_priced_as_the_synthetic_model():
    inputs = _json("--params", "20M", "--tokens", "256", "--gpu", "a100-sxm4-80gb", "--world-size", "1",
                   "--no-sweep")["inputs"]
    model = inputs["compute_model"]["value"]
    assert any("synthetic model" in n for n in model["notes"]) and model["shape"].startswith("1x257")


def test_where_the_ops_cannot_be_traced_the_datasheet_range_stands_and_says_why(monkeypatch):
    from click.testing import CliRunner

    from topoprof.cli import main

    monkeypatch.setattr("topoprof.measure.op_trace.trace_model", lambda *a, **k: {"failure": "on meta, boom"})
    result = CliRunner().invoke(main, ["model", *GPT2, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert "compute_model" not in doc["inputs"]
    assert "assumption" in doc["inputs"]["utilization"]["source"]  # the 3-52 % range's middle
    assert any("could not be priced (on meta, boom)" in w and "datasheet range stands in" in w for w in doc["warnings"])


def test_a_users_model_timed_on_the_cpu_is_priced_for_the_gpu_predicted():
    spec = os.path.join(USER_MODELS, "tied.py:build")
    doc = _json("--model", spec, "--gpu", "h100-sxm", "--world-size", "1", "--no-sweep")
    inputs = doc["inputs"]
    assert "model's own ops" in inputs["micro_batch_time_s"]["source"]  # not the CPU's time
    assert inputs["compute_model"]["value"]["shape"] == "4x32"
    assert "backward FLOPs per tensor" in inputs["model"]["source"]  # the same pass orders the gradients


def test_a_users_model_that_cannot_run_on_meta_keeps_its_measured_time():
    doc = _json("--model", os.path.join(FIX, "user_models", "meta.py:reads_a_value"), "--gpu", "h100-sxm",
                "--world-size", "1", "--no-sweep")
    assert "measured" in doc["inputs"]["micro_batch_time_s"]["source"]
    assert any("could not be priced for h100-sxm" in w and "measured on cpu" in w for w in doc["warnings"])


# ---- a GPU here: measured beats modelled, and the gap is shown (timing replaced) -------------

def _fake_timing(monkeypatch, seconds=0.05):
    asked = []

    def fake(preset, micro_batch, seq_len, device, precision="bf16", optimizer="adamw", image_size=None, ac="none"):
        asked.append((preset, micro_batch, seq_len))
        return {"micro_batch_time_s": seconds, "backward_fraction": 0.66, "optimizer_time_s": 0.01,
                "source": f"{preset}: measured on {device}", "scaled": None, "device_name": H100}

    monkeypatch.setattr("topoprof.model.inputs.user_model.measure_preset", fake)
    return asked


def test_model_on_this_gpu_prints_the_modelled_range_beside_the_measured_time(monkeypatch):
    from click.testing import CliRunner

    from topoprof.cli import main

    monkeypatch.setattr("topoprof.measure.runner.visible_gpus", lambda: [0])
    asked = _fake_timing(monkeypatch)
    args = ["model", "--preset", "gpt2", "--tokens", "1024", "--world-size", "1", "--no-sweep"]
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert asked == [("gpt2", 1, 1024)]
    (line,) = [ln for ln in text.output.splitlines() if ln.startswith("per micro-batch:")]
    assert line.startswith("per micro-batch: compute 50.0 ms") and "modelled from its ops" in line
    doc = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    fast, middle, slow = doc["inputs"]["micro_batch_time_modelled_s"]["value"]
    assert doc["inputs"]["micro_batch_time_s"]["value"] == 0.05  # measured beats modelled
    assert f"{0.05 / middle - 1:+.0%}" in doc["inputs"]["micro_batch_time_modelled_s"]["source"]
    assert "h100-sxm" in doc["inputs"]["compute_model"]["value"]["device"]


def test_a_gpu_scan_checks_the_what_if_against_what_it_timed(monkeypatch):
    from topoprof.measure.fit import Fit
    from topoprof.model.inputs import scan
    from topoprof.report.markdown import _predictions
    from topoprof.scan.options import ScanOptions

    _fake_timing(monkeypatch)
    fit = Fit.from_dict({"collective": "all_reduce", "latency_us": 20.0, "bandwidth_gbps": 100.0, "r2": 1.0,
                         "max_rel_error": 0.0, "n_points": 3, "outliers": [], "latency_clamped": False})
    opts = ScanOptions(backend="nccl", nproc=8, note="", preset="gpt2", tokens=1024)
    (pred,) = scan.predictions(opts, fit, 8, None, None, H100)
    assert pred["inputs"]["micro_batch_time_s"]["value"] == 0.05
    assert len(pred["inputs"]["micro_batch_time_modelled_s"]["value"]) == 3
    page = "\n".join(_predictions({"predictions": [pred]}))
    assert "measured 50.0 ms; modelled from its own ops" in page and "Compute model:" in page


def test_a_one_gpu_scan_checks_the_what_if_or_says_its_timing_failed(monkeypatch):
    """The one-GPU what-if (the scan's only GPU-only stage) carries the check of the method, and
    where timing on GPU0 fails it is a partial status in the summary, not a silent fallback."""
    from types import SimpleNamespace

    from topoprof.scan.job import _what_ifs
    from topoprof.scan.options import ScanOptions

    gpu = SimpleNamespace(index=0, name=H100, compute_capability=(9, 0), pcie_gen_max=5, pcie_width_max=16)
    topology = SimpleNamespace(gpus=[gpu])
    opts = ScanOptions(backend="nccl", nproc=1, note="", preset="gpt2", tokens=1024)
    _fake_timing(monkeypatch)
    timed, status = _what_ifs(opts, topology)
    assert status.status == "ok" and not timed["timing_failed"]
    assert timed["compute_check"]["measured_s"] == 0.05 and len(timed["compute_check"]["modelled_s"]) == 3

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr("topoprof.model.inputs.user_model.measure_preset", broken)
    fell_back, status = _what_ifs(opts, topology)
    assert fell_back["timing_failed"] and "compute_check" not in fell_back
    assert status.status == "partial" and "timing gpt2 on GPU0 failed (RuntimeError: CUDA error" in status.detail
