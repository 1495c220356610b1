"""The LLaMA family as torch modules (`topoprof/zoo/preset_modules.py` lists them as presets): Hugging
Face's LlamaForCausalLM (transformers/models/llama/modeling_llama.py), its parameter names,
shapes and registration order, with

- grouped-query attention: `kv_heads` key/value heads shared by `heads // kv_heads` query heads,
  repeated before attention as HF's `repeat_kv` does (and torchtitan's llama3 model), then
  PyTorch's fused `scaled_dot_product_attention`, causal;
- the SwiGLU feed-forward (`down(silu(gate(x)) * up(x))`) at Meta's size (`swiglu_hidden`);
- RMSNorm in fp32, cast back (HF's LlamaRMSNorm, torchtitan's `rmsnorm`): autograd keeps the
  fp32 upcast and the normalized 16-bit tensor of each norm; or, with `norm="fused"`, one kernel
  that keeps only its input and the fp32 reciprocal RMS per row (torchtitan's `fused_rmsnorm`, a
  Triton kernel saving `x, weight, rstd`: torchtitan/models/norms.py `TritonFusedRMSNorm`; torch's
  `_fused_rms_norm` behind `F.rms_norm` on CUDA keeps the same). Its ops are traced as the eager
  ones, one kernel each: the fused kernel's memory, not its time;
- rotary position embedding as HF applies it: cos and sin of the positions over `rope_theta`,
  computed once per forward in fp32 and cast to the hidden states' dtype (HF's
  LlamaRotaryEmbedding; its frequencies a buffer, not a parameter), then `q * cos +
  rotate_half(q) * sin` for queries and keys in each layer (`apply_rotary_pos_emb`), in the
  dtype that promotes to: under autocast the stream is fp32, so the rotated queries and keys are
  too, and attention casts them back. Llama 3.1's frequency scaling (`rope_scaling`) changes the
  frequencies' values, not the cost;
- untied input embedding and LM head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from topoprof.workload.presets import RMSNORMS


def swiglu_hidden(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """Meta's feed-forward width (llama/model.py and llama3/model.py, `FeedForward`): 2/3 of 4 x
    dim, times `ffn_dim_multiplier`, rounded up to a multiple of `multiple_of`."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    """A published configuration: HF's config.json names in comments."""

    n_layer: int            # num_hidden_layers
    hidden: int             # hidden_size
    intermediate: int       # intermediate_size
    heads: int              # num_attention_heads
    kv_heads: int           # num_key_value_heads
    vocab_size: int         # vocab_size
    rope_theta: float       # rope_theta
    norm_eps: float         # rms_norm_eps
    seq_len: int            # max_position_embeddings of the release: the default sequence
    source: str

    def kwargs(self) -> dict:
        return {"n_layer": self.n_layer, "hidden": self.hidden, "intermediate": self.intermediate,
                "heads": self.heads, "kv_heads": self.kv_heads, "vocab_size": self.vocab_size,
                "rope_theta": self.rope_theta, "norm_eps": self.norm_eps}


_HF = "https://huggingface.co/{}/blob/main/config.json"
LLAMA_CONFIGS = {
    # LLaMA 1 7B; Meta's params.json: dim 4096, multiple_of 256 -> swiglu_hidden 11008
    "llama-7b": LlamaConfig(32, 4096, 11008, 32, 32, 32000, 10000.0, 1e-6, 2048, _HF.format("huggyllama/llama-7b")),
    # Llama 2: params.json dim 5120, multiple_of 256 -> 13824; dim 8192, multiple_of 4096,
    # ffn_dim_multiplier 1.3, n_kv_heads 8 -> 28672; rope_theta 10000 (HF's default)
    "llama2-13b": LlamaConfig(40, 5120, 13824, 40, 40, 32000, 10000.0, 1e-5, 4096,
                              _HF.format("meta-llama/Llama-2-13b-hf")),
    "llama2-70b": LlamaConfig(80, 8192, 28672, 64, 8, 32000, 10000.0, 1e-5, 4096,
                              _HF.format("meta-llama/Llama-2-70b-hf")),
    # Llama 3 (and 3.1, the same tensors): params.json dim 4096, multiple_of 1024,
    # ffn_dim_multiplier 1.3 -> 14336; dim 8192, multiple_of 4096, 1.3 -> 28672; n_kv_heads 8,
    # vocab_size 128256, rope_theta 500000, norm_eps 1e-5; trained at 8192 tokens
    "llama3-8b": LlamaConfig(32, 4096, 14336, 32, 8, 128256, 500000.0, 1e-5, 8192,
                             _HF.format("meta-llama/Meta-Llama-3-8B")),
    "llama3-70b": LlamaConfig(80, 8192, 28672, 64, 8, 128256, 500000.0, 1e-5, 8192,
                              _HF.format("meta-llama/Meta-Llama-3-70B")),
}



