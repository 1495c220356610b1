"""Where a scan's compute per micro-batch comes from (the GPU timing itself is a `gpu` test; here
the measurement is replaced, and what the scan does with it is checked)."""
from __future__ import annotations

import pytest

from topoprof.measure.fit import Fit
from topoprof.model.compute.measured import MeasuredCompute
from topoprof.model.inputs import scan as scan_predictions
from topoprof.scan.options import ScanOptions
from topoprof.specs.messages import TimedPass, UserModelRecord

H100 = "NVIDIA H100 80GB HBM3"


def _fit():
    return Fit.from_dict({"collective": "all_reduce", "latency_us": 20.0, "bandwidth_gbps": 100.0, "r2": 1.0,
                          "max_rel_error": 0.0, "n_points": 3, "outliers": [], "latency_clamped": False})


@pytest.fixture
def timed(monkeypatch):
    """measure_preset replaced: records what it was asked, answers like the real one."""
    calls = []

    def fake(preset, micro_batch, seq_len, device, precision="bf16", optimizer="adamw", image_size=None, ac="none"):
        calls.append((preset, micro_batch, seq_len, device) + ((image_size,) if image_size else ()))
        scaled = (2, 4) if preset == "llama-7b" else None
        return MeasuredCompute(0.03, 0.65, 0.004, f"{preset}: measured on cuda:0, 10 repeats, median", scaled=scaled)

    for where in ("topoprof.model.inputs.gather", "topoprof.model.inputs.scan"):
        monkeypatch.setattr(f"{where}.measure_preset", fake)
    return calls


@pytest.mark.slow
def test_a_gpu_scan_times_the_default_sizes_as_real_architectures(timed):
    opts = ScanOptions(backend="nccl", nproc=8, note="")
    preds = scan_predictions.predictions(opts, _fit(), 8, None, None, H100)
    assert [p["label"] for p in preds] == ["125M params (gpt2)", "1.3B params (gpt3-xl)", "7B params (llama-7b)"]
    # 2048 tokens per micro-batch in whole sequences each preset can read
    assert timed == [("gpt2", 2, 1024, "cuda:0"), ("gpt3-xl", 1, 2048, "cuda:0"), ("llama-7b", 1, 2048, "cuda:0")]
    for p in preds:
        assert p["inputs"]["micro_batch_time_s"]["value"] == 0.03
        assert "measured on cuda:0" in p["compute_source"]
        assert "micro_batch_time_range_s" not in p["inputs"]  # measured: one number, not a what-if
    assert "timed at 2 and 4 blocks" in preds[2]["compute_source"]


def test_a_gpu_scan_times_the_named_preset(timed):
    opts = ScanOptions(backend="nccl", nproc=8, note="", preset="bert-base", tokens=1024, micro_batch_size=4)
    preds = scan_predictions.predictions(opts, _fit(), 8, None, None, H100)
    assert timed == [("bert-base", 4, 256, "cuda:0")]
    assert preds[0]["inputs"]["optimizer_time_s"]["value"] == 0.004


def test_a_gpu_scan_times_an_image_model_at_its_image_size(timed):
    opts = ScanOptions(backend="nccl", nproc=8, note="", preset="resnet50", image_size=160, micro_batch_size=32)
    (pred,) = scan_predictions.predictions(opts, _fit(), 8, None, None, H100)
    assert timed == [("resnet50", 32, None, "cuda:0", 160)]  # 32 images, no sequence
    assert pred["inputs"]["tokens_per_micro_batch"]["value"] == 32  # its FLOPs count images, not 2048 tokens
    assert pred["inputs"]["params"]["value"] == 25_557_032 and "160x160" in pred["inputs"]["model"]["source"]


@pytest.mark.parametrize("kwargs, text", [
    ({"preset": "gpt2", "image_size": 224}, "--image-size: gpt2 reads tokens, not images"),
    ({"params": "125M", "image_size": 224}, "--image-size applies to a vision preset"),
    ({"preset": "resnet50", "tokens": 2048}, "--tokens: resnet50 is an image model"),
    ({"preset": "resnet50", "image_size": 0}, "--image-size 0"),
])
def test_image_options_are_refused_before_anything_runs(kwargs, text):
    from topoprof.errors import InputError

    with pytest.raises(InputError, match=text):
        ScanOptions(backend="nccl", nproc=8, note="", **kwargs)


def test_cpu_ranks_keep_the_calibration(timed):
    opts = ScanOptions(backend="gloo", nproc=2, note="")
    preds = scan_predictions.predictions(opts, _fit(), 2, None, None, None)
    assert timed == [] and preds[0]["skipped"]  # nothing measured compute: the report says why


def test_a_timing_that_fails_falls_back_to_a_what_if_range(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory\nmore")

    monkeypatch.setattr("topoprof.model.inputs.scan.measure_preset", broken)
    opts = ScanOptions(backend="nccl", nproc=8, note="", params="125M")
    (pred,) = scan_predictions.predictions(opts, _fit(), 8, None, None, H100)
    assert pred["compute_source"].startswith("timing gpt2 on GPU0 failed (RuntimeError: CUDA error: out of memory)")
    assert "micro_batch_time_range_s" in pred["inputs"]  # the datasheet: a range, never one number


def test_a_preset_whose_training_state_cannot_fit_is_timed_scaled_at_once(monkeypatch):
    from topoprof.model.inputs import user_model

    assert user_model._cannot_fit("llama-7b", "adamw", 80 * 2**30)      # 6.74e9 x 16 B = 108 GB
    assert not user_model._cannot_fit("gpt2", "adamw", 80 * 2**30)
    assert not user_model._cannot_fit("llama-7b", "adamw", None)       # unknown: try, and scale on OOM
    depths = []

    def fake_measure(spec, device, precision, optimizer, kwargs, progress=None):
        depths.append(kwargs.get("n_layer"))
        blocks = kwargs.get("n_layer") or 32
        return UserModelRecord(spec, device, [], passes=[TimedPass(0.004 * blocks, 0.006 * blocks)] * 3,
                               optimizer_s=[0.001 * blocks] * 3)

    monkeypatch.setattr(user_model, "gpu_memory_bytes", lambda device: 80 * 2**30)
    monkeypatch.setattr("topoprof.model.inputs.user_model.measure_user_model", fake_measure)
    monkeypatch.setattr(user_model, "user_compute", lambda record: MeasuredCompute(
        record.passes[0].forward_s + record.passes[0].backward_s, 0.6, record.optimizer_s[0], record.spec))
    result = user_model.measure_preset("llama-7b", 1, 2048, "cuda:0")
    assert depths == [2, 4] and result.scaled == (2, 4)  # the whole 7B model was never built
    assert result.micro_batch_time_s == pytest.approx(0.32)  # 2 -> 4 blocks extended to 32
