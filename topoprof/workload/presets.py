"""Parameter layouts of well-known models: which tensors, in which order, and how much backward
compute each one's use costs. The layout decides DDP's buckets and when each becomes ready.

Shapes come from the Hugging Face configs named in each preset's `source`; the totals are
checked in tests (gpt2 124,439,808; gpt2-medium 354,823,168; bert-base-uncased 109,482,240
with pooler; llama-7b 6,738,415,616; llama3-8b 8,030,261,248, llama3-70b 70,553,706,496,
llama2-13b 13,015,864,320, llama2-70b 68,976,648,192).

The vision presets (VISION_PRESETS: torchvision's ResNet and ResNeXt, `topoprof.workload.vision`)
count per image instead of per token (`Layout.unit`): a micro-batch of B images is B "tokens".
Their convolutions are not matmuls of their weights, so each use carries its forward FLOPs too.
"""
from __future__ import annotations

from typing import Callable, TypeGuard

from topoprof.errors import InputError
from topoprof.workload.layout import Layout, LayoutBuilder
from topoprof.workload.vision import resnet_layout


def gpt2_layout(n_layer: int = 12, n_embd: int = 768, n_positions: int = 1024,
                vocab_size: int = 50257, name: str = "gpt2",
                source: str = "https://huggingface.co/openai-community/gpt2/blob/main/config.json"
                ) -> Layout:
    """HF GPT2LMHeadModel: Conv1D weights are (in, out); lm_head is tied to wte."""
    b = LayoutBuilder()
    wte = b.param("transformer.wte.weight", vocab_size, n_embd)
    wpe = b.param("transformer.wpe.weight", n_positions, n_embd)
    b.use(wte)
    b.use(wpe)
    for i in range(n_layer):
        p = f"transformer.h.{i}"
        ln_1 = b.norm(f"{p}.ln_1", n_embd)
        c_attn = (b.param(f"{p}.attn.c_attn.weight", n_embd, 3 * n_embd),
                  b.param(f"{p}.attn.c_attn.bias", 3 * n_embd))
        a_proj = (b.param(f"{p}.attn.c_proj.weight", n_embd, n_embd),
                  b.param(f"{p}.attn.c_proj.bias", n_embd))
        ln_2 = b.norm(f"{p}.ln_2", n_embd)
        c_fc = (b.param(f"{p}.mlp.c_fc.weight", n_embd, 4 * n_embd),
                b.param(f"{p}.mlp.c_fc.bias", 4 * n_embd))
        m_proj = (b.param(f"{p}.mlp.c_proj.weight", 4 * n_embd, n_embd),
                  b.param(f"{p}.mlp.c_proj.bias", n_embd))
        b.use(*ln_1)
        b.matmul(*c_attn)
        b.matmul(*a_proj)
        b.use(*ln_2)
        b.matmul(*c_fc)
        b.matmul(*m_proj)
    b.use(*b.norm("transformer.ln_f", n_embd))
    b.matmul(wte)  # tied LM head: the heaviest matmul, reusing the input embedding
    return b.build(name, source)


def bert_layout(n_layer: int = 12, hidden: int = 768, intermediate: int = 3072,
                vocab_size: int = 30522, max_positions: int = 512, type_vocab: int = 2,
                seq_len: int = 512, name: str = "bert-base",
                source: str = "https://huggingface.co/google-bert/bert-base-uncased/blob/main/"
                              "config.json") -> Layout:
    """HF BertModel with pooler. The pooler reads only the [CLS] token: 1/seq_len of tokens
    (seq_len defaults to the config's max_position_embeddings)."""
    b = LayoutBuilder()
    emb = (b.param("embeddings.word_embeddings.weight", vocab_size, hidden),
           b.param("embeddings.position_embeddings.weight", max_positions, hidden),
           b.param("embeddings.token_type_embeddings.weight", type_vocab, hidden))
    for e in emb:
        b.use(e)
    b.use(*b.norm("embeddings.LayerNorm", hidden))
    for i in range(n_layer):
        p = f"encoder.layer.{i}"
        qkv = [b.linear(f"{p}.attention.self.{x}", hidden, hidden)
               for x in ("query", "key", "value")]
        out = b.linear(f"{p}.attention.output.dense", hidden, hidden)
        ln1 = b.norm(f"{p}.attention.output.LayerNorm", hidden)
        inter = b.linear(f"{p}.intermediate.dense", hidden, intermediate)
        down = b.linear(f"{p}.output.dense", intermediate, hidden)
        ln2 = b.norm(f"{p}.output.LayerNorm", hidden)
        for names in (*qkv, out):
            b.matmul(*names)
        b.use(*ln1)
        b.matmul(*inter)
        b.matmul(*down)
        b.use(*ln2)
    b.matmul(*b.linear("pooler.dense", hidden, hidden), tokens_share=1.0 / seq_len)
    return b.build(name, source)


