"""The synthetic model (spec, layout, module) and the training rank worker on CPU/gloo ranks."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoprof.errors import InputError
from topoprof.measure.launch import JobSpec, launch_local, worker_result
from topoprof.model.ddp.buckets import ddp_buckets
from topoprof.specs.messages import (
    NumericsJob,
    NumericsResult,
    TrainingCalibration,
    TrainingJob,
    TrainingResult,
    fields_of,
)
from topoprof.workload.presets import PRESETS, VISION_PRESETS, get_preset
from topoprof.workload.synthetic import SyntheticSpec, check_supported, parse_config, spec_for_params, spec_for_preset

torch = pytest.importorskip("torch")
training = pytest.importorskip("topoprof.probes.ranks.training")

TINY = spec_for_params(50_000, seq_len=16)
K = 3
BUCKET_CAP_MB = 0.05  # ~52 KB: the ~200 KB of fp32 gradients of TINY form several buckets


def _config(mode: str, **over) -> dict:
    config = {"spec": dataclasses.asdict(TINY), "mode": mode, "micro_batch": 2, "accum": K,
              "steps": 3, "warmup_steps": 1, "seed": 7, "threads": 1,
              "bucket_cap_mb": BUCKET_CAP_MB}
    return {**config, **over}


def _launch(config: dict, nproc: int):
    """The run, and what rank 0 sent by its kind: each message's fields (a numerics report as the
    validate report shows it, a calibration's times beside its setup)."""
    numerics = config.get("mode") == "numerics"
    job = NumericsJob(**config) if numerics else TrainingJob(**config)
    result = launch_local(JobSpec("numerics" if numerics else "training", job, nproc, "gloo", timeout_s=120))
    msgs: dict[str, dict] = {}
    for kind in (TrainingResult, TrainingCalibration, NumericsResult):
        msg = worker_result(result, kind)
        if isinstance(msg, NumericsResult):
            msgs[kind.KIND] = msg.report()
        elif isinstance(msg, TrainingCalibration):
            msgs[kind.KIND] = {**msg.calibration, **fields_of(msg)}
        elif msg is not None:
            msgs[kind.KIND] = fields_of(msg)
    return result, msgs


# --- the synthetic spec and its layout -------------------------------------------------------

@pytest.mark.parametrize("spec", [TINY, SyntheticSpec(vocab=50, d_model=8, n_layers=2, d_ff=24,
                                                      seq_len=4)])
def test_layout_matches_the_torch_module(spec):
    layout = spec.layout()
    model = training.build_model(spec, seed=0)
    named = list(model.named_parameters())
    assert layout.params == spec.params == sum(p.numel() for _, p in named)
    assert [t.shape for t in layout.tensors] == [tuple(p.shape) for _, p in named]
    assert [t.name for t in layout.tensors] == [name for name, _ in named]


def test_layout_backward_flops_are_four_per_matmul_weight_element():
    d, v, ff, n = TINY.d_model, TINY.vocab, TINY.d_ff, TINY.n_layers
    matmul_weights = n * 2 * d * ff + d * v  # fc1, fc2 per layer and the head; not embed/norm/bias
    assert TINY.layout().backward_flops_per_token == 4 * matmul_weights
    # DDP readiness: the head's gradient first, the input embedding's last.
    schedule = TINY.layout().ready_schedule()
    assert TINY.layout().tensors[schedule[-1].index].name == "embed.weight"
    assert TINY.layout().tensors[schedule[0].index].name == "head.weight"


@pytest.mark.parametrize("params", [12_000, 50_000, 100_000, 1_000_000, 25_000_000, 124_000_000,
                                    1_300_000_000, 7_000_000_000])
def test_spec_for_params_lands_within_5_percent(params):
    spec = spec_for_params(params)
    assert abs(spec.params - params) <= 0.05 * params
    assert spec.seq_len == 64
    assert 0.5 * spec.d_model <= spec.vocab / 8 <= 2 * spec.d_model


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=12_000, max_value=20_000_000_000), st.integers(1, 4096))
def test_spec_for_params_any_size(params, seq_len):
    spec = spec_for_params(params, seq_len)
    assert abs(spec.params - params) <= 0.05 * params
    assert spec.layout().params == spec.params and spec.seq_len == seq_len
    assert spec.n_layers >= 1 and spec.d_ff >= 1


def test_spec_for_params_rejects_too_few():
    with pytest.raises(InputError):
        spec_for_params(100)


@pytest.mark.parametrize("name", sorted(set(PRESETS) - set(VISION_PRESETS)))
@pytest.mark.parametrize("scale", [0.01, 0.1])
def test_spec_for_preset_scales_params_and_keeps_embedding_share(name, scale):
    preset = get_preset(name)
    spec = spec_for_preset(name, scale, seq_len=32)
    assert abs(spec.params - scale * preset.params) <= 0.05 * scale * preset.params
    share = preset.tensors[0].numel / preset.params
    assert spec.embedding_share == pytest.approx(share, rel=0.05)
    assert spec.d_model < preset.tensors[0].shape[1] and spec.seq_len == 32


@pytest.mark.parametrize("name", VISION_PRESETS)
def test_spec_for_preset_refuses_an_image_model(name):
    with pytest.raises(InputError, match=f"--preset {name}: an image model"):
        spec_for_preset(name, 0.1)


