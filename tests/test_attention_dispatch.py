"""Attention in the trace as the target device runs it (`topoprof.trace.target_lens`): each way a
model calls `scaled_dot_product_attention` reaches the kernel torch's dispatcher would pick on the
target (`topoprof.trace.sdpa_dispatch` for CUDA, torch's own choice on a CPU), and no fused kernel
keeps a score matrix."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from topoprof.specs.traced_pass import TracedOp, TracedPass, TraceTarget
from topoprof.trace.meta_device import on_meta
from topoprof.trace.op_trace import trace_pass

B, H, KV, S, E = 2, 8, 2, 128, 32  # a score matrix (B H S S) is larger than any other tensor here
A100, H100, T4 = [8, 0], [9, 0], [7, 5]


class Attend(nn.Module):
    """q, k, v projections and one SDPA call with the options given."""

    def __init__(self, kv_heads=H, **sdpa):
        super().__init__()
        self.q, self.kv_heads = nn.Linear(E, H * E), kv_heads
        self.k, self.v = nn.Linear(E, kv_heads * E), nn.Linear(E, kv_heads * E)
        self.sdpa = sdpa

    def forward(self, x):
        q = self.q(x).view(B, S, H, E).transpose(1, 2)
        k, v = (f(x).view(B, S, self.kv_heads, E).transpose(1, 2) for f in (self.k, self.v))
        sdpa = dict(self.sdpa)
        if sdpa.get("attn_mask") == "bool":
            sdpa["attn_mask"] = torch.ones(S, S, dtype=torch.bool).tril()
        elif sdpa.get("attn_mask") == "float":
            sdpa["attn_mask"] = torch.zeros(S, S, dtype=x.dtype)
        return F.scaled_dot_product_attention(q, k, v, **sdpa).float().mean()


def _trace(module, target, width=E):
    with on_meta():
        module = module.to("meta")
        batch = torch.empty(B, S, width)
        return trace_pass(module, batch, lambda out, _: out, list(module.parameters()), target)


def _attention_ops(trace: TracedPass) -> set[str]:
    return {op.name.split(".")[1] for op in trace.ops if "scaled_dot_product" in op.name}


def _score_ops(trace: TracedPass) -> list[TracedOp]:
    """Ops that write a b x h x s x s tensor: the scores or their softmax."""
    return [op for op in trace.ops
            if any(n == B * H * S * S * 4 or n == B * H * S * S * 2 for n in op.outputs or ())
            and "scaled_dot_product" not in op.name]


CUDA_CASES = [
    # (what the model passes, target GPU, precision, the backend torch's dispatcher picks)
    (dict(is_causal=True), A100, "bf16", "flash"),
    (dict(is_causal=True, enable_gqa=True, kv_heads=KV), A100, "bf16", "flash"),  # Hugging Face's GQA call
    (dict(attn_mask="bool"), A100, "bf16", "efficient"),      # flash takes no mask
    (dict(attn_mask="float"), A100, "bf16", "efficient"),
    (dict(is_causal=True), A100, "fp32", "efficient"),        # flash is 16-bit only
    (dict(is_causal=True), T4, "fp16", "efficient"),          # flash needs sm80
    (dict(attn_mask="bool", enable_gqa=True, kv_heads=KV), A100, "bf16", "math"),  # efficient has no GQA before 2.14
    # on sm90 torch 2.11+ puts cuDNN first (its wheels' cuDNN is past 9.15: sdpa_dispatch.prefers_cudnn)
    (dict(is_causal=True, enable_gqa=True, kv_heads=KV), H100, "bf16", "cudnn-from-2.11"),
]


@pytest.mark.parametrize("sdpa,capability,precision,backend", CUDA_CASES)
def test_each_call_form_runs_the_kernel_its_rule_names(sdpa, capability, precision, backend):
    from topoprof.trace.target_lens import TORCH_VERSION

    if backend == "math" and TORCH_VERSION >= (2, 14):
        pytest.skip("the memory-efficient kernel takes GQA natively from torch 2.14 (sdpa_dispatch)")
    if backend == "cudnn-from-2.11":
        backend = "cudnn" if TORCH_VERSION >= (2, 11) else "flash"
    kv_heads = sdpa.pop("kv_heads", H)
    trace = _trace(Attend(kv_heads, **sdpa), TraceTarget("cuda", precision, capability=capability))
    assert trace.attention.calls == {backend: 1}
    if backend == "math":
        assert _attention_ops(trace) <= {"_safe_softmax"} and _score_ops(trace)  # the scores, as the GPU keeps them
    else:
        assert _attention_ops(trace) == {f"_scaled_dot_product_{backend}_attention",
                                         f"_scaled_dot_product_{backend}_attention_backward"}
        assert _score_ops(trace) == []


def test_a_forced_backend_runs_as_the_model_attends():
    trace = _trace(Attend(is_causal=True),
                   TraceTarget("cuda", "fp32", capability=A100, attention="flash"))
    assert trace.attention.calls == {"flash": 1}


def test_the_cpu_target_takes_torchs_own_cpu_choice():
    trace = _trace(Attend(KV, is_causal=True, enable_gqa=True), TraceTarget("cpu"))
    expected = torch._fused_sdp_choice(torch.zeros(B, H, S, E), torch.zeros(B, KV, S, E), torch.zeros(B, KV, S, E),
                                       None, 0.0, True, enable_gqa=True)
    assert trace.attention.calls == {"flash" if expected == 1 else "math": 1}


class EncoderStack(nn.Module):
    """nn.TransformerEncoderLayer blocks, as a user stacks them, with or without a causal mask."""

    def __init__(self, causal: bool, hint: bool):
        super().__init__()
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(H * 8, H, 4 * H * 8, batch_first=True)
                                    for _ in range(2))
        self.causal, self.hint = causal, hint

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(S, dtype=x.dtype) if self.causal else None
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=self.hint and self.causal)
        return x.float().mean()


def test_checkpointed_transformer_encoder_layers_recompute_through_the_fused_kernel():
    """Under full activation checkpointing the recompute in backward calls nn.MultiheadAttention
    again, inside torch.utils.checkpoint's own device context: it runs the fused kernel again."""
    from topoprof.zoo.checkpoint_wrap import apply_activation_checkpointing, children_of

    with on_meta():
        module = EncoderStack(True, True).to("meta")
        module = apply_activation_checkpointing(module, "full", children_of(module, "layers"))
        trace = trace_pass(module, torch.empty(B, S, H * 8), lambda out, _: out, list(module.parameters()),
                           TraceTarget("cuda", "bf16", capability=A100))
    assert trace.attention.calls == {"flash": 4}  # two blocks, each forward and recompute
    assert trace.totals.recompute.ops > 0 and _score_ops(trace) == []


