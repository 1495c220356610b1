"""The presets as torch modules at their real size, for timing on a GPU: each callable returns
`(module, example_batch, loss_fn)` like a user's `--model` callable, so the same worker
(`probes/user_model.py`) times them.

The modules follow the Hugging Face architectures that `topoprof/model/presets.py` lists tensor
by tensor (GPT2LMHeadModel, BertModel with its pooler, LlamaForCausalLM): the same parameter
names, shapes and registration order, so the measured buckets and the preset's layout agree
(`tests/test_preset_models.py` checks it on the meta device). Attention is PyTorch's fused
`scaled_dot_product_attention`, as HF uses by default (`attn_implementation="sdpa"`); LLaMA's
rotary position embedding has no parameters and a small share of the FLOPs, and is left out.

`n_layer` builds fewer blocks: a model too large for one GPU is timed at two depths and
extrapolated linearly in the block count (`topoprof/model/scaled.py`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _causal_attention(q, k, v, heads: int):
    b, t, d = q.shape
    split = lambda x: x.view(b, t, heads, d // heads).transpose(1, 2)  # noqa: E731
    out = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    return out.transpose(1, 2).reshape(b, t, d)


class _Conv1D(nn.Module):
    """HF GPT-2's Conv1D: a linear layer whose weight is stored (in, out)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class _Gpt2Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = _Conv1D(d, 3 * d), _Conv1D(d, d), heads

    def forward(self, x):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)
        return self.c_proj(_causal_attention(q, k, v, self.heads))


class _Gpt2Mlp(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.c_fc, self.c_proj = _Conv1D(d, 4 * d), _Conv1D(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _Gpt2Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), _Gpt2Attention(d, heads)
        self.ln_2, self.mlp = nn.LayerNorm(d), _Gpt2Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _Gpt2Body(nn.Module):
    def __init__(self, n_layer: int, d: int, heads: int, positions: int, vocab: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.h = nn.ModuleList(_Gpt2Block(d, heads) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)


class Gpt2(nn.Module):
    """GPT2LMHeadModel: the LM head is tied to the token embedding (no parameter of its own)."""

    def __init__(self, n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257):
        super().__init__()
        self.transformer = _Gpt2Body(n_layer, n_embd, n_head, n_positions, vocab_size)

    def forward(self, tokens):
        t = self.transformer
        h = t.wte(tokens) + t.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in t.h:
            h = block(h)
        return F.linear(t.ln_f(h), t.wte.weight)


class _BertLayer(nn.Module):
    def __init__(self, d: int, inter: int, heads: int):
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        for name in ("query", "key", "value"):
            setattr(self.attention.self, name, nn.Linear(d, d))
        self.attention.output = nn.Module()
        self.attention.output.dense, self.attention.output.LayerNorm = nn.Linear(d, d), nn.LayerNorm(d)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, inter)
        self.output = nn.Module()
        self.output.dense, self.output.LayerNorm = nn.Linear(inter, d), nn.LayerNorm(d)
        self.heads = heads

    def forward(self, x):
        s, b, t = self.attention.self, x.shape[0], x.shape[1]
        split = lambda y: y.view(b, t, self.heads, -1).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(s.query(x)), split(s.key(x)), split(s.value(x)))
        a = a.transpose(1, 2).reshape(b, t, -1)
        x = self.attention.output.LayerNorm(x + self.attention.output.dense(a))
        return self.output.LayerNorm(x + self.output.dense(F.gelu(self.intermediate.dense(x))))


class Bert(nn.Module):
    """BertModel with its pooler (the pooler reads the [CLS] token only)."""

    def __init__(self, n_layer=12, hidden=768, intermediate=3072, heads=12, vocab_size=30522,
                 max_positions=512, type_vocab=2):
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.embeddings.position_embeddings = nn.Embedding(max_positions, hidden)
        self.embeddings.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.embeddings.LayerNorm = nn.LayerNorm(hidden)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(_BertLayer(hidden, intermediate, heads) for _ in range(n_layer))
        self.pooler = nn.Module()
        self.pooler.dense = nn.Linear(hidden, hidden)

    def forward(self, tokens):
        e = self.embeddings
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = e.LayerNorm(e.word_embeddings(tokens) + e.position_embeddings(positions)
                        + e.token_type_embeddings(torch.zeros_like(tokens)))
        for layer in self.encoder.layer:
            h = layer(h)
        return h, torch.tanh(self.pooler.dense(h[:, 0]))


class _RmsNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class _LlamaLayer(nn.Module):
    """Registers self_attn, mlp, then the two norms (as HF does); uses input_layernorm first."""

    def __init__(self, d: int, inter: int, heads: int):
        super().__init__()
        self.self_attn = nn.Module()
        for name in ("q", "k", "v", "o"):
            setattr(self.self_attn, f"{name}_proj", nn.Linear(d, d, bias=False))
        self.mlp = nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = nn.Linear(d, inter, bias=False), nn.Linear(d, inter, bias=False)
        self.mlp.down_proj = nn.Linear(inter, d, bias=False)
        self.input_layernorm, self.post_attention_layernorm = _RmsNorm(d), _RmsNorm(d)
        self.heads = heads

    def forward(self, x):
        a, h = self.self_attn, self.input_layernorm(x)
        x = x + a.o_proj(_causal_attention(a.q_proj(h), a.k_proj(h), a.v_proj(h), self.heads))
        h, m = self.post_attention_layernorm(x), self.mlp
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class Llama(nn.Module):
    def __init__(self, n_layer=32, hidden=4096, intermediate=11008, heads=32, vocab_size=32000):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab_size, hidden)
        self.model.layers = nn.ModuleList(_LlamaLayer(hidden, intermediate, heads) for _ in range(n_layer))
        self.model.norm = _RmsNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)

    def forward(self, tokens):
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h)
        return self.lm_head(self.model.norm(h))


def _next_token_loss(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def _bert_loss(out, tokens):
    sequence, pooled = out
    return sequence.float().pow(2).mean() + pooled.float().pow(2).mean()


# name: (module class, its kwargs, vocabulary size, loss)
PRESET_MODULES = {
    "gpt2": (Gpt2, {"n_layer": 12}, 50257, _next_token_loss),
    "gpt2-medium": (Gpt2, {"n_layer": 24, "n_embd": 1024, "n_head": 16}, 50257, _next_token_loss),
    "bert-base": (Bert, {"n_layer": 12}, 30522, _bert_loss),
    # 2048 / 16 heads = 128 per head, GPT-3's d_head (its table's 24 heads would not divide 2048)
    "gpt3-xl": (Gpt2, {"n_layer": 24, "n_embd": 2048, "n_head": 16, "n_positions": 2048}, 50257, _next_token_loss),
    "llama-7b": (Llama, {"n_layer": 32}, 32000, _next_token_loss),
}



def build(preset: str, micro_batch: int = 1, seq_len: int = 1024, n_layer: int | None = None, seed: int = 0):
    """(module, example_batch, loss_fn) of a preset at its real size (or with `n_layer` blocks)."""
    cls, kwargs, vocab, loss = PRESET_MODULES[preset]
    if n_layer is not None:
        kwargs = {**kwargs, "n_layer": n_layer}
    torch.manual_seed(seed)
    tokens = torch.randint(0, vocab, (micro_batch, seq_len))
    return cls(**kwargs), tokens, loss
