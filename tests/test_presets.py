"""Model layouts: parameter totals against the published models, ready order, synthetic layout."""
import pytest

from topoprof.errors import InputError
from topoprof.workload.layout import Layout, TensorSpec, Use
from topoprof.workload.presets import (
    PRESETS,
    VISION_PRESETS,
    bert_layout,
    get_preset,
    gpt2_layout,
    is_vision,
    synthetic_layout,
)

# Totals of the Hugging Face models (sum of p.numel() over model.parameters()).
EXPECTED_PARAMS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "bert-base": 109_482_240,  # bert-base-uncased BertModel, pooler included
    "llama-7b": 6_738_415_616,
    # Meta's models as Hugging Face counts them (LlamaForCausalLM, lm_head untied)
    "llama3-8b": 8_030_261_248,     # Llama 3.1 8B
    "llama3-70b": 70_553_706_496,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    # GPT-3 XL (no published HF checkpoint): GPT-2's blocks at d 2048, 24 layers, 2048 positions,
    # counted by hand: 24 x (12 d^2 + 13 d) + 50257 d + 2048 d + 2 d
    "gpt3-xl": 24 * (12 * 2048 ** 2 + 13 * 2048) + 50257 * 2048 + 2048 * 2048 + 2 * 2048,
    # torchvision's models (sum of p.numel() over torchvision.models.<name>().parameters())
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnext50_32x4d": 25_028_904,
    "resnext101_32x8d": 88_791_336,
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


# --- vision presets (topoprof.workload.vision) ---------------------------------------------------

def _conv_forward(layout, name):
    """A conv's forward FLOPs per image, from its use in the layout."""
    index = [t.name for t in layout.tensors].index(name)
    (use,) = [u for u in layout.uses if u.tensors == (index,)]
    return use


@pytest.mark.parametrize("name", VISION_PRESETS)
@pytest.mark.parametrize("image_size", [224, 160, 97, 32])
def test_vision_params_do_not_depend_on_image_size(name, image_size):
    layout = get_preset(name, image_size=image_size)
    assert layout.params == EXPECTED_PARAMS[name] and layout.unit == "image"


def test_vision_presets_are_the_architectures_vision_builds():
    from topoprof.workload.vision import RESNETS

    assert set(VISION_PRESETS) == set(RESNETS) and set(VISION_PRESETS) <= set(PRESETS)


def test_vision_default_image_size_is_224_and_text_presets_count_tokens():
    assert get_preset("resnet50") == get_preset("resnet50", image_size=224)
    assert all(get_preset(n).unit == "token" for n in PRESETS if not is_vision(n))
    assert is_vision(" ResNet50 ") and not is_vision("gpt2") and not is_vision(None)


def test_resnet50_names_in_torchvision_order():
    names = [t.name for t in get_preset("resnet50").tensors]
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert names[3:13] == ["layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
                           "layer1.0.conv2.weight", "layer1.0.bn2.weight", "layer1.0.bn2.bias",
                           "layer1.0.conv3.weight", "layer1.0.bn3.weight", "layer1.0.bn3.bias",
                           "layer1.0.downsample.0.weight"]
    assert names[-2:] == ["fc.weight", "fc.bias"]
    # one downsample per stage, in its first block only (layer1's for the width 64 -> 256)
    assert [n for n in names if n.endswith("downsample.0.weight")] == [
        f"layer{i}.0.downsample.0.weight" for i in (1, 2, 3, 4)]
    # 1 + 16 blocks x 3 convs + 4 downsamples = 53 convs, each followed by its BN; then fc
    assert len(names) == 53 * 3 + 2


def test_resnext_grouped_conv_shape():
    shapes = {t.name: t.shape for t in get_preset("resnext50_32x4d").tensors}
    # width = int(64 * 4 / 64) * 32 = 128 in layer1; each of 32 groups sees 128 / 32 = 4 channels
    assert shapes["layer1.0.conv2.weight"] == (128, 4, 3, 3)
    assert shapes["layer4.2.conv2.weight"] == (1024, 32, 3, 3)
    wide = {t.name: t.shape for t in get_preset("resnext101_32x8d").tensors}
    assert wide["layer1.0.conv1.weight"] == (256, 64, 1, 1)  # width int(64 * 8 / 64) * 32 = 256


@pytest.mark.parametrize("image_size, spatial", [(224, [112, 56, 28, 14, 7]), (160, [80, 40, 20, 10, 5]),
                                                 (97, [49, 25, 13, 7, 4]), (32, [16, 8, 4, 2, 1])])
