"""The what-if compute from the model's own operations, end to end: `topoprof model --gpu` for a
preset, `--params` and `--model` priced from their op trace (a worker traces on the meta device)
with the nearest device profile shipped, or one given by `--gpu-profile`; eager vs `--compiled`;
the datasheet where no profile can be had; and a GPU that is here (its timing replaced: this
project's test machine has none) showing the modelled range beside the measured time, in `model`
and in a scan."""
from __future__ import annotations

import json
import os

import pytest

from tests.helpers.cli import ModelRuns
from tests.helpers.cli import topoprof as _cli
from tests.helpers.profiles import GRID, HOST, profile_doc
from topoprof.model.compute.measured import MeasuredCompute
from topoprof.report.scan_report import read_scan_parts
from topoprof.specs.messages import TraceFailure

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
SHIPPED_H200 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "topoprof", "model", "compute", "profiles",
                            "nvidia-h200-sxm-gpu-facts-20261126.json")
USER_MODELS = os.path.join(FIX, "user_models")
H100 = "NVIDIA H100 80GB HBM3"
GPT2 = ["--preset", "gpt2", "--tokens", "1024", "--gpu", "h100-sxm", "--world-size", "1", "--no-sweep"]
H200 = [*GPT2[:4], "--gpu", "h200-sxm", "--world-size", "1", "--no-sweep"]


def _json(runs: ModelRuns, *args) -> dict:
    """The JSON of a command that times nothing here (run once per session, `ModelRuns`)."""
    run = runs(*args)
    assert run.returncode == 0, run.stderr
    return run.doc


# The path a GPU with no profile of its own takes: another GPU's profile, scaled by the datasheets
SCALED = [*GPT2, "--gpu-profile", SHIPPED_H200]


@pytest.fixture
def gpt2_eager(model_runs):
    return _json(model_runs, *SCALED)


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
    for source in ("device profile: measured on an NVIDIA H200 SXM, torch 2.11, 2026-11-26 (shared/gpu-facts)",
                   "scaled by h100-sxm / h200-sxm",
                   "Matrix Multiplication Background", "halved when causal", "derived: opbench's tiny Linear"):
        assert source in basis, source
    assert model["device"] == "h100-sxm (bf16, eager, scaled from the h200-sxm profile)"
    single = gpt2_eager["strategies"]["single"]
    lo, hi = single["range"]["step_time_s"]
    assert lo < single["step_time_s"] < hi


@pytest.mark.slow
def test_the_text_says_what_the_compute_rests_on(model_runs):
    text = model_runs(*SCALED).text
    assert "a what-if from the model's own ops" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("compute model: ")]
    assert "h100-sxm (bf16, eager, scaled from the h200-sxm profile)" in line and "kernels" in line


def test_compiled_fuses_chains_and_pays_per_graph(gpt2_eager, model_runs):
    compiled = _json(model_runs, *SCALED, "--compiled")["inputs"]
    eager = gpt2_eager["inputs"]
    assert compiled["compute_model"]["value"]["kernels"] < eager["compute_model"]["value"]["kernels"]
    for c, e in zip(compiled["compute_model"]["value"]["seconds"], eager["compute_model"]["value"]["seconds"]):
        assert c < e
    assert "compiled" in compiled["compute_model"]["value"]["device"]
    assert any("chains of memory-bound ops fused" in b for b in compiled["compute_model"]["value"]["basis"])
    measured = _json(model_runs, "--preset", "gpt2", "--tokens", "1024", "--world-size", "1", "--no-sweep",
                     "--micro-batch-time", "0.02", "--compiled")
    assert any("--compiled applies to compute modelled" in w for w in measured["warnings"])


@pytest.mark.slow
def test_gpu_profile_prices_with_the_file_as_measured_or_scaled(model_runs):
    same = _json(model_runs, *H200, "--gpu-profile", SHIPPED_H200)
    chosen = _json(model_runs, *H200)   # the shipped one, chosen
    model = same["inputs"]["compute_model"]["value"]
    assert model["device"] == "h200-sxm (bf16, eager, profile)" and model["seconds"] == \
        chosen["inputs"]["compute_model"]["value"]["seconds"]
    assert any("its rates as measured" in b for b in model["basis"])
    assert any(f"given ({SHIPPED_H200})" in b for b in model["basis"])
    scaled = _json(model_runs, *GPT2, "--gpu-profile", SHIPPED_H200)["inputs"]["compute_model"]["value"]
    assert scaled["device"] == "h100-sxm (bf16, eager, scaled from the h200-sxm profile)"
    alone = _json(model_runs, *GPT2[:4], "--gpu-profile", SHIPPED_H200, "--world-size", "1", "--no-sweep")["inputs"]
    assert alone["compute_model"]["value"]["seconds"] == model["seconds"]   # without --gpu: the profile's own GPU
    assert "h200-sxm" in alone["gpu_memory_gb"]["source"]


