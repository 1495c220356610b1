"""Activation checkpointing of a user's `--model` (`topoprof/zoo/user_blocks.py`), as a preset gets
it: its blocks found without a class name, or named by --fsdp-unit; the modes' kept bytes in the
meta trace and the timing; its own checkpointing refused beside the option; and the fits search,
which traces it whole at other micro-batch sizes (its example batch resized where its callable
does not build them)."""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from helpers.cli import topoprof  # noqa: E402

from topoprof.model.compute.profile_choice import gpu_target  # noqa: E402
from topoprof.model.inputs.candidates import UserShape, WholePass  # noqa: E402
from topoprof.model.inputs.traces import blocks_alike, user_memory_set  # noqa: E402
from topoprof.model.memory.traced import from_trace  # noqa: E402
from topoprof.specs.messages import TraceFailure  # noqa: E402
from topoprof.specs.traced_pass import PassMemory, PassTotals, PhaseTotals, TracedPass, TraceTarget  # noqa: E402
from topoprof.trace.op_trace import trace_user_model  # noqa: E402
from topoprof.workload.checkpointing import parse_checkpointing  # noqa: E402
from topoprof.zoo.user_blocks import find_block_list  # noqa: E402
from topoprof.zoo.user_callable import batch_samples, call_user_callable, resize_batch  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "user_models")
BLOCKS = os.path.join(FIXTURES, "blocks.py")
CHECKPOINTED = os.path.join(FIXTURES, "checkpointed.py")
BF16 = TraceTarget("cuda", "bf16")
WHAT_IF = ("--gpu", "h100-sxm", "--world-size", "8", "--link-bandwidth", "450", "--micro-batch-size", "2",
           "--tokens", "256")


def _trace(name: str, ac: str | None = None, stated: dict | None = None, **more) -> TracedPass | TraceFailure:
    return trace_user_model(f"{BLOCKS}:{name}", stated or {"micro_batch": 2, "seq_len": 64}, target=BF16, ac=ac, **more)


def _kept(trace: TracedPass | TraceFailure) -> int:
    assert not isinstance(trace, TraceFailure), trace
    return trace.memory.activations_bytes


@pytest.mark.parametrize("name", ["build", "encoder", "sequential"])
def test_the_modes_keep_on_a_users_blocks_what_they_keep_on_a_presets(name):
    kept = {ac: _kept(_trace(name, ac)) for ac in ("none", "full", "layer:2", "op")}
    preset = {ac: _kept(trace_user_model("topoprof.zoo.preset_modules:build", {"micro_batch": 2, "seq_len": 64},
                                         {"preset": "gpt2", "n_layer": 4, **({"ac": ac} if ac != "none" else {})},
                                         target=BF16))
              for ac in ("none", "full", "layer:2", "op")}
    for counts in (kept, preset):
        assert counts["full"] < counts["layer:2"] < counts["none"]
        assert counts["full"] < counts["op"] < counts["none"]
    assert _trace(name, "none").totals.recompute.ops == 0
    assert _trace(name, "full").totals.recompute.ops > 0


@pytest.mark.parametrize("name, container, blocks", [("build", "model.layers", 4), ("encoder", "encoder.layer", 3),
                                                     ("sequential", "1", 5)])
def test_the_blocks_are_found_whatever_their_class_and_place(name, container, blocks):
    done = _trace(name, "full").checkpointing
    assert (done.container, done.blocks, done.wrapped) == (container, blocks, blocks)
    assert done.chosen.startswith("found")
    assert _trace(name, "layer:2").checkpointing.wrapped == blocks // 2


def test_a_hugging_face_models_layers_are_found_and_not_the_lists_inside_a_layer():
    pytest.importorskip("transformers")
    module, _, _ = call_user_callable(f"{BLOCKS}:hf_llama")
    assert find_block_list(module) == "model.layers"
    llama_like, _, _ = call_user_callable(f"{BLOCKS}:build")  # 4 layers of 8 experts each: the layers
    assert find_block_list(llama_like) == "model.layers"
    assert find_block_list(call_user_callable(f"{BLOCKS}:no_list")[0]) is None