def test_resnet50_conv_flops_follow_torch_output_sizes(image_size, spatial):
    """Hout = floor((H + 2p - k) / s) + 1 (nn.Conv2d, nn.MaxPool2d): stem, then stage 1..4."""
    layout = get_preset("resnet50", image_size=image_size)
    stem, s1, s2, s3, s4 = spatial
    stem_use = _conv_forward(layout, "conv1.weight")
    assert stem_use.forward_flops_per_token == 2 * 3 * 49 * 64 * stem * stem
    assert stem_use.backward_flops_per_token == stem_use.forward_flops_per_token  # no input gradient
    for name, cin, cout, k, out in [("layer1.0.conv2.weight", 64, 64, 3, s1),
                                    ("layer2.0.conv2.weight", 128, 128, 3, s2),   # the stride is on the 3x3
                                    ("layer2.0.conv1.weight", 256, 128, 1, s1),   # before it: stage 1's size
                                    ("layer2.0.downsample.0.weight", 256, 512, 1, s2),
                                    ("layer3.5.conv3.weight", 256, 1024, 1, s3),
                                    ("layer4.0.conv2.weight", 512, 512, 3, s4)]:
        use = _conv_forward(layout, name)
        assert use.forward_flops_per_token == 2 * cin * k * k * cout * out * out, name
        assert use.backward_flops_per_token == 2 * use.forward_flops_per_token, name
    fc = [u for u in layout.uses if layout.tensors[u.tensors[0]].name == "fc.weight"][0]
    assert fc.backward_flops_per_token == 4 * 2048 * 1000 and fc.forward_flops_per_token == 2 * 2048 * 1000


def test_resnet50_at_224_is_the_published_4_1_gmacs():
    # 4.09 GMACs per 224x224 image (torchvision's weights table, "GFLOPS 4.09"; He et al. 2016
    # Table 1 gives 3.8e9 for v1, whose stride sits on the first 1x1)
    assert get_preset("resnet50").forward_flops_per_token / 2 == pytest.approx(4.09e9, rel=2e-3)


@pytest.mark.parametrize("name", VISION_PRESETS)
def test_vision_train_flops_are_forward_plus_backward(name):
    layout = get_preset(name, image_size=160)
    stem = _conv_forward(layout, "conv1.weight").forward_flops_per_token
    forward, backward = layout.forward_flops_per_token, layout.backward_flops_per_token
    assert backward == 2 * forward - stem  # every conv 2x, the stem 1x, fc 2x
    assert layout.train_flops_per_token == pytest.approx(forward + backward, rel=1e-12)
    # Kaplan's backward = 2x forward, the default backward share 2/3, is within 1 % of it
    assert backward / (forward + backward) == pytest.approx(2 / 3, rel=0.01)


def test_vision_ready_order_ends_with_the_stem():
    layout = get_preset("resnet50")
    schedule = layout.ready_schedule()
    names = [layout.tensors[r.index].name for r in schedule]
    assert names[:2] == ["fc.bias", "fc.weight"] and names[-3:] == ["bn1.bias", "bn1.weight", "conv1.weight"]
    assert schedule[-1].ready_fraction == 1.0


@pytest.mark.parametrize("bad", [0, -3, 22.5, True])
def test_vision_image_size_must_be_a_positive_whole_number(bad):
    with pytest.raises(InputError, match="--image-size"):
        get_preset("resnet50", image_size=bad)


@pytest.mark.parametrize("name", ["gpt2", "bert-base"])
def test_image_size_on_a_text_preset_is_refused(name):
    with pytest.raises(InputError, match=f"--image-size: {name} reads tokens, not images"):
        get_preset(name, image_size=224)


def test_an_image_models_workload_counts_its_micro_batchs_images():
    from topoprof.model.strategies.job import Workload

    assert Workload.from_preset("resnet50", micro_batch_size=32).tokens_per_micro_batch == 32
    assert Workload.from_preset("resnet50", 160, micro_batch_size=8, tokens_per_micro_batch=8).layout == \
        get_preset("resnet50", image_size=160)
    with pytest.raises(InputError, match="tokens_per_micro_batch\\(2048\\) of an image model"):
        Workload.from_preset("resnet50", micro_batch_size=32, tokens_per_micro_batch=2048)
    assert Workload.from_preset("gpt2", micro_batch_size=4).tokens_per_micro_batch is None  # text: as given


def test_grouped_query_attention_shrinks_k_and_v_only():
    """Llama 3 8B: 32 heads of 128 over 8 KV heads: k_proj and v_proj write 8 x 128 = 1024
    features, q_proj and o_proj the full 4096."""
    shapes = {t.name: t.shape for t in get_preset("llama3-8b").tensors if t.name.startswith("model.layers.0.self_attn")}
    assert shapes == {"model.layers.0.self_attn.q_proj.weight": (4096, 4096),
                      "model.layers.0.self_attn.k_proj.weight": (1024, 4096),
                      "model.layers.0.self_attn.v_proj.weight": (1024, 4096),
                      "model.layers.0.self_attn.o_proj.weight": (4096, 4096)}


def test_activation_checkpointing_modes_parse_as_torchtitan_names_them():
    from topoprof.workload.checkpointing import Checkpointing, parse_checkpointing

    assert parse_checkpointing(None) == Checkpointing("none")
    assert parse_checkpointing("layer:1") == Checkpointing("full")          # every block: full
    every_other = parse_checkpointing("layer:2")
    assert every_other.text == "layer:2"
    # torchtitan counts blocks from 1 and wraps when the count divides by N: the 2nd, 4th, ...
    assert [every_other.wraps(i) for i in range(4)] == [False, True, False, True]
    assert all(parse_checkpointing("full").wraps(i) for i in range(3))
    assert not parse_checkpointing("op").wraps(0) and not parse_checkpointing("none").wraps(0)
    for bad in ("layer:0", "layer:x", "some", "selective"):
        with pytest.raises(InputError, match="activation-checkpointing"):
            parse_checkpointing(bad)