def test_spec_for_preset_rejects_bad_scale():
    for bad in (0, -1, float("nan")):
        with pytest.raises(InputError):
            spec_for_preset("gpt2", bad)


# --- data and config (in process) -------------------------------------------------------------

def test_micro_batches_are_distinct_deterministic_slices_of_one_stream():
    cfg = parse_config(_config("ddp_synced"))
    seen = {}
    for step in range(2):
        for rank in range(2):
            batches = training.step_batches(cfg, step, rank, 2, "cpu")
            assert len(batches) == K and batches[0].shape == (2, TINY.seq_len + 1)
            for j, b in enumerate(batches):
                seen[(step, rank, j)] = b
                assert torch.equal(b, training.step_batches(cfg, step, rank, 2, "cpu")[j])
    rows = [tuple(row.tolist()) for b in seen.values() for row in b]
    assert len(set(rows)) == len(rows) == 2 * 2 * K * 2
    # Sample i is the same however the stream is cut into micro-batches.
    start = training.first_sample(1, 1, 2, 2, K, 2)
    assert torch.equal(training.stream_samples(TINY, 7, start, 2), seen[(1, 1, 2)])
    assert int(max(b.max() for b in seen.values())) < TINY.vocab


def test_config_refusals_are_clear():
    def check(config, device="cpu", world=1, gpus=0):
        check_supported(parse_config(config), device, world, gpus)

    with pytest.raises(InputError, match="needs CUDA GPUs"):
        check(_config("dp"))
    with pytest.raises(InputError, match="amp 'bf16' is for GPUs"):
        check(_config("ddp_synced", amp="bf16"))
    with pytest.raises(InputError, match="launch it with 1 rank"):
        check(_config("dp"), world=2, gpus=2)
    check(_config("single"), world=2)  # every rank trains its own copy: the calibration's way
    with pytest.raises(InputError, match="mode must be one of"):
        parse_config(_config("fsdp"))
    with pytest.raises(InputError, match="accum"):
        parse_config(_config("single", accum=0))
    with pytest.raises(InputError, match="spec must be a dict"):
        parse_config(_config("single", spec={"vocab": 10}))
    with pytest.raises(InputError, match="steps"):
        parse_config({k: v for k, v in _config("single").items() if k != "steps"})
    check(_config("ddp_synced", amp="bf16"), device="cuda:0", world=2, gpus=2)  # fine on GPUs


# --- ranks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, calls_per_bucket", [
    ("ddp_synced", K), ("ddp_no_sync", 1), ("ddp_no_sync_backward_only", K)])
def test_ddp_mode_result_and_allreduce_count(mode, calls_per_bucket):
    result, msgs = _launch(_config(mode, count_comm_hook_calls=True), 2)
    assert result.failure is None, result.failure.describe()
    res = msgs["result"]
    assert res["mode"] == mode and res["world_size"] == 2 and res["accum"] == K
    assert res["micro_batch"] == 2 and res["params"] == TINY.params
    assert res["combine"] == "max over ranks, median over steps"
    assert len(res["step_times_s"]) == 3 and all(len(r) == 2 for r in res["rank_step_times_s"])
    assert res["step_times_s"] == [max(r) for r in res["rank_step_times_s"]]
    assert res["step_time_s"] == sorted(res["step_times_s"])[1] > 0
    # The hook runs once per bucket all-reduce; the buckets are the ones topoprof models.
    buckets = [b.numel for b in ddp_buckets(TINY.layout(), 4, BUCKET_CAP_MB)]
    assert res["ddp_bucket_numels"] == buckets and len(buckets) > 1
    assert res["comm_hook_calls_per_step"] == [calls_per_bucket * len(buckets)] * 3


def test_single_emits_calibration_and_result():
    result, msgs = _launch(_config("single", optimizer="sgd"), 1)
    assert result.failure is None, result.failure.describe()
    cal = msgs["calibration"]
    for key in ("forward_s", "backward_s", "micro_batch_time_s", "optimizer_time_s"):
        assert cal[key] > 0
    assert cal["micro_batch_time_s"] == pytest.approx(cal["forward_s"] + cal["backward_s"])
    assert 0 < cal["backward_fraction"] < 1 and cal["threads"] == 1
    assert msgs["result"]["mode"] == "single" and msgs["result"]["world_size"] == 1


def test_numerics_ddp_modes_match_single_process_accumulation():
    result, msgs = _launch(_config("numerics"), 2)
    assert result.failure is None, result.failure.describe()
    num = msgs["numerics"]
    assert num["world_size"] == 2 and num["accum"] == K and num["dtype"] == "float64"
    for mode in ("ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only"):
        assert num[mode]["allclose"] is True
        assert num[mode]["max_abs_diff_vs_single"] < 1e-12
    # The check has teeth: a reference that forgets the 1/K is far outside the tolerance.
    control = num["control_single_not_divided_by_k"]
    assert control["allclose"] is False and control["max_abs_diff_vs_single"] > 1e-4


def test_dp_refused_on_cpu_with_the_reason():
    result, _ = _launch(_config("dp"), 1)
    assert result.failure is not None and result.failure.rank == 0
    assert "needs CUDA GPUs" in result.failure.describe()