def test_fsdp_unit_names_the_blocks_over_the_list_found():
    done = _trace("build", "full", blocks="model.layers.0.experts").checkpointing
    assert (done.container, done.blocks, done.chosen) == ("model.layers.0.experts", 8, "--fsdp-unit")
    failed = _trace("build", "full", blocks="model.nothing")
    assert failed.stage == "blocks" and "--fsdp-unit model.nothing" in failed.reason


def test_a_model_without_a_block_list_is_refused_naming_fsdp_unit():
    failed = _trace("no_list", "full")
    assert failed.stage == "blocks" and "--fsdp-unit" in failed.reason
    assert _kept(_trace("no_list")) > 0  # without the option it is traced as before
    proc = topoprof("model", "--model", f"{BLOCKS}:no_list", *WHAT_IF, "--activation-checkpointing", "full")
    assert proc.returncode == 2 and "--fsdp-unit" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["reentrant", "non_reentrant", "selective"])
def test_a_model_that_checkpoints_its_own_blocks_is_refused_beside_the_option(name):
    own = trace_user_model(f"{CHECKPOINTED}:{name}", {"micro_batch": 2, "seq_len": 16}, target=BF16)
    assert own.totals.recompute.ops > 0  # its own checkpointing, traced as it runs
    failed = trace_user_model(f"{CHECKPOINTED}:{name}", {"micro_batch": 2, "seq_len": 16}, target=BF16, ac="full")
    assert failed.stage == "checkpointing" and "already checkpoints its blocks" in failed.reason
    plain = trace_user_model(f"{CHECKPOINTED}:plain", {"micro_batch": 2, "seq_len": 16}, target=BF16, ac="full")
    assert not isinstance(plain, TraceFailure), plain


def test_hugging_faces_gradient_checkpointing_is_refused_before_anything_runs():
    pytest.importorskip("transformers")
    failed = _trace("hf_checkpointed", "full", {"micro_batch": 2})
    assert failed.stage == "checkpointing" and "activation_checkpointing_enable()" in failed.reason


def test_a_dict_batch_is_resized_along_its_first_dimension():
    tokens = torch.arange(6).view(2, 3)
    batch = {"input_ids": tokens, "extra": {"mask": [torch.ones(2, 3)], "scale": torch.ones(3)}, "n": 7}
    out = resize_batch(batch, 2, 5)
    assert out["input_ids"].tolist() == [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5], [0, 1, 2]]
    assert out["extra"]["mask"][0].shape == (5, 3) and out["extra"]["scale"].shape == (3,) and out["n"] == 7
    with pytest.raises(ValueError, match="has 4 as its first dimension"):
        resize_batch(batch, 4, 8)
    traced = _trace("build", stated={"micro_batch": 5, "seq_len": 64}, resize_from=2)
    assert traced.shape.startswith("input_ids 5x64, labels 5x64")
    assert _trace("encoder", stated={"micro_batch": 5, "seq_len": 64}, resize_from=2).shape.startswith("(5x64x256")
    failed = _trace("unsized", stated={"micro_batch": 5, "seq_len": 16}, resize_from=2)
    assert failed.stage == "batch" and "cannot be resized from micro-batch 2 to 5" in failed.reason


def test_a_batch_counts_the_samples_its_tensors_share_and_is_resized_from_them():
    """With no micro-batch it was built at, a batch is resized from the samples it holds: the
    first dimension its tensors share (`batch_samples`), none where they share none."""
    assert batch_samples({"input_ids": torch.ones(3, 8), "labels": [torch.ones(3)], "n": 7}) == 3
    assert batch_samples((torch.ones(4, 8), torch.ones(8, 8))) is None  # tokens beside a mask of their positions
    assert batch_samples({"scale": torch.tensor(2.0)}) is None
    traced = _trace("unsized", stated={"micro_batch": 5, "seq_len": 16})
    assert traced.shape.startswith("input_ids 5x16, labels 5x16") and traced.samples == 5
    assert _trace("unsized", stated={"seq_len": 16}).samples == 3  # nothing stated: built as it is
    failed = _trace("unsizable", stated={"micro_batch": 3, "seq_len": 16})  # never run as built for another size
    assert failed.stage == "batch" and "share no first dimension" in failed.reason


