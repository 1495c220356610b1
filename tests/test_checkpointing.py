"""Activation checkpointing as the tool applies it (`topoprof/zoo/checkpoint_wrap.py`: none, full, every
N-th block, torchtitan's selective op policy) and as the meta pass traces it: what each mode
wraps, what the op policy keeps, and the recompute in the backward."""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext  # noqa: E402

from topoprof.model.compute.datasheet import named_gpu  # noqa: E402
from topoprof.specs.traced_pass import SelectiveCheckpointCost, TracedPass, TraceTarget  # noqa: E402
from topoprof.trace.op_trace import trace_user_model  # noqa: E402
from topoprof.zoo.checkpoint_wrap import _op_policy, apply_activation_checkpointing, check_mode  # noqa: E402
from topoprof.zoo.llama import LLAMA_CONFIGS  # noqa: E402
from topoprof.zoo.preset_modules import PRESET_MODULES, build, preset_blocks  # noqa: E402

aten = torch.ops.aten
SMALL_LLAMA = {"hidden": 128, "heads": 32, "kv_heads": 8, "intermediate": 448, "vocab_size": 512}


def test_modes_parse_and_a_bad_one_names_the_valid_forms():
    assert [check_mode(m) for m in ("none", "Full", "op", "layer:3")] == [("none", 1), ("full", 1), ("op", 1),
                                                                           ("layer", 3)]
    for bad in ("layer:0", "layer", "layer:x", "layer:-1", "selective", "", "op:2", "full:1"):
        with pytest.raises(ValueError) as err:
            check_mode(bad)
        message = str(err.value)
        assert message == f"activation checkpointing {bad!r}: valid modes are none, full, layer:N " \
                          "(N a positive integer) or op"
    with pytest.raises(ValueError, match="valid modes are"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2), "everything", [])


def _wrapped(preset: str, ac: str, n_layer: int = 5) -> list[bool]:
    with torch.device("meta"):
        module, _, _ = build(preset, seq_len=8, n_layer=n_layer, ac=ac)
    return [isinstance(block, CheckpointWrapper) for block in module.transformer.h]


def test_full_wraps_every_block_and_layer_n_every_nth():
    assert _wrapped("gpt2", "none") == [False] * 5
    assert _wrapped("gpt2", "full") == [True] * 5
    assert _wrapped("gpt2", "layer:1") == [True] * 5
    assert _wrapped("gpt2", "layer:2") == [False, True, False, True, False]  # torchtitan's count % N == 0
    assert _wrapped("gpt2", "layer:3") == [False, False, True, False, False]
    assert _wrapped("gpt2", "op") == [True] * 5


def test_the_op_mode_runs_the_selective_policy_and_the_others_none():
    with torch.device("meta"):
        op = build("gpt2", seq_len=8, n_layer=1, ac="op")[0].transformer.h[0]
        full = build("gpt2", seq_len=8, n_layer=1, ac="full")[0].transformer.h[0]
    assert "context_fn" in op.checkpoint_fn.keywords and "context_fn" not in full.checkpoint_fn.keywords
    assert op.checkpoint_fn.keywords["use_reentrant"] is False and full.checkpoint_fn.keywords["use_reentrant"] is False


@pytest.mark.parametrize("preset", sorted(PRESET_MODULES))
def test_each_presets_blocks_are_its_repeated_blocks(preset):
    cls, kwargs, _, _ = PRESET_MODULES[preset]
    with torch.device("meta"):
        module = build(preset, seq_len=8)[0] if cls.__name__ != "ResNet" else build(preset, image_size=32)[0]
    blocks = preset_blocks(module)
    expected = sum(kwargs["blocks"]) if "blocks" in kwargs else kwargs["n_layer"]
    assert len(blocks) == len(set(blocks)) == expected
    assert len({type(module.get_submodule(name)).__name__ for name in blocks}) == 1


def test_the_op_policy_keeps_every_other_matmul_and_the_attention():
    policy, forward = _op_policy(), SelectiveCheckpointContext(is_recompute=False)
    keep, again = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert [policy(forward, aten.mm.default) for _ in range(4)] == [keep, again, keep, again]
    for kept in (aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
                 aten._scaled_dot_product_cudnn_attention.default):
        assert policy(forward, kept) == keep
    for recomputed in (aten.addmm.default, aten.relu.default, aten.silu.default, aten._to_copy.default):
        assert policy(forward, recomputed) == again
    recompute = SelectiveCheckpointContext(is_recompute=True)  # its own count, as torchtitan's
    assert policy(recompute, aten.mm.default) == keep


def _llama_trace(ac: str, target: TraceTarget) -> TracedPass:
    return trace_user_model("topoprof.zoo.preset_modules:build", {"micro_batch": 2, "seq_len": 16},
                            {"preset": "llama3-8b", "n_layer": 4, "sizes": SMALL_LLAMA, "ac": ac}, target)


@pytest.fixture(scope="module")
def by_mode():
    return {ac: _llama_trace(ac, TraceTarget("cuda", "bf16")) for ac in ("none", "full", "layer:2", "op")}


def _recomputed(trace: TracedPass) -> Counter:
    return Counter(op.name for op in trace.ops if op.recompute)


