"""The pass on the meta device (`topoprof/trace/op_trace.py`): FLOPs as FlopCounterMode counts them, bytes
per op, and the backward FLOPs done before each gradient is ready, indexed as DDP's parameter
list is; a model that cannot run on meta gives a reason, never an exception."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from topoprof.model.compute.datasheet import named_gpu  # noqa: E402
from topoprof.specs.messages import TraceFailure  # noqa: E402
from topoprof.specs.traced_pass import TracedPass, TraceTarget  # noqa: E402
from topoprof.trace.op_trace import shape_kwargs, trace_pass, trace_user_model  # noqa: E402
from topoprof.zoo.user_callable import call_user_callable, parameter_list  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "user_models")
TIED = os.path.join(FIXTURES, "tied.py")
META = os.path.join(FIXTURES, "meta.py")

BATCH, WIDTHS = 5, (8, 16, 12, 4)  # an MLP 8 -> 16 -> 12 -> 4 on 5 samples


def _mlp_trace():
    with torch.device("meta"):
        layers = [torch.nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:])]
        mlp = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
        x = torch.randn(BATCH, WIDTHS[0])
    return trace_pass(mlp, x, None, list(mlp.parameters()))


def test_ready_fractions_are_the_backward_matmul_flops_done():
    # Each Linear's backward is two matmuls of 2 x in x out x batch FLOPs (weight and input
    # gradients), but the first layer's input needs no gradient; the loss (a mean) and the
    # biases' sums count none. Layers finish in reverse; weight and bias (indices 2k, 2k + 1)
    # become ready together.
    mm = [2 * BATCH * a * b for a, b in zip(WIDTHS, WIDTHS[1:])]
    done_3 = 2 * mm[2]
    done_2 = done_3 + 2 * mm[1]
    done_1 = done_2 + mm[0]
    traced = _mlp_trace()
    assert dict(traced.ready_flops) == {4: done_3, 5: done_3, 2: done_2, 3: done_2, 0: done_1, 1: done_1}
    assert dict(traced.ready) == pytest.approx({4: done_3 / done_1, 5: done_3 / done_1, 2: done_2 / done_1,
                                                   3: done_2 / done_1, 0: 1.0, 1: 1.0})
    fractions = [f for _, f in traced.ready]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert traced.totals.backward.flops == done_1
    assert traced.totals.forward.flops == sum(mm)


def _loss_bytes(traced) -> int:
    return [op for op in traced.ops if op.phase == "forward"][-1].outputs[0]


def test_activations_are_the_tensors_alive_after_the_forward():
    # Each ReLU's result is saved twice (by its own backward and as the next addmm's input) and
    # counted once; the addmm outputs before a ReLU and the last one (the mean saves no input)
    # are freed; the input and the weights were allocated before the pass.
    traced = _mlp_trace()
    relu_outputs = 4 * BATCH * (WIDTHS[1] + WIDTHS[2])
    assert traced.memory.activations_bytes == relu_outputs + _loss_bytes(traced)
    assert traced.memory.param_copies_bytes == 0
    assert traced.memory.peak_bytes >= traced.memory.activations_bytes


def test_activations_in_bf16_keep_the_weight_copies_apart():
    # Under CUDA autocast the input and each weight are cast to bf16: the first layer's weight
    # copy is saved by nothing (its input needs no gradient) and the biases' copies by nothing
    # (addmm's backward does not read them), so only the other two weights' copies stay, apart
    # from the activations; the input's copy is saved for the first weight's gradient.
    with torch.device("meta"):
        layers = [torch.nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:])]
        mlp = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
        x = torch.randn(BATCH, WIDTHS[0])
    traced = trace_pass(mlp, x, None, list(mlp.parameters()), TraceTarget("cuda", "bf16"))
    assert traced.memory.param_copies_bytes == 2 * (WIDTHS[1] * WIDTHS[2] + WIDTHS[2] * WIDTHS[3])
    assert traced.memory.activations_bytes == (2 * BATCH * WIDTHS[0] + 2 * BATCH * (WIDTHS[1] + WIDTHS[2])
                                                     + _loss_bytes(traced))


def test_one_ops_bytes_and_views_moving_none():
    first = next(op for op in _mlp_trace().ops if op.name == "aten.addmm.default")
    # addmm(bias, x, weight.t()): reads the bias, the input and the (transposed) weight in fp32
    assert first.phase == "forward" and first.flops == 2 * BATCH * WIDTHS[0] * WIDTHS[1]
    assert first.bytes_read == 4 * (WIDTHS[1] + BATCH * WIDTHS[0] + WIDTHS[0] * WIDTHS[1])
    assert first.bytes_written == 4 * BATCH * WIDTHS[1]
    views = [op for op in _mlp_trace().ops if op.name == "aten.t.default"]
    assert views and all(op.view and op.bytes_read == op.bytes_written == 0 for op in views)


def test_the_ops_add_up_to_the_totals_and_the_aggregate():
    traced = _mlp_trace()
    for phase in ("forward", "backward"):
        ops = [op for op in traced.ops if op.phase == phase]
        rows = [r for r in traced.by_name if r.phase == phase]
        for key in ("flops", "bytes_read", "bytes_written"):
            assert sum(getattr(op, key) for op in ops) == getattr(getattr(traced.totals, phase), key) \
                == sum(getattr(r, key) for r in rows)
        assert len(ops) == getattr(traced.totals, phase).ops == sum(r.count for r in rows)


def test_flops_equal_flop_counter_modes_own_count():
    from torch.utils.flop_counter import FlopCounterMode

    from topoprof.zoo.user_callable import user_loss

    kwargs = {"preset": "gpt2", "n_layer": 1}
    traced = trace_user_model("topoprof.zoo.preset_modules:build", {"micro_batch": 2, "seq_len": 16}, kwargs)
    with torch.device("meta"):
        module, batch, loss_fn = call_user_callable("topoprof.zoo.preset_modules:build",
                                                    {**kwargs, "micro_batch": 2, "seq_len": 16})
        with FlopCounterMode(display=False) as counter:
            user_loss(module, batch, loss_fn).backward()
    assert traced.totals.forward.flops + traced.totals.backward.flops == counter.get_total_flops()
    assert traced.shape == "2x16 (micro_batch=2, seq_len=16)"


def test_tied_and_frozen_parameters_are_indexed_as_ddp_lists_them():
    traced = trace_user_model(f"{TIED}:build")
    assert isinstance(traced, TracedPass)
    assert traced.params == parameter_list(call_user_callable(f"{TIED}:build")[0])
    trainable = {i for i, p in enumerate(traced.params) if p.requires_grad}
    assert sorted(i for i, _ in traced.ready) == sorted(trainable)  # each once, no frozen one
    head = [p.name for p in traced.params].index("head.weight")
    assert traced.ready[-1] == [head, 1.0]  # the tied weight's last use is the embedding, first in forward


def test_the_stated_shape_reaches_a_callable_that_takes_it():
    sized = trace_user_model(f"{META}:sized", {"micro_batch": 3, "seq_len": 7})
    assert sized.shape == "3x7 (micro_batch=3, seq_len=7)"
    # a callable that takes neither: its batch of 4 resized to the micro-batch stated, its sequences as they are
    assert trace_user_model(f"{TIED}:build", {"micro_batch": 3, "seq_len": 7}).shape == "3x32"
    stated = {"micro_batch": 3, "seq_len": None, "other": 1}
    assert shape_kwargs(lambda micro_batch=1, seq_len=2: None, stated) == {"micro_batch": 3}
    assert shape_kwargs(lambda **anything: None, stated) == {}  # only parameters named so


@pytest.mark.parametrize("name, says, built", [
    # built, then its pass failed: the parameters read on meta come back with the reason
    ("reads_a_value", "on meta, RuntimeError: Tensor.item() cannot be called on meta tensors", True),
    ("no_matmul", "count no backward FLOPs", False),
    ("raises", "on meta, UserModelError", False),  # raised while building: nothing built
    ("reads_a_value_to_build", "on meta, UserModelError", False),
])
def test_what_cannot_be_traced_gives_a_reason(name, says, built):
    spec = f"{TIED if name == 'raises' else META}:{name}"
    traced = trace_user_model(spec)
    assert isinstance(traced, TraceFailure) and traced.stage == "pass" and says in traced.reason
    assert bool(traced.params) == built and not traced.users_to_fix


@pytest.mark.parametrize("name, kind", [("wrong_shape", "return"), ("absent", "callable")])
def test_a_callable_that_is_itself_wrong_says_so(name, kind):
    traced = trace_user_model(f"{TIED}:{name}")
    assert isinstance(traced, TraceFailure) and traced.stage == kind and traced.users_to_fix
    assert traced.params is None


# ---- what the roofline reads: the target device, grouped convolutions, shapes ---------------

def _two_convs():
    with torch.device("meta"):
        net = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1, bias=False),
                                  torch.nn.Conv2d(16, 16, 3, padding=1, groups=4, bias=False))
        x = torch.randn(2, 8, 6, 6)
    return trace_pass(net, x, None, list(net.parameters()))


def test_a_grouped_convolutions_weight_gradient_counts_once():
    # forward 2 x (C_in/groups) x k^2 x C_out x H x W x batch per conv; backward: the second conv's
    # input and weight gradients (2 x its forward), the first's weight gradient only (the image
    # needs none). FlopCounterMode would count the grouped weight gradient 4 times.
    first, second = (2 * 2 * cin * 9 * 16 * 36 for cin in (8, 16 // 4))
    traced = _two_convs()
    assert traced.totals.forward.flops == first + second
    assert traced.totals.backward.flops == first + 2 * second


def _gpt2_block(target):
    return trace_user_model("topoprof.zoo.preset_modules:build", {"micro_batch": 2, "seq_len": 16},
                            {"preset": "gpt2", "n_layer": 1}, target)


@pytest.mark.parametrize("target, forward, backward", [
    (TraceTarget("cpu"), "_scaled_dot_product_flash_attention_for_cpu",
     "_scaled_dot_product_flash_attention_for_cpu_backward"),
    (TraceTarget("cuda", "bf16"), "_scaled_dot_product_flash_attention",
     "_scaled_dot_product_flash_attention_backward"),
    (TraceTarget("cuda", "fp32"), "_scaled_dot_product_efficient_attention",
     "_scaled_dot_product_efficient_attention_backward"),
])
def test_attention_is_the_fused_kernel_the_target_runs(target, forward, backward):
    traced = _gpt2_block(target)
    fused = [op for op in traced.ops if "attention" in op.name]
    assert [op.name for op in fused] == [f"aten.{forward}.default", f"aten.{backward}.default"]
    # one kernel each way, causal as GPT-2 asks; the forward FLOPs as the math path counts them:
    # two batched matmuls of 2 x seq^2 x head dim per head
    assert all(op.causal for op in fused) and fused[0].shapes[0] == [2, 12, 16, 64]
    assert fused[0].flops == 2 * (2 * 2 * 12 * 16 * 16 * 64)
    untargeted = _gpt2_block(None)
    assert not any("attention" in op.name for op in untargeted.ops)  # meta alone: the math path
    assert any(op.name == "aten._safe_softmax.default" for op in untargeted.ops)


def test_a_16_bit_cuda_target_casts_as_autocast_does():
    traced = _gpt2_block(TraceTarget("cuda", "bf16"))
    forward = [op for op in traced.ops if op.phase == "forward"]
    casts = [op for op in forward if op.name == "aten._to_copy.default"]
    # each Linear's weight and bias once (4 Linears), the tied LM head once, the three LayerNorms'
    # fp32 outputs (layer_norm is on autocast's fp32 list) into the matmuls after them, and the
    # logits back to fp32 for cross_entropy; the embeddings run as they are
    assert len(casts) == 4 * 2 + 1 + 3 + 1
    addmm = next(op for op in forward if op.name == "aten.addmm.default")
    (bias, x, weight) = addmm.shapes
    assert addmm.bytes_read == 2 * (bias[0] + x[0] * x[1] + weight[0] * weight[1])  # bf16 operands
    norm = next(op for op in forward if op.name == "aten.native_layer_norm.default")
    assert norm.bytes_written >= 4 * 2 * 16 * 768  # layer_norm on autocast's fp32 list
    assert traced.target == TraceTarget("cuda", "bf16")
    assert _gpt2_block(TraceTarget("cpu", "bf16")).target.precision == "fp32"  # CPUs train fp32


def test_non_view_ops_record_their_outputs_and_whether_they_write_in_place():
    traced = _gpt2_block(TraceTarget("cpu"))
    for op in traced.ops:
        assert (op.outputs is not None) == (not op.view)
        if not op.view:
            assert sum(op.outputs) == op.bytes_written or op.name.startswith("aten.empty")
            assert op.inplace == op.name.split(".")[1].endswith("_")


def test_params_n_traces_the_synthetic_model_validate_trains():
    from topoprof.workload.synthetic import spec_for_params

    traced = trace_user_model("topoprof.zoo.preset_modules:build_synthetic", {"micro_batch": 2, "seq_len": 8},
                              {"params": 2_000_000}, TraceTarget("cpu"))
    spec = spec_for_params(2_000_000, 8)
    assert isinstance(traced, TracedPass) and traced.shape == "2x9 (micro_batch=2, seq_len=8)"
    assert sum(1 for op in traced.ops if op.name == "aten.gelu.default") == spec.n_layers


def test_a_resnexts_traced_flops_equal_its_layout_forward_and_backward():
    from topoprof.workload.presets import get_preset

    traced = trace_user_model("topoprof.zoo.preset_modules:build", {"micro_batch": 2},
                              {"preset": "resnext50_32x4d", "image_size": 64}, TraceTarget("cpu"))
    layout = get_preset("resnext50_32x4d", 64)
    assert sum(op.flops for op in traced.ops) == 2 * layout.train_flops_per_token


def test_a_16_bit_pass_that_fails_runs_again_in_fp32_and_says_why(monkeypatch):
    import topoprof.trace.op_trace as op_trace

    real = op_trace.trace_pass

    def casts_fail(module, batch, loss_fn, params, target=None, blocks=None):
        if target and target.precision != "fp32":
            raise RuntimeError("mixed dtypes")
        return real(module, batch, loss_fn, params, target, blocks)

    monkeypatch.setattr(op_trace, "trace_pass", casts_fail)
    traced = _gpt2_block(TraceTarget("cuda", "bf16"))
    assert traced.target == TraceTarget("cuda", "fp32") and traced.ready
    assert traced.autocast_failure == "in bf16, RuntimeError: mixed dtypes"
    # weights cast to 16 bits (FSDP2's param_dtype) fall back as autocast does: the fp32 pass casts none
    cast = _gpt2_block(TraceTarget("cuda", "bf16", "cast"))
    assert isinstance(cast, TracedPass) and cast.target == TraceTarget("cuda", "fp32") and cast.autocast_failure
    from topoprof.model.compute.profile_choice import pricing_for
    from topoprof.model.compute.traced import priced

    modelled, why = priced(traced, pricing_for(named_gpu("h100-sxm"), "bf16", False))
    assert modelled is None and "ran in fp32, not bf16" in why and "mixed dtypes" in why


# ---- a model that checkpoints its own blocks, and one built on (or moved off) meta ----------

CHECKPOINTED = os.path.join(FIXTURES, "checkpointed.py")
BF16 = TraceTarget("cuda", "bf16")


@pytest.mark.parametrize("name", ["reentrant", "non_reentrant", "selective"])
@pytest.mark.parametrize("target", [BF16, TraceTarget("cuda", "fp32"), TraceTarget("cpu")])
def test_a_model_that_checkpoints_is_traced_as_it_runs(name, target):
    # in bf16 the recompute runs in the backward's engine, where the lens was off: non-reentrant
    # checkpointing refused its fp32 recompute (CheckpointError), reentrant recomputed in fp32
    traced = trace_user_model(f"{CHECKPOINTED}:{name}", {"micro_batch": 2, "seq_len": 16}, target=target)
    assert isinstance(traced, TracedPass) and traced.autocast_failure is None and traced.target.precision == \
        target.precision
    recomputed = [op for op in traced.ops if op.recompute]
    assert recomputed and all(op.phase == "backward" for op in recomputed)
    assert traced.totals.recompute.ops == len(recomputed)
    assert traced.totals.recompute.flops == sum(op.flops for op in recomputed) > 0
    assert not any(op.name == "aten.ones_like.default" for op in recomputed)  # the gradient seed is none
    names = {op.name for op in recomputed}
    if target == BF16:  # recomputed as the forward ran: autocast's casts, the fused kernel
        assert "aten._to_copy.default" in names and "aten._scaled_dot_product_flash_attention.default" in names
    if name == "selective":  # its policy keeps the matmuls: none is recomputed
        assert "aten.mm.default" not in names
    else:
        assert "aten.mm.default" in names


def test_checkpointing_keeps_less_and_recomputes_what_it_dropped():
    stated = {"micro_batch": 2, "seq_len": 16}
    plain, full, selective = (trace_user_model(f"{CHECKPOINTED}:{n}", stated, target=BF16)
                              for n in ("plain", "non_reentrant", "selective"))
    held = [t.memory.activations_bytes for t in (full, selective, plain)]
    assert held == sorted(held) and held[0] < held[2]
    assert plain.totals.recompute.ops == 0
    assert plain.totals.forward.flops == full.totals.forward.flops
    assert [p.name for p in plain.params] == [p.name for p in full.params]


@pytest.mark.parametrize("name", ["built_on_meta", "moved_to_a_device", "meta_only"])
def test_a_model_built_on_meta_or_moved_to_a_device_is_traced(name):
    # `Net().to("cpu")` under the pass's meta device was "Cannot copy out of meta tensor"
    traced = trace_user_model(f"{META}:{name}", {"micro_batch": 3, "seq_len": 5}, target=BF16)
    assert isinstance(traced, TracedPass) and traced.shape == "3x5 (micro_batch=3, seq_len=5)"
    assert traced.ready


def test_a_model_built_on_meta_cannot_be_timed_and_says_so():
    from topoprof.probes.ranks.model_timing import measure
    from topoprof.zoo.user_callable import UserModelError

    with pytest.raises(UserModelError) as err:
        measure(f"{META}:built_on_meta", "cpu", 1)
    assert err.value.kind == "meta" and "meta device" in str(err.value) and "\n" not in str(err.value)


def test_the_trace_worker_never_runs_the_model_here():
    # the worker a what-if asks for: the model's forward refuses real data, and still traces
    from topoprof.measure.meta_trace import trace_model

    traced = trace_model(f"{META}:meta_only", None, {"micro_batch": 2, "seq_len": 8}, BF16, timeout_s=120)
    assert isinstance(traced, TracedPass) and traced.device == "meta" and traced.ready


def test_a_pass_asked_twice_is_traced_once_and_answers_both(monkeypatch):
    # a user's blocks checked at the job's mode and size, and the same pass among its memory passes
    from topoprof.measure import meta_trace
    from topoprof.specs.messages import OpTracesResult, TraceVariant

    sent = []

    def worker(job, kinds, timeout_s, on_message=None):
        sent.append(job.variants)
        return OpTracesResult(traces=[TraceFailure(f"pass {i}", "trace") for i in range(len(job.variants))])

    monkeypatch.setattr(meta_trace, "_run_trace_worker", worker)
    one, two = (TraceVariant(stated={"micro_batch": m, "seq_len": 8}, ac="full", depth=1) for m in (2, 3))
    traces = meta_trace.trace_models("m.py:build", None, [one, two, one, replace(one, depth=2)])
    assert sent == [[one, two, replace(one, depth=2)]]
    assert [t.reason for t in traces] == ["pass 0", "pass 1", "pass 0", "pass 2"]


def test_the_backward_graph_nodes_and_each_ops_storages():
    # the MLP's backward runs MeanBackward, 3 AddmmBackward, 3 TBackward (the weights' t() in
    # linear), 2 ReluBackward and an AccumulateGrad per parameter (6): 15 nodes
    traced = _mlp_trace()
    assert (traced.autograd_nodes, traced.autograd_leaves) == (15, 6)
    ops = [op for op in traced.ops if not op.view]
    first_mm, first_relu = ops[0], ops[1]
    assert first_mm.name == "aten.addmm.default" and first_relu.name == "aten.relu.default"
    (out_key, out_bytes), = first_mm.writes
    assert first_relu.reads == [[out_key, out_bytes]] and out_bytes == 4 * BATCH * WIDTHS[1]
    # the second layer's weight is read by its forward addmm and, the same storage, by the
    # backward's input-gradient mm
    weight = {key for key, nbytes in ops[2].reads if nbytes == 4 * WIDTHS[1] * WIDTHS[2]}
    backward_reads = {key for op in ops if op.phase == "backward" for key, _ in op.reads}
    assert len(weight) == 1 and weight <= backward_reads


def test_grouped_query_attention_counts_the_query_heads():
    """Fewer key/value heads than query heads, as the fused kernels read them (broadcast): the
    FLOPs of the same attention with key and value repeated to the query's heads, forward and
    backward, whichever torch's own formula refuses or counts."""
    from topoprof.trace.op_trace import _flops

    aten = torch.ops.aten
    q, kv, full = (torch.empty(s, device="meta") for s in ((2, 8, 16, 64), (2, 2, 16, 64), (2, 8, 16, 64)))
    forward = aten._scaled_dot_product_flash_attention.default
    backward = aten._scaled_dot_product_flash_attention_backward.default
    two_bmms = 2 * (2 * 2 * 8 * 16 * 64 * 16)
    assert _flops(forward, (q, kv, kv), {}, None) == _flops(forward, (q, full, full), {}, None) == two_bmms
    assert _flops(backward, (q, q, kv, kv), {}, None) == _flops(backward, (q, q, full, full), {}, None) \
        == 5 * two_bmms // 2
