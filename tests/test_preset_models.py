"""The presets as torch modules: the same tensors, in the same order, as the layouts the model
predicts with (built on the meta device: no memory, no time), and a one-block CPU run that
trains every parameter."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from topoprof.workload.presets import PRESETS, get_preset  # noqa: E402
from topoprof.zoo.llama import LLAMA_CONFIGS, swiglu_hidden  # noqa: E402
from topoprof.zoo.preset_modules import DEFAULT_SEQ_LEN, PRESET_MODULES, build  # noqa: E402


def test_every_preset_of_the_layout_table_is_a_module():
    assert set(PRESETS) <= set(PRESET_MODULES)


@pytest.mark.parametrize("preset", sorted(PRESET_MODULES))
def test_module_has_the_layouts_tensors_in_order(preset):
    with torch.device("meta"):
        module, _, _ = build(preset, micro_batch=1, seq_len=8)
    ours = [(name, tuple(p.shape)) for name, p in module.named_parameters()]
    layout = [(t.name, t.shape) for t in get_preset(preset).tensors]
    assert ours == layout


# llama-7b's 4096-wide embedding and head alone take half a minute on two cores: its blocks are
# checked by the meta-device test above and its training on a GPU (tests/test_gpu.py)
@pytest.mark.parametrize("preset", ["bert-base", "gpt2"])
def test_one_block_trains_on_cpu(preset):
    from topoprof.measure.user_model import measure_user_model

    record = measure_user_model("topoprof.zoo.preset_modules:build", "cpu", 1,
                                kwargs={"preset": preset, "micro_batch": 1, "seq_len": 16, "n_layer": 1})
    assert record.passes[0].backward_s > 0
    trainable = [p for p in record.params if p.requires_grad]
    assert len({i for i, _ in record.ready}) == len(trainable)   # every parameter got its gradient


# Parameters of the published models: Meta's and Hugging Face's model cards (Llama 3.1 8B
# 8,030,261,248), and the sum over each config.json's tensors, which these equal.
PUBLISHED_PARAMS = {"llama-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
                    "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496}


@pytest.mark.parametrize("preset", sorted(PUBLISHED_PARAMS))
def test_the_llama_presets_have_their_published_parameters_and_build_in_seconds(preset):
    import time

    start = time.perf_counter()
    with torch.device("meta"):
        module, tokens, _ = build(preset, micro_batch=1)
    seconds = time.perf_counter() - start
    assert sum(p.numel() for p in module.parameters()) == PUBLISHED_PARAMS[preset]
    assert tokens.shape == (1, DEFAULT_SEQ_LEN[preset]) and seconds < 30
    config = LLAMA_CONFIGS[preset]
    layer = module.model.layers[0]
    head_dim = config.hidden // config.heads
    assert layer.self_attn.k_proj.weight.shape == (config.kv_heads * head_dim, config.hidden)  # GQA
    assert module.lm_head.weight is not module.model.embed_tokens.weight  # untied
    assert layer.input_layernorm.eps == config.norm_eps
    assert module.model.rotary_emb.inv_freq.shape == (head_dim // 2,)  # a buffer, not a parameter


def test_the_sequence_defaults_are_the_releases():
    assert {p: DEFAULT_SEQ_LEN[p] for p in ("llama3-8b", "llama3-70b", "llama2-13b", "llama2-70b")} == \
        {"llama3-8b": 8192, "llama3-70b": 8192, "llama2-13b": 4096, "llama2-70b": 4096}
    assert {LLAMA_CONFIGS[p].vocab_size for p in ("llama3-8b", "llama3-70b")} == {128256}
    assert {LLAMA_CONFIGS[p].vocab_size for p in ("llama2-13b", "llama2-70b", "llama-7b")} == {32000}


@pytest.mark.parametrize("dim, multiple_of, multiplier, hidden", [
    (4096, 256, None, 11008),   # LLaMA 7B / Llama 2 7B params.json
    (5120, 256, None, 13824),   # Llama 2 13B
    (8192, 4096, 1.3, 28672),   # Llama 2 70B, Llama 3 70B
    (4096, 1024, 1.3, 14336),   # Llama 3 8B
])
def test_the_feed_forward_width_is_metas_rule_from_params_json(dim, multiple_of, multiplier, hidden):
    assert swiglu_hidden(dim, multiple_of, multiplier) == hidden
    assert hidden in {c.intermediate for c in LLAMA_CONFIGS.values() if c.hidden == dim}


def test_a_smaller_model_of_the_same_design_and_bad_sizes():
    with torch.device("meta"):
        module, tokens, _ = build("llama3-8b", micro_batch=2, seq_len=16, n_layer=1,
                                  sizes={"hidden": 128, "heads": 32, "kv_heads": 8, "intermediate": 448,
                                         "vocab_size": 512})
    assert module.model.layers[0].self_attn.k_proj.weight.shape == (32, 128) and tokens.shape == (2, 16)
    with pytest.raises(ValueError, match=r"sizes \['width'\] are not arguments of Llama"):
        build("llama3-8b", sizes={"width": 3})
    with pytest.raises(ValueError, match=r"heads\(32\) % kv_heads\(5\)"):
        build("llama3-8b", n_layer=1, sizes={"hidden": 128, "kv_heads": 5, "vocab_size": 8})
