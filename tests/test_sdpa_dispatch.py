"""torch's CUDA SDPA backend choice as `topoprof.trace.sdpa_dispatch` restates it: each call form
against the kernel its rule names (sdp_utils.cpp's checks, per torch version and architecture)."""
import pytest

from topoprof.trace.sdpa_dispatch import (
    CUDNN,
    EFFICIENT,
    FLASH,
    MATH,
    GpuArch,
    SdpaCall,
    SdpaConfig,
    choose_backend,
    hf_sdpa_call,
    mha_training_sdpa_call,
    priority_order,
    saved_for_backward,
)

A100, A10, H100, T4 = GpuArch(8, 0), GpuArch(8, 6), GpuArch(9, 0), GpuArch(7, 5)
B200, RTX5090 = GpuArch(10, 0), GpuArch(12, 0)
ALL = [(2, m) for m in range(6, 16)]


def call(**kw):
    base = dict(batch=4, q_heads=16, kv_heads=16, q_len=1024, kv_len=1024, head_dim=64, dtype="bf16")
    base.update(kw)
    return SdpaCall(**base)


@pytest.mark.parametrize("tv", ALL)
def test_plain_bf16_a100_is_flash(tv):
    assert choose_backend(call(), A100, tv).backend == FLASH


@pytest.mark.parametrize("tv", ALL)
def test_is_causal_square_a100_flash(tv):
    assert choose_backend(call(is_causal=True), A100, tv).backend == FLASH


def test_is_causal_non_square_refuses_flash():
    ch = choose_backend(call(is_causal=True, q_len=128, kv_len=1024), A100, (2, 13))
    assert ch.backend == EFFICIENT
    assert "is_causal flag when seqlen_q != seqlen_k" in ch.refused[FLASH]


@pytest.mark.parametrize("tv", ALL)
@pytest.mark.parametrize("mask", ["bool", "float"])
def test_mask_refuses_flash_goes_efficient_on_a100(tv, mask):
    ch = choose_backend(call(mask=mask), A100, tv)
    assert ch.backend == EFFICIENT
    assert ch.refused[FLASH] == "Flash Attention does not support non-null attn_mask."


@pytest.mark.parametrize("tv", ALL)
def test_fp32_goes_efficient(tv):
    ch = choose_backend(call(dtype="fp32"), A100, tv)
    assert ch.backend == EFFICIENT
    assert "Expected query, key and value to all be of dtype" in ch.refused[FLASH]


def test_fp32_head_dim_alignment_sm80_is_4_and_sm75_is_1():
    assert choose_backend(call(dtype="fp32", head_dim=36), A100, (2, 13)).backend == EFFICIENT
    assert choose_backend(call(dtype="fp32", head_dim=34), A100, (2, 13)).backend == MATH
    assert choose_backend(call(dtype="fp32", head_dim=34), T4, (2, 13)).backend == EFFICIENT


@pytest.mark.parametrize("tv", ALL)
def test_sm75_never_flash(tv):
    ch = choose_backend(call(dtype="fp16"), T4, tv)
    assert ch.backend == EFFICIENT
    assert "Flash attention only supports gpu architectures in the range [sm80" in ch.refused[FLASH]


def test_sm75_bf16_is_math():
    ch = choose_backend(call(dtype="bf16"), T4, (2, 13))
    assert ch.backend == MATH


@pytest.mark.parametrize("tv", ALL)
def test_head_dim_96_flash(tv):
    assert choose_backend(call(head_dim=96), A100, tv).backend == FLASH


def test_head_dim_not_multiple_of_8_dense_flash_pads():
    ch = choose_backend(call(head_dim=36), A100, (2, 13))
    assert ch.backend == FLASH and any("padded to head_dim 40" in n for n in ch.notes)


@pytest.mark.parametrize("tv", ALL)
def test_head_dim_256_training(tv):
    # sm80: flash allowed up to 256
    assert choose_backend(call(head_dim=256), A100, tv).backend == FLASH
    # sm86 training, head_dim 256, no dropout: allowed (> 224 and no dropout)
    assert choose_backend(call(head_dim=256), A10, tv).backend == FLASH
    # sm86 training, head_dim 256 with dropout -> refused -> efficient
    ch = choose_backend(call(head_dim=256, dropout_p=0.1), A10, tv)
    assert ch.backend == EFFICIENT and "head_dim ∈ (192, 224]" in ch.refused[FLASH]
    # sm86 training, head_dim 200 -> refused; inference -> flash
    assert choose_backend(call(head_dim=200), A10, tv).backend == EFFICIENT
    assert choose_backend(call(head_dim=200, requires_grad=False), A10, tv).backend == FLASH


