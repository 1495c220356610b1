"""What the meta pass counts as activations (`topoprof/trace/op_trace.py`, `memory.activations_bytes`)
against what a real forward on this CPU leaves for its backward, hooked exactly
(`topoprof/trace/activation_bytes.py`, saved_tensors_hooks): every preset, every user-model fixture, at
a few shapes, under every activation checkpointing mode the tool applies (and the fixtures' own).

The text presets run at 2 blocks and a reduced width (the head count kept, 4 or 8 per head, the
feed-forward's and the key/value heads' ratios kept, a 512-token vocabulary), the vision presets
at one residual block per stage (two in the third) on small images: the same modules, small
enough to run for real here, at two shapes each; the user models at three. `python tests/test_activation_bytes.py`
prints the table."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from topoprof.specs.traced_pass import TraceTarget  # noqa: E402
from topoprof.trace.activation_bytes import saved_activation_bytes  # noqa: E402
from topoprof.trace.meta_device import on_meta  # noqa: E402
from topoprof.trace.op_trace import build_on_meta, shape_kwargs, trace_pass  # noqa: E402
from topoprof.zoo.checkpoint_wrap import apply_activation_checkpointing, children_of  # noqa: E402
from topoprof.zoo.user_callable import call_user_callable, load_callable  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "user_models")
PRESETS = "topoprof.zoo.preset_modules:build"
MODES = ("none", "full", "layer:2", "op")
TOLERANCE = 0.02


def _gpt(heads: int) -> dict:
    return {"n_embd": 8 * heads, "n_head": heads, "vocab_size": 512}


def _llama(heads: int, kv_heads: int, hidden: int, intermediate: int) -> dict:
    width = 4 * heads  # 4 per head; the feed-forward at the same ratio to the width
    return {"hidden": width, "heads": heads, "kv_heads": kv_heads, "intermediate": intermediate * width // hidden,
            "vocab_size": 512}


REDUCED = {
    "gpt2": _gpt(12), "gpt2-medium": _gpt(16), "gpt3-xl": _gpt(16),
    "bert-base": {"hidden": 96, "intermediate": 384, "heads": 12, "vocab_size": 512},
    "llama-7b": _llama(32, 32, 4096, 11008), "llama2-13b": _llama(40, 40, 5120, 13824),
    "llama2-70b": _llama(64, 8, 8192, 28672), "llama3-8b": _llama(32, 8, 4096, 14336),
    "llama3-70b": _llama(64, 8, 8192, 28672),
    # torchtitan's fused_rmsnorm (model --rmsnorm fused): each norm keeps its input and rstd
    "llama3-8b --rmsnorm fused": {**_llama(32, 8, 4096, 14336), "norm": "fused"},
}
# resnet101 is resnet50 with a deeper third stage: at one block per stage they are one module
VISION = ("resnet50", "resnext50_32x4d", "resnext101_32x8d")
TEXT_SHAPES = ({"micro_batch": 1, "seq_len": 8}, {"micro_batch": 3, "seq_len": 17})
IMAGE_SHAPES = ({"micro_batch": 2, "image_size": 16}, {"micro_batch": 3, "image_size": 24})
USER_SHAPES = ({"micro_batch": 1, "seq_len": 8}, {"micro_batch": 2, "seq_len": 24}, {"micro_batch": 3, "seq_len": 17})


def _cases():
    """(model, shape, AC, spec, kwargs, stated shape, AC mode applied here, container of its blocks)."""
    for name, sizes in REDUCED.items():
        preset = name.split()[0]
        for shape in TEXT_SHAPES:
            for mode in MODES:
                yield (name, f"{shape['micro_batch']}x{shape['seq_len']}", mode, PRESETS,
                       {"preset": preset, "n_layer": 2, "sizes": sizes, "ac": mode, "seq_len": shape["seq_len"]},
                       {"micro_batch": shape["micro_batch"]}, "none", None)
    for preset in VISION:
        for shape in IMAGE_SHAPES:
            for mode in MODES:
                yield (preset, f"{shape['micro_batch']}x{shape['image_size']}px", mode, PRESETS,
                       {"preset": preset, "sizes": {"blocks": [1, 1, 2, 1]}, "ac": mode,
                        "image_size": shape["image_size"]}, {"micro_batch": shape["micro_batch"]}, "none", None)
    for name in ("build", "build_1m"):  # one shape each: the callables take none
        for mode in MODES:
            yield f"tied.py:{name}", "its own", mode, f"{FIXTURES}/tied.py:{name}", {}, {}, mode, "blocks"
    user = [f"meta.py:{n}" for n in ("sized", "moved_to_a_device")]
    user += [f"checkpointed.py:{n}" for n in ("reentrant", "non_reentrant", "selective")]
    for name in user:
        for shape in USER_SHAPES:
            yield (name, f"{shape['micro_batch']}x{shape['seq_len']}", "its own", f"{FIXTURES}/{name}", {}, shape,
                   "none", None)
    for shape in USER_SHAPES:  # the checkpointed fixture's blocks run plain: the tool's modes apply
        for mode in MODES:
            yield ("checkpointed.py:plain", f"{shape['micro_batch']}x{shape['seq_len']}", mode,
                   f"{FIXTURES}/checkpointed.py:plain", {}, shape, mode, "blocks")


CASES = list(_cases())


def _with_ac(module, mode: str, container: str | None):
    return module if container is None else apply_activation_checkpointing(module, mode, children_of(module, container))


def measured(spec: str, kwargs: dict, stated: dict, mode: str, container: str | None) -> tuple[int, int]:
    """(counted on meta for a CPU, hooked on this CPU) bytes."""
    with on_meta():
        module, batch, loss_fn, _ = build_on_meta(spec, stated, kwargs)
        module = _with_ac(module, mode, container)
        counted = trace_pass(module, batch, loss_fn, list(module.parameters()), TraceTarget("cpu"))
    module, batch, loss_fn = call_user_callable(spec, {**kwargs, **shape_kwargs(load_callable(spec), stated)})
    hooked = saved_activation_bytes(_with_ac(module, mode, container), batch, loss_fn)
    return counted.memory.activations_bytes, hooked.held_bytes


@pytest.mark.parametrize("spec, kwargs, stated, mode, container", [c[3:] for c in CASES],
                         ids=["-".join(c[:3]) for c in CASES])
def test_counted_activations_are_the_bytes_saved_for_backward(spec, kwargs, stated, mode, container):
    counted, hooked = measured(spec, kwargs, stated, mode, container)
    assert hooked > 0
    assert abs(counted - hooked) <= TOLERANCE * hooked, f"counted {counted} B, hooked {hooked} B"


class _TwoViews(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))                 # saved by relu's backward (its output)
        return self.b(h[:, :8] * h[:, 8:])        # the product saves both halves: views of h


def test_hooked_bytes_count_each_storage_once_and_not_the_batch_or_weights():
    torch.manual_seed(0)
    x = torch.randn(5, 8, requires_grad=True)     # the batch: there before and after, not counted
    saved = saved_activation_bytes(_TwoViews(), x, None)
    # h (5 x 16) once for relu and both views; the product (5 x 8), saved by b's addmm; the
    # weights and x are saved too, and left out; the loss (mean, fp32) is held apart
    assert saved.saved_bytes == 4 * (5 * 16 + 5 * 8) and saved.loss_bytes == 4
    assert saved.saved_tensors > 3


def test_checkpointing_keeps_less_than_none():
    # the modes differ where they should: full keeps the least, every second block in between
    kwargs = {"preset": "llama3-8b", "n_layer": 4, "sizes": REDUCED["llama3-8b"], "seq_len": 16}
    kept = {mode: measured(PRESETS, {**kwargs, "ac": mode}, {"micro_batch": 2}, "none", None)[1] for mode in MODES}
    assert kept["full"] < kept["op"] < kept["none"]
    assert kept["full"] < kept["layer:2"] < kept["none"]


def test_a_fused_rmsnorm_keeps_less_than_the_eager_one_by_its_normalized_tensor():
    # in fp32 (this CPU's pass) the eager norm's x.float() is x itself, kept by both; the eager one
    # also keeps the normalized x for the weight's gradient (4 B per element), the fused one only
    # its rstd, which the eager rsqrt keeps too: one hidden-sized fp32 tensor per norm and token
    hidden, tokens = 128, 2 * 16
    kwargs = {"preset": "llama3-8b", "n_layer": 2, "seq_len": 16,
              "sizes": {**REDUCED["llama3-8b"], "hidden": hidden}}
    eager_counted, eager = measured(PRESETS, kwargs, {"micro_batch": 2}, "none", None)
    fused_counted, fused = measured(PRESETS, {**kwargs, "sizes": {**kwargs["sizes"], "norm": "fused"}},
                                    {"micro_batch": 2}, "none", None)
    norms = 2 * 2 + 1  # two per block, and the final one
    assert eager - fused == norms * tokens * 4 * hidden
    assert eager_counted - fused_counted == eager - fused


def test_an_in_place_update_of_a_buffer_allocates_nothing():
    # BatchNorm's num_batches_tracked.add_(1) returns the buffer itself: no activation
    def build():
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), torch.randn(3, 4)

    with on_meta():
        module, batch = build()
        counted = trace_pass(module, batch, None, list(module.parameters()), TraceTarget("cpu"))
    hooked = saved_activation_bytes(*build())
    assert counted.memory.activations_bytes == hooked.held_bytes


if __name__ == "__main__":
    print("| model | shape | AC | counted B | hooked B | ratio |")
    print("|---|---|---|---:|---:|---:|")
    for model, shape, ac, *case in CASES:
        counted, hooked = measured(*case)
        print(f"| {model} | {shape} | {ac} | {counted} | {hooked} | {counted / hooked:.4f} |")