@pytest.mark.slow
def test_a_gpu_with_a_shipped_profile_of_its_own_is_priced_from_it_as_measured(model_runs):
    """The H100's profile measured by `topoprof profile` (reports/gpu-nvidia-h100-80gb-hbm3-20261127)
    is chosen for an H100 before the H200's scaled; the H200 keeps its own."""
    h100 = _json(model_runs, *GPT2)["inputs"]["compute_model"]["value"]
    assert h100["device"] == "h100-sxm (bf16, eager, profile)"
    assert any("nvidia-h100-80gb-hbm3-topoprof-20261127.json" in b and "as a profile of this GPU" in b
               for b in h100["basis"])
    h200 = _json(model_runs, *H200)["inputs"]["compute_model"]["value"]
    assert any("nvidia-h200-sxm-gpu-facts-20261126.json" in b for b in h200["basis"])


def test_gpu_profile_of_a_cpu_prices_the_model_on_that_cpu(tmp_path, model_runs):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(profile_doc(device="AMD EPYC 7B13", kind="cpu", dtype="float32", gemm=GRID,
                                           memory=[(("add", 1 << 20), 1e10), (("add", 1 << 26), 2e10)],
                                           sdpa=[((64, 64, True), 1e10), ((1024, 64, True), 5e10),
                                                 ((64, 64, False), 1e10), ((1024, 64, False), 5e10)],
                                           host=HOST)))
    doc = _json(model_runs, "--preset", "gpt2", "--tokens", "128", "--gpu-profile", str(path), "--world-size", "1",
                "--no-sweep")
    model = doc["inputs"]["compute_model"]["value"]
    assert model["device"] == "AMD EPYC 7B13 (float32, eager, profile)"
    assert any("ops run inline on the host" in b for b in model["basis"])
    fast, middle, slow = model["seconds"]
    assert 0 < fast <= middle <= slow
    refused = _cli("model", "--preset", "gpt2", "--tokens", "128", "--gpu-profile", str(path), "--gpu", "h100-sxm",
                   "--world-size", "1", "--no-sweep")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "a CPU's: it cannot be scaled to GPU 'h100-sxm'" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("content, message", [
    ('{"kind": "bench"}', "not a device profile (kind 'bench'"),
    ("{oops", "not JSON"),
])
def test_a_bad_gpu_profile_file_is_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    proc = _cli("model", *GPT2, "--gpu-profile", str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr
    assert str(path) in proc.stderr and "Traceback" not in proc.stderr
    fp16 = _cli("model", *GPT2, "--gpu-profile", SHIPPED_H200, "--precision", "fp16")
    assert fp16.returncode == 2 and "measured in bfloat16: it cannot price --precision fp16" in fp16.stderr


@pytest.mark.slow
def test_where_no_profile_can_be_had_the_datasheet_prices_it_and_says_so(model_runs):
    doc = _json(model_runs, "--preset", "gpt2", "--tokens", "256", "--gpu", "v100-sxm2", "--precision", "fp16",
                "--world-size", "1", "--no-sweep")
    model = doc["inputs"]["compute_model"]["value"]
    assert model["device"] == "v100-sxm2 (fp16, eager, datasheet)"
    assert any("no device profile can be scaled to v100-sxm2 in fp16" in n for n in model["notes"])


@pytest.mark.slow
def test_params_n_is_priced_as_the_synthetic_model(model_runs):
    inputs = _json(model_runs, "--params", "20M", "--tokens", "256", "--gpu", "a100-sxm4-80gb", "--world-size", "1",
                   "--no-sweep")["inputs"]
    model = inputs["compute_model"]["value"]
    assert any("synthetic model" in n for n in model["notes"]) and model["shape"].startswith("1x257")


def test_where_the_ops_cannot_be_traced_the_datasheet_range_stands_and_says_why(monkeypatch):
    from click.testing import CliRunner

    from topoprof.cli import main

    for where in ("topoprof.model.inputs.traces", "topoprof.model.inputs.user_model"):
        monkeypatch.setattr(f"{where}.trace_model", lambda *a, **k: TraceFailure("on meta, boom"))
    # the main pass with the memory passes, in one worker
    monkeypatch.setattr("topoprof.model.inputs.traces.trace_models", lambda *a, **k: TraceFailure("on meta, boom"))
    result = CliRunner().invoke(main, ["model", *GPT2, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert "compute_model" not in doc["inputs"]
    assert "assumption" in doc["inputs"]["utilization"]["source"]  # the 3-52 % range's middle
    assert any("could not be priced (on meta, boom)" in w and "datasheet range stands in" in w for w in doc["warnings"])


@pytest.mark.slow
def test_a_users_model_predicted_for_a_gpu_is_traced_on_meta_and_never_run_here(model_runs):
    spec = os.path.join(USER_MODELS, "tied.py:build")
    doc = _json(model_runs, "--model", spec, "--gpu", "h100-sxm", "--world-size", "1", "--no-sweep")
    inputs = doc["inputs"]
    assert "model's own ops" in inputs["micro_batch_time_s"]["source"]
    assert inputs["compute_model"]["value"]["shape"] == "4x32"
    assert "backward FLOPs per tensor" in inputs["model"]["source"]  # the same pass orders the gradients
    assert "never runs it here" in inputs["model"]["source"]
    # a model that refuses to run on real data: a what-if reads it all the same
    doc = _json(model_runs, "--model", os.path.join(USER_MODELS, "meta.py:meta_only"), "--gpu", "h100-sxm",
                "--world-size", "1", "--no-sweep")
    assert "model's own ops" in doc["inputs"]["micro_batch_time_s"]["source"]


def test_a_users_model_is_planned_at_the_samples_its_example_batch_holds(model_runs):
    """tied.py:build takes no micro_batch and builds 4 sequences of 32 tokens: with no
    --micro-batch-size its micro-batch is those 4 samples, said in a note, and a step's samples
    count them; a micro-batch given is traced at that size, its batch resized to it."""
    base = ["--model", os.path.join(USER_MODELS, "tied.py:build"), "--gpu", "h100-sxm", "--world-size", "1",
            "--no-sweep"]
    doc = _json(model_runs, *base)
    assert doc["inputs"]["micro_batch_size"] == {"value": 4, "source": "the samples its example batch holds"}
    assert doc["inputs"]["compute_model"]["value"]["shape"] == "4x32"
    assert "micro-batch 4: the samples its example batch holds (no --micro-batch-size given)" in doc["warnings"]
    given = _json(model_runs, *base, "--micro-batch-size", "2")
    assert given["inputs"]["micro_batch_size"] == {"value": 2, "source": "given"}
    assert given["inputs"]["compute_model"]["value"]["shape"] == "2x32"
    assert not [w for w in given["warnings"] if "--micro-batch-size" in w]
    assert given["inputs"]["compute_model"]["value"]["flops"] == pytest.approx(
        doc["inputs"]["compute_model"]["value"]["flops"] / 2, rel=0.01)
    assert doc["strategies"]["single"]["samples_per_step"] == 2 * given["strategies"]["single"]["samples_per_step"]


def test_fsdp_wraps_the_blocks_a_users_checkpointing_finds(model_runs):
    """blocks.py:sequential holds its blocks in an nn.Sequential inside an nn.Sequential (tensors
    1.0.*, 1.1.*, ...), named as no preset's are: FSDP groups the block list that checkpointing
    finds in it, one group per block, where no --fsdp-unit is given."""
    doc = _json(model_runs, "--model", os.path.join(USER_MODELS, "blocks.py:sequential"), "--gpu", "h100-sxm",
                "--world-size", "2", "--link-bandwidth", "100", "--no-sweep")
    assert doc["inputs"]["fsdp_groups"]["value"]["grouping"] == "5 groups (each child of 1) + root"
    assert doc["strategies"]["fsdp_full_shard"]["step_time_s"] > 0
    # a block list it does not train is no FSDP unit: planned as before, never refused for an option not given;
    # its memory, whose blocks mark no backward of their own, from its parts
    frozen = _json(model_runs, "--model", os.path.join(USER_MODELS, "blocks.py:frozen_layers"), "--gpu", "h100-sxm",
                   "--world-size", "2", "--link-bandwidth", "100", "--no-sweep")
    assert frozen["inputs"]["fsdp_groups"]["value"] is None
    assert "no FSDP unit found" in frozen["inputs"]["fsdp_groups"]["source"]
    assert frozen["strategies"]["ddp_synced"]["step_time_s"] > 0 and frozen["strategies"]["single"]["memory"]


def test_time_here_times_a_what_if_here_and_never_takes_its_time_as_the_gpus():
    spec = os.path.join(USER_MODELS, "tied.py:build")
    proc = _cli("model", "--model", spec, "--gpu", "h100-sxm", "--world-size", "1", "--no-sweep", "--time-here",
                "--json")  # it times here: run anew
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "model's own ops" in doc["inputs"]["micro_batch_time_s"]["source"]
    (note,) = [w for w in doc["warnings"] if w.startswith("timed here (--time-here)")]
    assert "per micro-batch on cpu, this machine, not the h100-sxm predicted: not used" in note
    proc = _cli("model", "--preset", "gpt2", "--gpu", "h100-sxm", "--tokens", "1024", "--world-size", "1",
                "--time-here")
    assert proc.returncode == 2 and "--time-here times your --model" in proc.stderr


def test_a_users_model_that_cannot_run_on_meta_is_priced_from_the_datasheet_never_from_a_cpu_time(model_runs):
    args = ["--model", os.path.join(USER_MODELS, "meta.py:reads_a_value"), "--gpu", "h100-sxm", "--world-size", "2",
            "--link-bandwidth", "100", "--no-sweep"]
    doc = _json(model_runs, *args, "--tokens", "32")
    inputs = doc["inputs"]
    assert "measured" not in inputs["micro_batch_time_s"]["source"]
    assert inputs["micro_batch_time_range_s"]["source"].startswith("datasheet what-if")
    assert any("could not be priced (on meta, RuntimeError: Tensor.item()" in w and "datasheet range stands in" in w
               for w in doc["warnings"])
    # its parameters, read on meta, in reverse registration order
    assert "reverse registration order" in inputs["model"]["source"] and inputs["params"]["value"] == 144
    assert "micro-batch 1: its example batch was not read; give --micro-batch-size" in doc["warnings"]
    proc = _cli("model", *args)  # without --tokens the datasheet has nothing to price
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--tokens N" in proc.stderr


@pytest.mark.parametrize("name, says", [
    ("tied.py:wrong_shape", "returned Linear; expected (module, example_batch)"),
    ("meta.py:reads_a_value_to_build", "could not be built on the meta device"),
])
def test_a_what_if_of_a_model_it_cannot_read_on_meta_is_one_line_and_exit_2(name, says):
    proc = _cli("model", "--model", os.path.join(USER_MODELS, name), "--gpu", "h100-sxm", "--tokens", "32",
                "--world-size", "1")
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("topoprof: error: --model ") and says in first


@pytest.mark.slow
def test_a_70b_user_model_is_planned_here_without_building_it(model_runs):
    """Llama 2 70B (276 GB of fp32 weights, past this machine's memory) from a user's callable that
    refuses to build for real: the what-if traces it on meta only. How long it takes is
    tests/benchmarks/bench_plan_time.py's."""
    doc = _json(model_runs, "--model", os.path.join(USER_MODELS, "llama70b.py:build"), "--gpu", "h100-sxm",
                "--tokens", "4096", "--world-size", "8", "--link-bandwidth", "450", "--no-sweep")
    assert doc["inputs"]["params"]["value"] == 68_976_648_192
    assert doc["inputs"]["fsdp_groups"]["value"]["groups"] == 81
    assert "model's own ops" in doc["inputs"]["micro_batch_time_s"]["source"]


# ---- a GPU here: measured beats modelled, and the gap is shown (timing replaced) -------------

def _fake_timing(monkeypatch, seconds=0.05):
    asked = []

    def fake(preset, micro_batch, seq_len, device, precision="bf16", optimizer="adamw", image_size=None,
             ac="none", progress=None):
        asked.append((preset, micro_batch, seq_len))
        return MeasuredCompute(seconds, 0.66, 0.01, f"{preset}: measured on {device}", device_name=H100)

    for where in ("topoprof.model.inputs.gather", "topoprof.model.inputs.scan"):
        monkeypatch.setattr(f"{where}.measure_preset", fake)
    return asked


@pytest.mark.slow
def test_model_on_this_gpu_prints_the_modelled_range_beside_the_measured_time(monkeypatch):
    from click.testing import CliRunner

    from topoprof.cli import main

    for where in ("topoprof.model.inputs.gather", "topoprof.model.inputs.user_model"):
        monkeypatch.setattr(f"{where}.visible_gpus", lambda: [0])
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
    page = "\n".join(_predictions(read_scan_parts({"predictions": [pred]})))
    assert "measured 50.0 ms; modelled from its own ops" in page and "Compute model:" in page


def _one_h100():
    """A node of one H100, as the scan's topology holds it."""
    from topoprof.topology.build import Gpu, Topology

    return Topology((), (Gpu(0, H100, compute_capability=(9, 0), pcie_gen_max=5, pcie_width_max=16),), (), (), {})


def test_a_one_gpu_scan_checks_the_what_if_or_says_its_timing_failed(monkeypatch):
    """The one-GPU what-if (the scan's only GPU-only stage) carries the check of the method, and
    where timing on GPU0 fails it is a partial status in the summary, not a silent fallback."""
    from topoprof.scan.options import ScanOptions
    from topoprof.scan.pipeline import _what_ifs

    topology = _one_h100()
    opts = ScanOptions(backend="nccl", nproc=1, note="", preset="gpt2", tokens=1024)
    _fake_timing(monkeypatch)
    timed, status = _what_ifs(opts, topology)
    assert status.status == "ok" and not timed["timing_failed"]
    assert timed["compute_check"]["measured_s"] == 0.05 and len(timed["compute_check"]["modelled_s"]) == 3

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr("topoprof.model.inputs.scan.measure_preset", broken)
    fell_back, status = _what_ifs(opts, topology)
    assert fell_back["timing_failed"] and "compute_check" not in fell_back
    assert status.status == "partial" and "timing gpt2 on GPU0 failed (RuntimeError: CUDA error" in status.detail


def test_a_gpu_scan_prices_its_what_if_with_the_profile_it_measured(monkeypatch):
    """A scan on a GPU measures the GPU's quick profile first and prices its what-if compute with
    it, as that GPU; a profile that cannot be measured is a status, and the shipped ones price it."""
    from topoprof.errors import NothingMeasured
    from topoprof.scan import pipeline as job
    from topoprof.scan.options import ScanOptions

    doc = profile_doc(device=H100, gemm=GRID, host=HOST, memory=[(("add", 1 << 20), 4e11), (("add", 1 << 26), 3e12)],
                      sdpa=[((128, 64, True), 1e13), ((8192, 64, True), 5e14)])
    opts = ScanOptions(backend="nccl", nproc=1, note="", preset="gpt2", tokens=1024, device_profile=doc)
    _fake_timing(monkeypatch)
    timed, status = job._what_ifs(opts, _one_h100())
    check = timed["compute_check"]
    assert status.status == "ok" and f"on {H100} (bf16, eager, profile)" in check["basis"]
    monkeypatch.setattr("topoprof.scan.pipeline.measure_device_profile",
                        lambda *a, **k: (_ for _ in ()).throw(NothingMeasured("torch sees no CUDA device")))
    none, failed = job._device_profile(opts)
    assert none is None and failed.status != "ok" and "profiles shipped with topoprof" in failed.detail
    assert job._device_profile(ScanOptions(backend="gloo", nproc=2, note="")) == (None, None)


def test_the_profile_a_scan_priced_with_is_written_beside_its_report_or_with_it_elsewhere(tmp_path, monkeypatch):
    from topoprof.report import files

    report = {"kind": "scan", "mode": {"summary": "", "nproc": 1}}
    monkeypatch.setattr("topoprof.report.files.render_markdown", lambda parts: "")
    folder, why = files.save_report(dict(report), str(tmp_path / "out"), {"device-profile.json": "{}\n"})
    assert why is None and (tmp_path / "out" / "device-profile.json").read_text() == "{}\n"
    blocked = tmp_path / "file"
    blocked.write_text("")  # out_dir below a file: it goes to the temporary directory, the profile with it
    monkeypatch.setattr("topoprof.report.files.spare_folder", lambda: str(tmp_path / "spare"))
    folder, why = files.save_report(dict(report), str(blocked / "out"), {"device-profile.json": "{}\n"})
    assert why and folder == str(tmp_path / "spare") and (tmp_path / "spare" / "device-profile.json").exists()