def test_every_mode_traces_in_bf16_with_its_recompute_in_the_backward(by_mode):
    for ac, trace in by_mode.items():
        assert isinstance(trace, TracedPass) and trace.autocast_failure is None, ac
        assert all(op.phase == "backward" for op in trace.ops if op.recompute)
        assert len(trace.ready) == len(trace.params)  # every gradient still ready once
    recompute = {ac: t.totals.recompute.flops for ac, t in by_mode.items()}
    assert recompute["none"] == 0 and recompute["full"] > 0
    assert recompute["layer:2"] * 2 == recompute["full"]      # half the blocks, the same blocks
    assert 0 < recompute["op"] < recompute["full"]
    kept = {ac: t.memory.activations_bytes for ac, t in by_mode.items()}
    assert kept["full"] < kept["op"] < kept["none"] and kept["full"] < kept["layer:2"] < kept["none"]


def test_the_recompute_casts_and_attends_as_the_forward(by_mode):
    full, op = _recomputed(by_mode["full"]), _recomputed(by_mode["op"])
    flash = "aten._scaled_dot_product_flash_attention.default"
    assert full[flash] == 4 and full["aten._to_copy.default"] > 0  # bf16 again, the fused kernel again
    # the op policy keeps the attention and every other of a block's 7 matmuls (q k v o gate up
    # down: k, o and up recomputed), where full recomputes all but the last (nothing reads it)
    assert op[flash] == 0 and op["aten.mm.default"] == 4 * 3 and full["aten.mm.default"] == 4 * 6


def test_a_70b_preset_traces_under_every_mode_on_meta():
    # the whole model, as a what-if prices it, in seconds: no memory, no data
    config = LLAMA_CONFIGS["llama2-70b"]
    for ac in ("full", "op"):
        trace = trace_user_model("topoprof.zoo.preset_modules:build", {"micro_batch": 1, "seq_len": 64},
                                 {"preset": "llama2-70b", "n_layer": 2, "ac": ac},
                                 TraceTarget("cuda", "bf16"))
        assert isinstance(trace, TracedPass) and trace.totals.recompute.flops > 0
        assert sum(p.numel for p in trace.params) == \
            2 * config.vocab_size * config.hidden + config.hidden + 2 * (
                2 * config.hidden ** 2 + 2 * config.hidden * config.kv_heads * (config.hidden // config.heads)
                + 3 * config.hidden * config.intermediate + 2 * config.hidden)


# ---- op mode's host cost: the ops its modes see, and what they add per op ------------------------

def test_op_mode_marks_the_ops_its_policy_sees_and_no_other_mode_does(by_mode):
    for ac in ("none", "full", "layer:2"):
        assert not any(op.selective for op in by_mode[ac].ops), ac
    ops = by_mode["op"].ops
    selective = [op for op in ops if op.selective]
    assert any(op.phase == "forward" for op in selective)
    assert all(op.selective for op in ops if op.recompute)  # every recompute op is under the mode
    assert not any(op.selective for op in ops if op.phase == "backward" and not op.recompute)


def test_the_selective_modes_cost_more_per_op_than_a_plain_recorded_op_here():
    from topoprof.trace.selective_cost import selective_checkpoint_ratio

    measured = selective_checkpoint_ratio()
    assert measured.ratio > 1  # the modes add Python per op; no tighter bound: it is this CPU's
    assert measured.seconds_per_op > measured.recorded_seconds_per_op > 0


def test_op_mode_step_grows_by_exactly_the_ratios_share_of_a_recorded_op(by_mode):
    from topoprof.model.compute.profile import load_profile
    from topoprof.model.compute.profile_choice import SHIPPED_DIR, pricer_for
    from topoprof.model.compute.roofline import roofline

    plain = by_mode["op"]
    priced = replace(plain, selective_checkpoint=SelectiveCheckpointCost(3.0, "measured here: a stated 3"))
    # a profile that did not measure the policy's modes (the H200's facts): the trace's ratio prices them
    path = os.path.join(SHIPPED_DIR, "nvidia-h200-sxm-gpu-facts-20261126.json")
    pricer, _ = pricer_for(named_gpu("h100-sxm"), "bf16", False, load_profile(path), path)
    before, after = roofline(plain, pricer), roofline(priced, pricer)
    recorded = pricer.host.get("autograd_forward").at("middle", False)
    seen = sum(1 for op in plain.ops if op.selective and not op.view)
    assert after.middle.host_s - before.middle.host_s == pytest.approx(seen * (3.0 - 1) * recorded)
    assert after.seconds[1] > before.seconds[1]
    assert "selective op AC: x3 host cost per op its modes see, measured here: a stated 3" in after.basis
    assert not any("selective op AC" in line for line in before.basis)  # nothing measured, nothing claimed


def test_a_profile_that_measured_the_modes_prices_them_over_the_trace(by_mode):
    from topoprof.model.compute.host_costs import SELECTIVE_KIND, HostCosts, selective_cost
    from topoprof.model.compute.roofline_terms import Span

    costs = HostCosts({"autograd_forward": Span(2e-6, 2e-6, "measured"), SELECTIVE_KIND: Span(7e-6, 7e-6, "measured")})
    trace = replace(by_mode["op"], selective_checkpoint=SelectiveCheckpointCost(9.0, "here"))
    assert selective_cost(trace, costs).ratio == pytest.approx(3.5)
    assert selective_cost(trace, HostCosts({})).ratio == 9.0
    assert selective_cost(by_mode["full"], costs) is None