def llama_layout(n_layer: int = 32, hidden: int = 4096, intermediate: int = 11008,
                 vocab_size: int = 32000, name: str = "llama-7b",
                 source: str = "https://huggingface.co/huggyllama/llama-7b/blob/main/config.json",
                 heads: int = 32, kv_heads: int | None = None) -> Layout:
    """HF LlamaForCausalLM: no biases, RMSNorm weights only, untied lm_head. A decoder layer
    registers self_attn, mlp, then its two norms, but uses input_layernorm first. With grouped-
    query attention (`kv_heads` < `heads`, Ainslie et al. 2023) k_proj and v_proj produce
    kv_heads x head_dim = kv_heads x hidden / heads features."""
    kv = hidden if kv_heads is None else kv_heads * (hidden // heads)
    b = LayoutBuilder()
    emb = b.param("model.embed_tokens.weight", vocab_size, hidden)
    b.use(emb)
    for i in range(n_layer):
        p = f"model.layers.{i}"
        attn = [b.linear(f"{p}.self_attn.{x}_proj", hidden, hidden if x in ("q", "o") else kv, bias=False)[0]
                for x in ("q", "k", "v")]
        attn.append(b.linear(f"{p}.self_attn.o_proj", hidden, hidden, bias=False)[0])
        gate = b.linear(f"{p}.mlp.gate_proj", hidden, intermediate, bias=False)[0]
        up = b.linear(f"{p}.mlp.up_proj", hidden, intermediate, bias=False)[0]
        down = b.linear(f"{p}.mlp.down_proj", intermediate, hidden, bias=False)[0]
        ln_in = b.norm(f"{p}.input_layernorm", hidden, bias=False)
        ln_post = b.norm(f"{p}.post_attention_layernorm", hidden, bias=False)
        b.use(*ln_in)
        for w in attn:
            b.matmul(w)
        b.use(*ln_post)
        for w in (gate, up, down):
            b.matmul(w)
    b.use(*b.norm("model.norm", hidden, bias=False))
    b.matmul(b.linear("lm_head", hidden, vocab_size, bias=False)[0])
    return b.build(name, source)


# Today's Llama shapes: (layers, hidden, FFN, vocabulary, heads, KV heads, context) from the
# published configs: Meta's params.json / Hugging Face config.json (hidden_size,
# intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size,
# max_position_embeddings as torchtitan trains them: 8192 for Llama 3, 4096 for Llama 2).
LLAMA_CONFIGS = {
    "llama3-8b": (32, 4096, 14336, 128256, 32, 8, 8192,
                  "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"),
    "llama3-70b": (80, 8192, 28672, 128256, 64, 8, 8192,
                   "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json"),
    "llama2-13b": (40, 5120, 13824, 32000, 40, 40, 4096,
                   "https://huggingface.co/meta-llama/Llama-2-13b-hf/blob/main/config.json"),
    "llama2-70b": (80, 8192, 28672, 32000, 64, 8, 4096,
                   "https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json"),
}


# the presets built as topoprof/zoo/llama.py's Llama: the ones whose RMSNorm `--rmsnorm` picks
LLAMA_PRESETS = ("llama-7b", *LLAMA_CONFIGS)
RMSNORMS = ("eager", "fused")


def _llama(name: str) -> Callable[[], Layout]:
    layers, hidden, ffn, vocab, heads, kv, _, source = LLAMA_CONFIGS[name]
    return lambda: llama_layout(layers, hidden, ffn, vocab, name, source, heads, kv)


SYNTHETIC_CHUNKS = 100  # an explicit modelling choice, explained in synthetic_layout


def synthetic_layout(params: int, chunks: int = SYNTHETIC_CHUNKS) -> Layout:
    """`--params N` alone: N split into `chunks` equal matmul-like tensors used in sequence.

    With nothing known about the architecture, every chunk costs backward compute in
    proportion to its size, so gradients become ready at an even pace and the first
    registered chunk last. No embedding-like chunk is added: that would assume a structure
    (a large tensor ready only at the end) the user has not stated. 100 chunks keeps each
    one a fraction of a 25 MiB bucket for models up to ~650M fp32 parameters."""
    if params < 1:
        raise InputError(f"params must be >= 1, got {params}")
    chunks = min(chunks, params)
    base, extra = divmod(params, chunks)
    b = LayoutBuilder()
    for i in range(chunks):
        b.matmul(b.param(f"chunk.{i}", base + (1 if i < extra else 0)))
    return b.build(f"synthetic-{params}", f"synthetic: {chunks} equal chunks of {params} params")


PRESETS: dict[str, Callable[..., Layout]] = {
    "bert-base": bert_layout,
    "gpt2": gpt2_layout,
    "gpt2-medium": lambda: gpt2_layout(
        n_layer=24, n_embd=1024, name="gpt2-medium",
        source="https://huggingface.co/openai-community/gpt2-medium/blob/main/config.json"),
    # GPT-3 XL, 1.3B: "the same model and architecture as GPT-2" at n_layers 24, d_model 2048,
    # n_ctx 2048 (Brown et al. 2020, "Language Models are Few-Shot Learners", §2.1 and Table 2.1;
    # its alternating sparse attention has no parameters and is left out)
    "gpt3-xl": lambda: gpt2_layout(
        n_layer=24, n_embd=2048, n_positions=2048, name="gpt3-xl",
        source="Brown et al. 2020, Table 2.1 (GPT-3 XL), GPT-2 architecture"),
    "llama-7b": llama_layout,
    **{name: _llama(name) for name in LLAMA_CONFIGS},
}

# Image classifiers, built at an image size (`topoprof.workload.vision`, which builds on the
# LayoutBuilder above and is imported when one is asked for); their names are torchvision's.
VISION_PRESETS = ("resnet50", "resnet101", "resnext50_32x4d", "resnext101_32x8d")


def _vision(name: str) -> Callable[..., Layout]:
    def build(image_size: int | None = None) -> Layout:
        return resnet_layout(name, image_size)
    return build


PRESETS.update({name: _vision(name) for name in VISION_PRESETS})

# Blocks and the longest sequence of each text preset (the configs cited in the layouts above: learned
# position embeddings; LLaMA's context length), for timing them as torch modules without importing torch.
# The vision presets have neither: they are timed whole (the largest, 88.8M parameters, fits any GPU).
PRESET_DEPTH = {"gpt2": 12, "gpt2-medium": 24, "bert-base": 12, "gpt3-xl": 24, "llama-7b": 32,
                **{name: config[0] for name, config in LLAMA_CONFIGS.items()}}
MAX_SEQ_LEN = {"gpt2": 1024, "gpt2-medium": 1024, "bert-base": 512, "gpt3-xl": 2048, "llama-7b": 2048,
               **{name: config[6] for name, config in LLAMA_CONFIGS.items()}}


def context_sequences(name: str, micro_batch: int, tokens: int) -> tuple[int, int, int]:
    """How text preset `name` runs a micro-batch of `micro_batch` samples of `tokens` tokens in all:
    (sequences, tokens per sequence, sequences per sample). Each sample of tokens // micro_batch
    tokens is as many sequences of at most its context as hold it, of equal length (the few
    tokens an even split leaves over dropped): the attention never spans two samples."""
    per_sample_tokens = max(1, tokens // micro_batch)
    per_sample = -(-per_sample_tokens // MAX_SEQ_LEN[name.strip().lower()])
    return micro_batch * per_sample, per_sample_tokens // per_sample, per_sample


def is_vision(name: str | None) -> TypeGuard[str]:
    """A preset that reads images (and takes an image size), not tokens."""
    return name is not None and name.strip().lower() in VISION_PRESETS


def get_preset(name: str, image_size: int | None = None) -> Layout:
    """A preset's layout; `image_size` (pixels, square; default 224) for a vision preset only."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise InputError(f"unknown preset {name!r}; valid names: {', '.join(sorted(PRESETS))}")
    if key in VISION_PRESETS:
        return PRESETS[key](image_size)
    if image_size is not None:
        raise InputError(f"--image-size: {key} reads tokens, not images; an image size applies to "
                         f"{', '.join(VISION_PRESETS)}")
    return PRESETS[key]()