def test_the_timing_is_at_the_shape_stated_as_the_trace_is():
    from topoprof.probes.ranks.model_timing import measure

    assert measure(f"{BLOCKS}:unsized", "cpu", 1, precision="fp32").samples == 3
    timed = measure(f"{BLOCKS}:unsized", "cpu", 1, precision="fp32", stated={"micro_batch": 5, "seq_len": 16})
    assert timed.samples == 5 and timed.block_list == "model.layers"
    assert measure(f"{BLOCKS}:sequential", "cpu", 1, precision="fp32",
                   stated={"micro_batch": 3, "seq_len": 8}).samples == 3  # built at it by its callable


def test_the_whole_model_passes_extend_to_a_micro_batch_as_its_own_pass_counts_it():
    shape = UserShape(f"{BLOCKS}:build", 2, 64, None, ("none", "full", "layer:2", "op"))
    found = user_memory_set(shape, "bf16", cast=False, target=gpu_target("bf16"))
    traced_as, traced = found.traced_as, found.memory
    assert not isinstance(traced, str) and traced_as is not None, traced
    assert traced.whole and traced_as.blocks is None  # nothing to check cut passes against: whole
    for mode in shape.modes:
        direct = from_trace(_trace("build", mode, {"micro_batch": 6, "seq_len": 64}, resize_from=2).memory)
        counted = traced.count(parse_checkpointing(mode), 6)
        assert counted.activations + counted.logits == pytest.approx(direct.activations + direct.logits, rel=1e-9)


def _kept_parts(traced, mode: str, samples: int) -> tuple[float, float, float]:
    counted = traced.count(parse_checkpointing(mode), samples)
    return counted.activations, counted.logits, counted.param_copies


def test_a_users_alike_blocks_are_traced_at_one_and_two_and_keep_what_the_whole_passes_keep():
    """Cut to its first 1 and 2 blocks, as a preset is traced, once the cut passes extended to its
    4 blocks are its whole pass; what each mode keeps at any micro-batch is then what the passes
    of the whole model count."""
    shape = UserShape(f"{BLOCKS}:build", 2, 64, None, ("none", "full", "layer:2", "op"))
    whole_pass = WholePass(_trace("build", "none"), "none")
    cut_set = user_memory_set(shape, "bf16", cast=True, target=gpu_target("bf16"), whole=whole_pass)
    whole_set = user_memory_set(shape, "bf16", cast=True, target=gpu_target("bf16"))
    (cut_as, cut), whole = (cut_set.traced_as, cut_set.memory), whole_set.memory
    assert not isinstance(cut, str) and not isinstance(whole, str) and cut_as is not None, (cut, whole)
    assert (cut_as.blocks, cut.blocks, cut.whole) == (4, 4, False) and whole.whole
    # the cut passes at 2 and 3 samples stand for the search's candidates (topoprof/model/inputs/sampled.py),
    # those for the GPU predicted alone; a model traced whole gives none
    assert cut_set.sampled is not None and whole_set.sampled is None
    assert {(mode, m, d) for mode in ("none", "full", "op") for m in (2, 3) for d in (1, 2)} == set(
        cut_set.sampled.for_target(gpu_target("bf16")))
    assert "cut to its first 1 and 2 blocks" in cut.source
    for mode in shape.modes:
        for samples in (1, 2, 7):
            for variant in ("autocast", "cast"):
                assert cut.count(parse_checkpointing(mode), samples, variant).activations == pytest.approx(
                    whole.count(parse_checkpointing(mode), samples, variant).activations, rel=1e-9), (mode, samples)
            assert _kept_parts(cut, mode, samples) == pytest.approx(_kept_parts(whole, mode, samples), rel=1e-9)


def test_blocks_of_one_class_that_are_not_alike_are_traced_whole():
    shape = UserShape(f"{BLOCKS}:unlike", 2, 64, None, ("none", "full"))
    found = user_memory_set(shape, "bf16", cast=False, target=gpu_target("bf16"),
                            whole=WholePass(_trace("unlike", "none"), "none"))
    traced_as, traced = found.traced_as, found.memory
    assert traced_as is not None and traced_as.blocks is None and not isinstance(traced, str) and traced.whole