def test_head_dim_over_256_refuses_flash():
    ch = choose_backend(call(head_dim=320), A100, (2, 13))
    assert ch.backend == EFFICIENT
    assert "less than or equal to 256" in ch.refused[FLASH]


def test_sm120_rule_from_27():
    # 2.6: sm120 outside [sm80, sm90] and [sm50, sm90] -> math
    assert choose_backend(call(head_dim=64), RTX5090, (2, 6)).backend == MATH
    assert choose_backend(call(head_dim=64), RTX5090, (2, 7)).backend == FLASH
    assert choose_backend(call(head_dim=200), RTX5090, (2, 7)).backend == EFFICIENT


@pytest.mark.parametrize("tv", ALL)
def test_enable_gqa_flash(tv):
    ch = choose_backend(call(kv_heads=4, enable_gqa=True), A100, tv)
    assert ch.backend == FLASH


@pytest.mark.parametrize("tv", ALL)
def test_enable_gqa_with_mask(tv):
    ch = choose_backend(call(kv_heads=4, enable_gqa=True, mask="bool"), A100, tv)
    if tv >= (2, 14):
        assert ch.backend == EFFICIENT
    else:
        assert ch.backend == MATH
        assert "same num_heads" in ch.refused[EFFICIENT]
        assert any("repeat_interleave" in n for n in ch.notes)


def test_gqa_without_enable_flag_is_math():
    ch = choose_backend(call(kv_heads=4), A100, (2, 13))
    assert ch.backend == MATH


def test_priority_cudnn_h100_by_version():
    assert priority_order(H100, (2, 6)) == [FLASH, EFFICIENT, MATH, CUDNN]
    assert priority_order(H100, (2, 8)) == [FLASH, EFFICIENT, MATH, CUDNN]
    assert priority_order(H100, (2, 9))[0] == CUDNN
    assert priority_order(H100, (2, 10))[0] == FLASH      # wheel cuDNN 9.10.2 <= 9.15
    assert priority_order(H100, (2, 10), SdpaConfig(cudnn_version=91900))[0] == CUDNN
    for tv in [(2, 11), (2, 12), (2, 13), (2, 14), (2, 15)]:
        assert priority_order(H100, tv)[0] == CUDNN
        assert priority_order(B200, tv)[0] == CUDNN
        assert priority_order(A100, tv)[0] == FLASH
        assert priority_order(H100, tv, SdpaConfig(env_cudnn_deprioritized=True))[0] == FLASH


def test_sm90_vs_sm80_plain_call():
    assert choose_backend(call(), H100, (2, 13)).backend == CUDNN
    assert choose_backend(call(), A100, (2, 13)).backend == FLASH
    assert choose_backend(call(), H100, (2, 8)).backend == FLASH
    assert choose_backend(call(), H100, (2, 9)).backend == CUDNN


def test_cudnn_refusals_on_h100():
    # head dim 256 on 2.13 (B rule, cudnn 9.20 >= 9.10, sm90.0) -> cudnn ok
    assert choose_backend(call(head_dim=256), H100, (2, 13)).backend == CUDNN
    # 2.14 'main' rule without frontend d256 -> limit 128 -> flash
    ch = choose_backend(call(head_dim=256), H100, (2, 14))
    assert ch.backend == FLASH and ch.refused[CUDNN] == "head_dim should be no more than 128"
    # fp32 -> cudnn refused on dtype -> flash refused -> efficient
    assert choose_backend(call(dtype="fp32"), H100, (2, 13)).backend == EFFICIENT
    # dropout not multiple of 1/16 (2.12+)
    ch = choose_backend(call(dropout_p=0.1), H100, (2, 13))
    assert ch.backend == FLASH and "1/16" in ch.refused[CUDNN]
    assert choose_backend(call(dropout_p=0.125), H100, (2, 13)).backend == CUDNN
    # kv len 1
    assert choose_backend(call(kv_len=1, q_len=1), H100, (2, 13)).backend == FLASH
    # deterministic
    assert choose_backend(call(), H100, (2, 13), SdpaConfig(deterministic=True)).backend == FLASH


