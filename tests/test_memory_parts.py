"""The parts of a micro-batch's memory the meta pass counts beyond the saved activations
(`topoprof/trace/live_bytes.py`, `topoprof.model.memory.traced`): the tail's logits and loss against the
bytes a real forward of the tail saves on this CPU; autocast's weight copies against the weights the
backward reads; the backward's peak against the CPU allocator's own count (torch.profiler's memory
events); the extension of passes at 1 and 2 blocks and 1 and 2 sequences to the whole model against
the whole model's pass, under every checkpointing mode; and the activations per mode through the
model's output against the bytes hooked on this CPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from topoprof.model.memory.traced import TracedMemory, from_trace  # noqa: E402
from topoprof.specs.traced_pass import TracedPass, TraceTarget  # noqa: E402
from topoprof.trace.activation_bytes import saved_activation_bytes  # noqa: E402
from topoprof.trace.meta_device import on_meta  # noqa: E402
from topoprof.trace.op_trace import build_on_meta, repeated_blocks, trace_pass, trace_user_model  # noqa: E402
from topoprof.workload.checkpointing import parse_checkpointing  # noqa: E402
from topoprof.zoo.preset_modules import _next_token_loss, build  # noqa: E402

PRESETS = "topoprof.zoo.preset_modules:build"
# llama3-8b's design at 4 per head (tests/test_activation_bytes.py's reduction)
SIZES = {"hidden": 32, "heads": 8, "kv_heads": 2, "intermediate": 112, "vocab_size": 512}
CPU = TraceTarget("cpu")
GPU = TraceTarget("cuda", "bf16")


def _trace(mode: str, n_layer: int, micro_batch: int, seq_len: int = 16, target=CPU) -> TracedPass:
    return trace_user_model(PRESETS, {"micro_batch": micro_batch},
                            {"preset": "llama3-8b", "n_layer": n_layer, "sizes": SIZES, "ac": mode, "seq_len": seq_len},
                            target)


class _Tail(torch.nn.Module):
    """The preset's final norm, head and loss, on the last block's output."""

    def __init__(self, model):
        super().__init__()
        self.norm, self.head = model.model.norm, model.lm_head

    def forward(self, h, tokens):
        return _next_token_loss(self.head(self.norm(h)), tokens)


@pytest.mark.parametrize("mode", ["none", "full", "op"])
def test_the_tail_keeps_what_a_real_forward_of_it_saves(mode):
    traced = _trace(mode, 2, 3)
    kept = traced.memory.kept
    assert kept.before_blocks_bytes + sum(kept.blocks_bytes) + kept.after_blocks_bytes \
        == traced.memory.activations_bytes
    model, tokens, _ = build("llama3-8b", micro_batch=3, seq_len=16, n_layer=2, sizes=SIZES)
    h = torch.randn(3, 16, SIZES["hidden"], requires_grad=True)  # the last block's output: not the tail's
    hooked = saved_activation_bytes(_Tail(model), (h, tokens))
    assert kept.after_blocks_bytes == hooked.held_bytes
    assert kept.after_blocks_tensors[0].op.startswith("aten._log_softmax")  # the loss's fp32 log-probabilities


def _linear_weights(module, only=None) -> int:
    return sum(m.weight.numel() for name, m in module.named_modules()
               if isinstance(m, torch.nn.Linear) and (only is None or name == only))


def test_autocast_copies_held_are_the_16_bit_weights_the_backward_reads():
    model, _, _ = build("llama3-8b", micro_batch=1, seq_len=16, n_layer=2, sizes=SIZES)
    copies = {mode: _trace(mode, 2, 1, target=GPU).memory.param_copies_bytes for mode in ("none", "full", "op")}
    assert copies["none"] == 2 * _linear_weights(model)  # every linear layer's bf16 weight (the embedding is not cast)
    # checkpointed blocks keep none of theirs: their casts run again in the recompute; the head's stays
    assert copies["full"] == copies["op"] == 2 * _linear_weights(model, "lm_head")


def test_the_backward_peak_is_what_the_cpu_allocator_counts():
    """The pass on meta against a real forward and backward on this CPU, whose allocator reports
    every allocation and free to torch.profiler (profile_memory): the most held at once, the
    parameters and the batch apart, is the same. Without checkpointing: with it the two differ by
    one block's few tensors in its recompute (this reduced Llama: 47 KB of 266 KB, the meta pass
    the higher; the same pass on real CPU tensors counts as on meta), which is not explained yet."""
    from torch.profiler import ProfilerActivity, profile

    # torch's own memory timeline of a profile (what export_memory_timeline draws), private API
    from torch.profiler._memory_profiler import Action, MemoryProfile

    for mode in ("none",):
        traced = _trace(mode, 2, 2)
        model, tokens, loss_fn = build("llama3-8b", micro_batch=2, seq_len=16, n_layer=2, sizes=SIZES, ac=mode)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            _next_token_loss(model(tokens), tokens).backward()
        live = peak = 0
        for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
            live += {Action.CREATE: size, Action.DESTROY: -size}.get(action, 0)
            peak = max(peak, live)
        assert peak == pytest.approx(traced.memory.peak_bytes, rel=0.02), mode


def _points(mode: str, target) -> dict:
    return {(d, m): from_trace(_trace(mode, d, m, target=target).memory) for d in (1, 2) for m in (2, 3)}


@pytest.mark.parametrize("target", [CPU, GPU], ids=["cpu", "cuda-bf16"])
def test_passes_at_one_and_two_blocks_extend_to_the_whole_model(target):
    traced = TracedMemory(4, 16, {("autocast", mode): _points(mode, target) for mode in ("none", "full", "op")})
    for mode in ("none", "full", "op", "layer:2", "layer:3"):
        for samples in (2, 5):
            whole = from_trace(_trace(mode, 4, samples, target=target).memory)
            extended = traced.count(parse_checkpointing(mode), samples)
            for part in ("activations", "logits", "param_copies"):
                assert getattr(extended, part) == getattr(whole, part), (mode, samples, part)
            assert extended.backward_transient == pytest.approx(whole.backward_transient, rel=0.05), (mode, samples)
        # one sample: its label slice is a view, not a copy (topoprof.model.memory.traced): a few bytes high
        one = from_trace(_trace(mode, 4, 1, target=target).memory)
        assert 0 <= traced.count(parse_checkpointing(mode), 1).logits - one.logits <= 8 * 16, mode


@pytest.mark.parametrize("mode", ["none", "full", "layer:2", "op"])
def test_the_activations_per_mode_in_the_models_output_are_the_bytes_hooked(mode):
    """The small passes for a CPU, through `predict`: the activations and the logits the memory
    count shows are the bytes a real forward of the whole model under that mode saves here."""
    from topoprof.model.comm.collectives import RingComm
    from topoprof.model.compute.timing import Compute
    from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
    from topoprof.model.strategies.predict import predict

    traced = TracedMemory(4, 16, {("autocast", m): _points(m, CPU) for m in ("none", "full", "op")})
    work = Workload.from_preset("llama3-8b", micro_batch_size=3, tokens_per_micro_batch=48,
                                checkpointing=parse_checkpointing(mode), traced_memory=traced)
    pred = predict(ModelInputs(work, Compute(gpu="h100-sxm", micro_batch_time_s=1.0),
                               Cluster(RingComm(100.0, 1.0, 2), 1, 2)))
    parts = pred.strategies["ddp_synced"].memory.parts_gb
    model, tokens, loss_fn = build("llama3-8b", micro_batch=3, seq_len=16, n_layer=4, sizes=SIZES, ac=mode)
    hooked = saved_activation_bytes(model, tokens, loss_fn)
    assert (parts["activations"] + parts["logits"]) * 1e9 == pytest.approx(hooked.held_bytes, rel=1e-9)


def test_the_blocks_of_the_presets_and_the_synthetic_model_are_found():
    with on_meta():
        module, _, _, _ = build_on_meta(PRESETS, {"micro_batch": 1}, {"preset": "gpt2", "n_layer": 3, "seq_len": 8})
        assert repeated_blocks(module) == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
        assert repeated_blocks(module, "transformer.h") == repeated_blocks(module)
        assert repeated_blocks(module, "no.such.module") is None
        synthetic, _, _, _ = build_on_meta("topoprof.zoo.preset_modules:build_synthetic",
                                           {"micro_batch": 1, "seq_len": 8},
                                           {"params": 2_000_000, "n_layer": 2})
        assert repeated_blocks(synthetic) == ["blocks.0", "blocks.1"]


def test_a_pass_without_blocks_counts_no_split():
    def build_mlp():
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)), torch.randn(3, 4)

    with on_meta():
        module, batch = build_mlp()
        traced = trace_pass(module, batch, None, list(module.parameters()), CPU)
    assert traced.memory.kept is None and traced.memory.backward_transient_bytes >= 0


def test_tensors_after_the_blocks_of_equal_size_are_listed_in_the_order_their_ops_ran():
    import random

    from topoprof.trace.live_bytes import LiveBytes

    live = LiveBytes()
    kept = [torch.empty(4, device="meta") for _ in range(12)]
    ran_at = random.Random(0).sample(range(1, 13), 12)  # allocated in another order than the ops ran
    for tensor, index in zip(kept, ran_at):
        live.allocated(tensor, op_index=index, op=f"aten.op{index}")
    tail = live.kept([(0, 1)])["after_blocks_tensors"]  # the last block ends before op 1
    assert [row["op"] for row in tail] == [f"aten.op{i}" for i in range(1, 13)]
