"""Model layouts: parameter totals against the published models, ready order, synthetic layout."""
import pytest

from topoprof.errors import InputError
from topoprof.model.presets import (PRESETS, Layout, TensorSpec, Use, bert_layout, get_preset,
                                    gpt2_layout, synthetic_layout)

# Totals of the Hugging Face models (sum of p.numel() over model.parameters()).
EXPECTED_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "bert-base": 109_482_240,  # bert-base-uncased BertModel, pooler included
    "llama-7b": 6_738_415_616,
    # GPT-3 XL (no published HF checkpoint): GPT-2's blocks at d 2048, 24 layers, 2048 positions,
    # counted by hand: 24 x (12 d^2 + 13 d) + 50257 d + 2048 d + 2 d
    "gpt3-xl": 24 * (12 * 2048 ** 2 + 13 * 2048) + 50257 * 2048 + 2048 * 2048 + 2 * 2048,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAMS))
def test_preset_param_totals(name):
    assert get_preset(name).params == EXPECTED_PARAMS[name]


def test_every_preset_is_checked():
    assert set(PRESETS) == set(EXPECTED_PARAMS)


def test_gpt2_hand_count():
    # wte 50257*768 + wpe 1024*768 + 12 layers * 7,087,872 + ln_f 2*768
    per_layer = (2 * 768 + 768 * 2304 + 2304 + 768 * 768 + 768 + 2 * 768
                 + 768 * 3072 + 3072 + 3072 * 768 + 768)
    assert per_layer == 7_087_872
    assert 50257 * 768 + 1024 * 768 + 12 * per_layer + 2 * 768 == 124_439_808


def test_unknown_preset_lists_valid_names():
    with pytest.raises(InputError) as err:
        get_preset("gpt3")
    message = str(err.value)
    assert "gpt3" in message
    for name in PRESETS:
        assert name in message


def test_preset_name_is_case_insensitive():
    assert get_preset(" GPT2 ").name == "gpt2"


def test_gpt2_tied_embedding_ready_last_lm_head_compute_first():
    layout = gpt2_layout()
    schedule = layout.ready_schedule()
    names = [layout.tensors[r.index].name for r in schedule]
    assert names[-1] == "transformer.wte.weight"
    assert schedule[-1].ready_fraction == 1.0
    # The LM head (tied wte, 50257 x 768) is the first backward op: nothing is ready before
    # its 4*V*d FLOPs per token are done; ln_f comes right after.
    lm_head = 4 * 50257 * 768
    assert names[:2] == ["transformer.ln_f.bias", "transformer.ln_f.weight"]
    assert schedule[0].ready_fraction == pytest.approx(lm_head / layout.backward_flops_per_token)
    assert 0.30 < schedule[0].ready_fraction < 0.32


def test_ready_fractions_non_decreasing_and_cover_all_tensors():
    for name in PRESETS:
        layout = get_preset(name)
        schedule = layout.ready_schedule()
        assert sorted(r.index for r in schedule) == list(range(len(layout.tensors)))
        fractions = [r.ready_fraction for r in schedule]
        assert fractions == sorted(fractions)
        assert fractions[-1] == 1.0


def test_llama_ready_order_follows_use_not_registration():
    # input_layernorm is registered after the MLP but used first in a decoder layer: its
    # gradient is ready after the layer's attention projections, not before them.
    layout = get_preset("llama-7b")
    names = [layout.tensors[r.index].name for r in layout.ready_schedule()]
    last = names.index("model.layers.31.input_layernorm.weight")
    assert last > names.index("model.layers.31.self_attn.q_proj.weight")
    assert names.index("model.layers.31.post_attention_layernorm.weight") < names.index(
        "model.layers.31.self_attn.o_proj.weight")


def test_train_flops_per_token_is_six_per_matmul_param():
    layout = synthetic_layout(1000)
    assert layout.train_flops_per_token == 6 * 1000
    # BERT: the word embedding (a lookup) costs nothing; the pooler sees 1/512 of the tokens.
    bert = bert_layout()
    matmul = 12 * (4 * 768 * 768 + 2 * 768 * 3072) + 768 * 768 / 512
    assert bert.train_flops_per_token == pytest.approx(6 * matmul)


def test_synthetic_layout_equal_chunks():
    layout = synthetic_layout(1003)
    assert layout.params == 1003
    assert [t.numel for t in layout.tensors][:4] == [11, 11, 11, 10]
    schedule = layout.ready_schedule()
    # uniform compute: chunk i of 100 is ready after (100 - i) / 100 of backward
    assert [r.index for r in schedule][:2] == [99, 98]
    assert schedule[0].ready_fraction == pytest.approx(10 / 1003)
    assert schedule[-1].index == 0 and schedule[-1].ready_fraction == 1.0


def test_synthetic_layout_small_and_invalid():
    assert len(synthetic_layout(7).tensors) == 7
    with pytest.raises(InputError, match="params must be >= 1, got 0"):
        synthetic_layout(0)


def test_layout_rejects_unused_tensor_and_no_compute():
    tensors = (TensorSpec("a", (4,)), TensorSpec("b", (4,)))
    with pytest.raises(InputError, match="without a use"):
        Layout("x", tensors, (Use((0,), 16.0),), "test")
    with pytest.raises(InputError, match="no matmul compute"):
        Layout("x", tensors, (Use((0, 1), 0.0),), "test")