def test_cudnn_accepts_masks_and_gqa_on_h100():
    assert choose_backend(call(mask="bool"), H100, (2, 13)).backend == CUDNN
    assert choose_backend(call(mask="float", mask_shape=(4, 16, 1024, 1024)), H100, (2, 13)).backend == CUDNN
    ch = choose_backend(call(mask="float", mask_shape=(64, 1024, 1024)), H100, (2, 13))
    assert ch.backend == EFFICIENT and "attn mask shapes" in ch.refused[CUDNN]
    assert choose_backend(call(kv_heads=4, enable_gqa=True, mask="bool"), H100, (2, 13)).backend == CUDNN


def test_saved_for_backward_shapes():
    c = call(head_dim=64)
    fl = dict((n, (s, d)) for n, s, d in saved_for_backward(FLASH, c, (2, 13)))
    assert fl["logsumexp"] == ((4, 16, 1024), "float32")
    assert fl["rng_state"] == ((2,), "uint64")
    fl26 = dict((n, (s, d)) for n, s, d in saved_for_backward(FLASH, c, (2, 6)))
    assert "philox_seed" in fl26
    ef = dict((n, (s, d)) for n, s, d in saved_for_backward(EFFICIENT, call(q_len=1000, kv_len=1000), (2, 13)))
    assert ef["logsumexp"] == ((4, 16, 1024), "float32")
    cu = dict((n, (s, d)) for n, s, d in saved_for_backward(CUDNN, c, (2, 13)))
    assert cu["logsumexp"] == ((4, 16, 1024, 1), "float32")
    m = dict((n, (s, d)) for n, s, d in saved_for_backward(MATH, call(dropout_p=0.1), (2, 13)))
    assert m["softmax_out"] == ((4, 16, 1024, 1024), "float32")
    assert m["dropout_mask"] == ((4, 16, 1024, 1024), "bool")
    mg = dict((n, (s, d)) for n, s, d in saved_for_backward(MATH, call(kv_heads=4, enable_gqa=True), (2, 13)))
    assert mg["value_repeated"][0] == (4, 16, 1024, 64)


@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_training_no_mask(batch_first):
    r = mha_training_sdpa_call(8, 512, 1024, 16, batch_first=batch_first)
    assert r.uses_sdpa and r.call.mask is None and not r.call.is_causal
    assert choose_backend(r.call, A100, (2, 13)).backend == FLASH


def test_mha_training_causal_mask_without_hint_goes_efficient():
    r = mha_training_sdpa_call(8, 512, 1024, 16, attn_mask="bool")
    assert r.call.mask == "float" and r.call.mshape == (1, 1, 512, 512)
    assert choose_backend(r.call, A100, (2, 13)).backend == EFFICIENT


def test_mha_training_causal_hint_drops_mask():
    r = mha_training_sdpa_call(8, 512, 1024, 16, attn_mask="float", is_causal=True)
    assert r.call.mask is None and r.call.is_causal
    assert choose_backend(r.call, A100, (2, 13)).backend == FLASH


def test_mha_training_kpm_merges_and_clears_causal():
    r = mha_training_sdpa_call(8, 512, 1024, 16, attn_mask="bool", is_causal=True, key_padding_mask=True)
    assert r.call.mask == "float" and r.call.mshape == (8, 16, 512, 512) and not r.call.is_causal
    r2 = mha_training_sdpa_call(8, 512, 1024, 16, key_padding_mask=True)
    assert r2.call.mshape == (8, 16, 1, 512)
    assert choose_backend(r2.call, A100, (2, 13)).backend == EFFICIENT


def test_mha_need_weights_true_no_sdpa_and_causal_hint_needs_mask():
    assert not mha_training_sdpa_call(8, 512, 1024, 16, need_weights=True).uses_sdpa
    with pytest.raises(RuntimeError):
        mha_training_sdpa_call(8, 512, 1024, 16, is_causal=True)


def test_hf_causal_no_padding():
    c = hf_sdpa_call(2, 2048, 32, 8, 128)
    assert c.mask is None and c.is_causal and c.enable_gqa
    assert choose_backend(c, A100, (2, 13)).backend == FLASH
    assert choose_backend(c, H100, (2, 13)).backend == CUDNN


def test_hf_causal_with_padding_repeats_kv_and_uses_mask():
    c = hf_sdpa_call(2, 2048, 32, 8, 128, padding=True)
    assert c.mask == "bool" and not c.is_causal and c.kv_heads == 32 and not c.enable_gqa
    assert choose_backend(c, A100, (2, 13)).backend == EFFICIENT


def test_hf_sliding_window_forces_mask():
    c = hf_sdpa_call(2, 4096, 32, 32, 128, sliding_window=1024)
    assert c.mask == "bool" and not c.is_causal