def test_cut_passes_stand_for_the_whole_only_where_they_extend_to_it_exactly():
    def trace(forward: int, backward: int, kept: int, blocks_of: int | None = None) -> TracedPass:
        memory = PassMemory(activations_bytes=kept, param_copies_bytes=0, kept=None, peak_bytes=0, rounded_peak_bytes=0,
                            forward_peak_bytes=0, forward_transient_bytes=0, backward_start_bytes=0,
                            backward_peak_bytes=0, backward_transient_bytes=0, grads_bytes=0, segments=[])
        return TracedPass(ops=[], totals=PassTotals(forward=PhaseTotals(flops=forward),
                                                    backward=PhaseTotals(flops=backward)),
                          memory=memory, blocks_of=blocks_of)

    one, two = trace(10, 20, 100, blocks_of=8), trace(13, 26, 150, blocks_of=8)
    assert blocks_alike(trace(10 + 7 * 3, 20 + 7 * 6, 100 + 7 * 50), one, two) == 8
    assert blocks_alike(trace(10 + 7 * 3, 20 + 7 * 6, 100 + 7 * 50 + 1), one, two) is None  # a byte apart
    assert blocks_alike(trace(10 + 7 * 3 + 1, 20 + 7 * 6, 100 + 7 * 50), one, two) is None
    assert blocks_alike(TracedPass(ops=[]), one, two) is None  # no totals: no whole pass to hold them against
    assert blocks_alike(trace(31, 62, 450), TraceFailure("no repeated block list", "cut"), two) is None


def _fits(*args: str) -> dict:
    proc = topoprof("model", "--model", f"{BLOCKS}:build", "--gpu", "h100-sxm", "--world-size", "1",
                    "--micro-batch-size", "2", "--tokens", "256", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["fits"]


@pytest.mark.slow
def test_the_fits_search_runs_for_a_users_model_and_full_fits_more():
    fits = _fits("--gpu-memory", "3")
    assert "reason" not in fits
    row = next(r for r in fits["largest"] if r["strategies"] == ["single"])
    sizes = {mode: row[mode]["micro_batch"] for mode in ("none", "full", "layer:2", "op")}
    assert 2 < sizes["none"] < sizes["layer:2"] < sizes["full"]
    assert sizes["none"] < sizes["op"] < sizes["full"]
    assert fits["fastest"] and fits["mode_costs"]


def test_the_fits_search_says_in_one_line_why_a_batch_cannot_be_resized():
    proc = topoprof("model", "--model", f"{BLOCKS}:unsizable", "--gpu", "h100-sxm", "--world-size", "1",
                    "--tokens", "32", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["inputs"]["micro_batch_size"]["value"] == 1  # its samples cannot be counted: said, and 1
    assert any("share no first dimension" in w and "--micro-batch-size" in w for w in doc["warnings"])
    reason = doc["fits"]["reason"]
    assert "cannot be resized to micro-batch" in reason and "\n" not in reason


@pytest.mark.slow
def test_the_command_checkpoints_a_users_model_and_says_which_blocks():
    proc = topoprof("model", "--model", f"{BLOCKS}:build", *WHAT_IF, "--activation-checkpointing", "full")
    assert proc.returncode == 0, proc.stderr
    assert "activation checkpointing full on model.layers (4 blocks; found" in proc.stdout
    assert "not searched" not in proc.stdout
    layer = topoprof("model", "--model", f"{BLOCKS}:build", *WHAT_IF, "--activation-checkpointing", "layer:2",
                     "--fsdp-unit", "model.layers")
    assert layer.returncode == 0, layer.stderr
    assert "activation checkpointing layer:2 on model.layers (2 of 4 blocks; --fsdp-unit)" in layer.stdout


@pytest.mark.slow
def test_the_timing_checkpoints_the_same_blocks():
    from topoprof.probes.ranks.model_timing import measure

    plain = measure(f"{BLOCKS}:build", "cpu", 1, precision="fp32")
    full = measure(f"{BLOCKS}:build", "cpu", 1, precision="fp32", ac="full")
    assert plain.checkpointing is None
    assert full.checkpointing is not None
    assert full.checkpointing.container == "model.layers" and full.checkpointing.wrapped == 4
    with pytest.raises(Exception, match="already checkpoints its blocks"):
        measure(f"{CHECKPOINTED}:reentrant", "cpu", 1, precision="fp32", ac="full")
