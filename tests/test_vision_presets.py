"""The vision presets as torch modules against their layouts: the same tensors in the same order,
and each use's FLOPs as torch's own counter (`torch.utils.flop_counter.FlopCounterMode`) counts
them, forward and backward, on the meta device (no memory, no time)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from topoprof.workload.presets import VISION_PRESETS, get_preset  # noqa: E402
from topoprof.zoo.preset_modules import build  # noqa: E402

BATCH = 3


def _meta(preset, image_size=None, batch=BATCH):
    with torch.device("meta"):
        return build(preset, micro_batch=batch, image_size=image_size)


def _counted(preset, image_size):
    """FLOPs per module and op of one training micro-batch (forward and backward) on meta."""
    module, images, loss_fn = _meta(preset, image_size)
    module.train()
    counter = FlopCounterMode(display=False)
    with counter:
        logits = module(images)
        loss_fn(logits, images).backward()
    assert logits.shape == (BATCH, 1000)
    return {name: {str(op): n for op, n in ops.items()} for name, ops in counter.get_flop_counts().items()}


def _uses_by_module(layout):
    """{module name: its weight's use} for every conv and fc of the layout."""
    out = {}
    for use in layout.uses:
        weight = layout.tensors[use.tensors[0]].name
        if len(layout.tensors[use.tensors[0]].shape) > 1:  # a conv or fc weight, not a BN
            out[weight.rsplit(".", 1)[0]] = use
    return out


@pytest.mark.parametrize("preset", VISION_PRESETS)
@pytest.mark.parametrize("image_size", [None, 160])
def test_module_has_the_layouts_tensors_in_order(preset, image_size):
    module, images, _ = _meta(preset, image_size)
    side = image_size or 224
    assert tuple(images.shape) == (BATCH, 3, side, side)
    ours = [(name, tuple(p.shape)) for name, p in module.named_parameters()]
    assert ours == [(t.name, t.shape) for t in get_preset(preset, image_size).tensors]
    assert module.training  # batch norm in training mode, as DDP trains it


def _op(ops, *names):
    return sum(ops.get(name, 0) for name in names)


@pytest.mark.parametrize("image_size", [224, 160])
def test_resnet50_flops_per_use_equal_torchs_count(image_size):
    """Forward: every conv and fc as counted; backward: 2x forward, the stem conv 1x (its input,
    the image, needs no gradient, and FlopCounterMode counts only the weight gradient then)."""
    layout = get_preset("resnet50", image_size)
    counts = _counted("resnet50", image_size)
    uses = _uses_by_module(layout)
    assert len(uses) == 54  # 53 convs + fc
    total = counts["Global"]
    downsample_backward = _op(total, "aten.convolution_backward", "aten.mm")
    for name, use in uses.items():
        ops = counts[f"ResNet.{name}"]
        assert _op(ops, "aten.convolution", "aten.addmm") == BATCH * use.forward_flops_per_token, name
        # FlopCounterMode's module tracker also books a block's main branch backward to its
        # downsample (both wait on the block's input): the downsamples are checked together below
        if ".downsample." not in name:
            assert _op(ops, "aten.convolution_backward", "aten.mm") == BATCH * use.backward_flops_per_token, name
            downsample_backward -= BATCH * use.backward_flops_per_token
    downsamples = [u for n, u in uses.items() if ".downsample." in n]
    assert len(downsamples) == 4 and downsample_backward == BATCH * sum(u.backward_flops_per_token for u in downsamples)
    assert _op(total, "aten.convolution", "aten.addmm") == BATCH * layout.forward_flops_per_token
    assert _op(total, "aten.convolution_backward", "aten.mm") == BATCH * layout.backward_flops_per_token
    assert sum(total.values()) == BATCH * layout.train_flops_per_token
    assert set(total) == {"aten.convolution", "aten.addmm", "aten.convolution_backward", "aten.mm"}


def test_resnext_forward_flops_equal_torchs_count():
    """Grouped convs forward. (FlopCounterMode counts a grouped conv's weight gradient as if it
    were ungrouped, `groups` times too much; the layout counts it per group, as the forward.)"""
    layout = get_preset("resnext50_32x4d", 128)
    counts = _counted("resnext50_32x4d", 128)
    for name, use in _uses_by_module(layout).items():
        ops = counts[f"ResNet.{name}"]
        assert _op(ops, "aten.convolution", "aten.addmm") == BATCH * use.forward_flops_per_token, name
    total = counts["Global"]
    assert _op(total, "aten.convolution", "aten.addmm") == BATCH * layout.forward_flops_per_token


def test_image_size_only_for_image_models_and_n_layer_only_for_text():
    with pytest.raises(ValueError, match="image_size"):
        build("gpt2", image_size=224)
    with pytest.raises(ValueError, match="n_layer"):
        build("resnet50", n_layer=2)


@pytest.mark.slow
def test_resnet50_trains_one_step_on_cpu():
    from topoprof.measure.user_model import measure_user_model

    record = measure_user_model("topoprof.zoo.preset_modules:build", "cpu", 1,
                                kwargs={"preset": "resnet50", "micro_batch": 2, "image_size": 32})
    assert record.passes[0].backward_s > 0
    trainable = [p for p in record.params if p.requires_grad]
    assert len(trainable) == len(get_preset("resnet50").tensors)
    assert len({i for i, _ in record.ready}) == len(trainable)   # every parameter got its gradient