@pytest.mark.parametrize("causal,hint,backend", [(False, False, "flash"), (True, True, "flash"),
                                                 (True, False, "efficient")])
def test_transformer_encoder_layers_keep_no_score_matrix(causal, hint, backend):
    """nn.MultiheadAttention calls SDPA inside F.multi_head_attention_forward in training
    (need_weights=False): with is_causal it drops the mask, else its float mask reaches the kernel."""
    trace = _trace(EncoderStack(causal, hint), TraceTarget("cuda", "bf16", capability=A100),
                   width=H * 8)
    assert trace.attention.calls == {backend: 2}
    assert _score_ops(trace) == []


def test_a_hugging_face_llama_attends_by_the_fused_kernel():
    """HF's `sdpa` attention passes enable_gqa=True and is_causal=True with no mask: the flash kernel on
    an A100, never the math path's scores."""
    pytest.importorskip("transformers")
    from pathlib import Path

    from topoprof.trace.op_trace import trace_user_model

    config = Path(__file__).parent / "fixtures" / "hf" / "llama"
    trace = trace_user_model(f"hf:{config}", {"micro_batch": 2, "seq_len": 32}, None,
                             TraceTarget("cuda", "bf16", capability=A100))
    assert isinstance(trace, TracedPass), trace
    assert set(trace.attention.calls) == {"flash"}
    assert not any("_safe_softmax" in op.name or op.name == "aten.bmm.default" for op in trace.ops)


@pytest.mark.parametrize("callable_name,recomputes", [("hf_llama", False), ("hf_checkpointed", True)])
def test_a_users_own_hugging_face_model_traces_with_its_own_checkpointing(callable_name, recomputes):
    """A Hugging Face model the user's code builds (and checkpoints with activation_checkpointing_enable)
    runs on meta as the tool's hf: builder does: its mask code's data-dependent check answered for
    meta tensors (`hf_models.install_meta_patches`), its attention by the fused kernel, its
    recompute traced."""
    pytest.importorskip("transformers")
    from pathlib import Path

    from topoprof.trace.op_trace import trace_user_model

    blocks = Path(__file__).parent / "fixtures" / "user_models" / "blocks.py"
    trace = trace_user_model(f"{blocks}:{callable_name}", {"micro_batch": 2, "seq_len": 32}, None,
                             TraceTarget("cuda", "bf16", capability=A100))
    assert isinstance(trace, TracedPass), trace
    assert set(trace.attention.calls) == {"flash"}
    assert (trace.totals.recompute.ops > 0) == recomputes