class _FusedRmsNorm(torch.autograd.Function):
    """RMSNorm as one kernel computes it: fp32 inside, the output in the input's dtype, and for
    backward only the input, the weight and the fp32 reciprocal RMS per row (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(_at_least_fp32(x).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (_at_least_fp32(x) * rstd * _at_least_fp32(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        x_hat, wdy = _at_least_fp32(x) * rstd, _at_least_fp32(weight) * _at_least_fp32(dy)
        dx = (wdy - x_hat * (x_hat * wdy).mean(-1, keepdim=True)) * rstd
        dw = (_at_least_fp32(dy) * x_hat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


def _at_least_fp32(t):
    return t.float() if t.element_size() < 4 else t


class _RmsNorm(nn.Module):
    def __init__(self, d: int, eps: float, fused: bool = False):
        super().__init__()
        self.weight, self.eps, self.fused = nn.Parameter(torch.ones(d)), eps, fused

    def forward(self, x):
        if self.fused:
            return _FusedRmsNorm.apply(x, self.weight, self.eps)
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class _Rotary(nn.Module):
    """HF's LlamaRotaryEmbedding: inverse frequencies as a buffer; cos and sin per position."""

    inv_freq: torch.Tensor  # registered as a buffer

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, seq_len: int, dtype):
        positions = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x, cos, sin):
    return x * cos + _rotate_half(x) * sin


def _repeat_kv(x, n_rep: int):
    """HF's repeat_kv: (batch, kv_heads, seq, dim) -> (batch, kv_heads * n_rep, seq, dim)."""
    if n_rep == 1:
        return x
    b, kv, t, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


class _LlamaLayer(nn.Module):
    """Registers self_attn, mlp, then the two norms (as HF does); uses input_layernorm first."""

    def __init__(self, d: int, inter: int, heads: int, kv_heads: int, eps: float, fused_norm: bool = False):
        super().__init__()
        head_dim = d // heads
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, heads * head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(heads * head_dim, d, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = nn.Linear(d, inter, bias=False), nn.Linear(d, inter, bias=False)
        self.mlp.down_proj = nn.Linear(inter, d, bias=False)
        self.input_layernorm = _RmsNorm(d, eps, fused_norm)
        self.post_attention_layernorm = _RmsNorm(d, eps, fused_norm)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

    def _attention(self, h, cos, sin):
        a, (b, t, _) = self.self_attn, h.shape
        q = a.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = a.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = a.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        n_rep = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(q, _repeat_kv(k, n_rep), _repeat_kv(v, n_rep), is_causal=True)
        return a.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))

    def forward(self, x, cos, sin):
        x = x + self._attention(self.input_layernorm(x), cos, sin)
        h, m = self.post_attention_layernorm(x), self.mlp
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class Llama(nn.Module):
    """LlamaForCausalLM; `kv_heads` None: as many as the query heads (LLaMA 1, Llama 2 7B/13B)."""

    BLOCKS = ("model.layers",)  # the repeated blocks (topoprof/zoo/preset_modules.py:preset_blocks)

    def __init__(self, n_layer=32, hidden=4096, intermediate=11008, heads=32, kv_heads=None, vocab_size=32000,
                 rope_theta=10000.0, norm_eps=1e-6, norm="eager"):
        super().__init__()
        if norm not in RMSNORMS:
            raise ValueError(f"Llama: norm {norm!r} is not one of {', '.join(RMSNORMS)}")
        kv_heads = heads if kv_heads is None else kv_heads
        if hidden % heads or heads % kv_heads:
            raise ValueError(f"Llama: hidden({hidden}) % heads({heads}) and heads({heads}) % kv_heads({kv_heads}) "
                             "must both be 0")
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab_size, hidden)
        self.model.layers = nn.ModuleList(_LlamaLayer(hidden, intermediate, heads, kv_heads, norm_eps, norm == "fused")
                                          for _ in range(n_layer))
        self.model.norm = _RmsNorm(hidden, norm_eps, norm == "fused")
        self.model.rotary_emb = _Rotary(hidden // heads, rope_theta)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, tokens):
        h = self.model.embed_tokens(tokens)
        cos, sin = self.model.rotary_emb(tokens.shape[1], h.dtype)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.lm_head(self.model.norm(h))
