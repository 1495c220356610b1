"""Parameter layouts of well-known models: which tensors, in which order, and how much backward
compute each one's use costs. The layout decides DDP's buckets and when each becomes ready.

A layout has
- `tensors`: the parameters in registration order (`model.parameters()`, tied weights once);
- `uses`: the forward pass in order; each use names the tensors it reads and its backward
  FLOPs per token. A weight matrix used as a matmul costs 4 * numel per token in backward
  (2 * numel for the input gradient, 2 * numel for the weight gradient; forward is 2 * numel,
  Kaplan et al. 2020 "Scaling Laws for Neural Language Models" §2.1). Embedding lookups, norms
  and biases cost ~0. Attention score/value products (no parameters) are left out, as in
  Kaplan's C ~= 6N.

Backward runs the uses in reverse. A tensor's gradient is ready when the backward of its
last use in that reverse walk ends: a tied weight (GPT-2's wte, used by the input lookup and
the LM head) is ready only at the very end, although the LM head's backward is the heavy one.

Shapes come from the Hugging Face configs named in each preset's `source`; the totals are
checked in tests (gpt2 124,439,808; gpt2-medium 354,823,168; bert-base-uncased 109,482,240
with pooler; llama-7b 6,738,415,616).

The vision presets (VISION_PRESETS: torchvision's ResNet and ResNeXt, `topoprof.model.vision`)
count per image instead of per token (`Layout.unit`): a micro-batch of B images is B "tokens".
Their convolutions are not matmuls of their weights, so each use carries its forward FLOPs too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from topoprof.errors import InputError

MATMUL_BACKWARD_FLOPS_PER_PARAM = 4  # per token: dX and dW, 2 FLOPs each (Kaplan et al. 2020)
MATMUL_FORWARD_FLOPS_PER_PARAM = 2  # per token: one multiply-add (Kaplan et al. 2020 §2.1)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Use:
    """One step of the forward pass: the tensors it reads and its backward cost per token; its
    forward cost when it is not a matmul's half of backward (None: it is)."""

    tensors: tuple[int, ...]
    backward_flops_per_token: float
    forward_flops_per_token: float | None = None


@dataclass(frozen=True)
class ReadyTensor:
    index: int  # into Layout.tensors
    ready_fraction: float  # share of backward compute done when its gradient is ready


@dataclass(frozen=True)
class Layout:
    name: str
    tensors: tuple[TensorSpec, ...]
    uses: tuple[Use, ...]
    source: str
    unit: str = "token"  # what the "per token" figures are per: "token", or "image" for a CNN

    def __post_init__(self) -> None:
        used = {i for use in self.uses for i in use.tensors}
        unused = [self.tensors[i].name for i in range(len(self.tensors)) if i not in used]
        if unused or not self.tensors:
            raise InputError(f"layout {self.name!r}: tensors without a use: {unused[:5]}")
        if self.backward_flops_per_token <= 0:
            raise InputError(f"layout {self.name!r} has no matmul compute to spread backward over")

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def backward_flops_per_token(self) -> float:
        return sum(u.backward_flops_per_token for u in self.uses)

    @property
    def forward_flops_per_token(self) -> float:
        """Each use's own forward figure, or half its backward (a matmul: 2 of its 6)."""
        return sum(u.backward_flops_per_token * MATMUL_FORWARD_FLOPS_PER_PARAM / MATMUL_BACKWARD_FLOPS_PER_PARAM
                   if u.forward_flops_per_token is None else u.forward_flops_per_token for u in self.uses)

    @property
    def train_flops_per_token(self) -> float:
        """Forward + backward: (2 + 4) FLOPs per matmul parameter use; ~6N per token. A use with
        its own forward figure adds what it differs from half its backward (a CNN's stem conv,
        whose input needs no gradient: backward 1x forward, not 2x)."""
        per_param = MATMUL_FORWARD_FLOPS_PER_PARAM + MATMUL_BACKWARD_FLOPS_PER_PARAM
        matmul = self.backward_flops_per_token * per_param / MATMUL_BACKWARD_FLOPS_PER_PARAM
        return matmul + sum(u.forward_flops_per_token - u.backward_flops_per_token * MATMUL_FORWARD_FLOPS_PER_PARAM
                            / MATMUL_BACKWARD_FLOPS_PER_PARAM for u in self.uses
                            if u.forward_flops_per_token is not None)

    def ready_schedule(self) -> tuple[ReadyTensor, ...]:
        """Tensors in gradient-ready order with the share of backward done at that moment.

        Within one use the tensors become ready in reverse of their listing (a Linear's bias
        before its weight, as autograd runs AccumulateGrad nodes: newest first)."""
        # Summed in the same order as `done` below, so the last use lands on exactly 1.0.
        total = sum(u.backward_flops_per_token for u in reversed(self.uses))
        done = 0.0
        ready: dict[int, tuple[float, int]] = {}
        position = 0
        for use in reversed(self.uses):
            done += use.backward_flops_per_token
            for index in reversed(use.tensors):
                ready[index] = (done / total, position)  # later overwrite = last use
                position += 1
        order = sorted(ready.items(), key=lambda item: (item[1][0], item[1][1]))
        return tuple(ReadyTensor(index, fraction) for index, (fraction, _) in order)


class LayoutBuilder:
    """Collects tensors in registration order and uses in forward order."""

    def __init__(self) -> None:
        self.tensors: list[TensorSpec] = []
        self.uses: list[Use] = []
        self._index: dict[str, int] = {}

    def param(self, name: str, *shape: int) -> str:
        self._index[name] = len(self.tensors)
        self.tensors.append(TensorSpec(name, tuple(shape)))
        return name

    def use(self, *names: str, flops_per_token: float = 0.0, forward_flops_per_token: float | None = None) -> None:
        """`flops_per_token` is the use's backward; its forward is half that unless given."""
        self.uses.append(Use(tuple(self._index[n] for n in names), flops_per_token, forward_flops_per_token))

    def matmul(self, weight: str, bias: str | None = None, tokens_share: float = 1.0) -> None:
        """A Linear/Conv1D: 4 * numel(weight) backward FLOPs per token it is applied to."""
        numel = self.tensors[self._index[weight]].numel
        names = (weight,) if bias is None else (weight, bias)
        self.use(*names, flops_per_token=MATMUL_BACKWARD_FLOPS_PER_PARAM * numel * tokens_share)

    def norm(self, prefix: str, dim: int, bias: bool = True) -> tuple[str, ...]:
        names = (self.param(f"{prefix}.weight", dim),)
        if bias:
            names += (self.param(f"{prefix}.bias", dim),)
        return names

    def linear(self, prefix: str, d_in: int, d_out: int, bias: bool = True) -> tuple[str, ...]:
        """nn.Linear registers weight (d_out, d_in) then bias."""
        names = (self.param(f"{prefix}.weight", d_out, d_in),)
        if bias:
            names += (self.param(f"{prefix}.bias", d_out),)
        return names

    def build(self, name: str, source: str, unit: str = "token") -> Layout:
        return Layout(name, tuple(self.tensors), tuple(self.uses), source, unit)




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
                 source: str = "https://huggingface.co/huggyllama/llama-7b/blob/main/config.json"
                 ) -> Layout:
    """HF LlamaForCausalLM: no biases, RMSNorm weights only, untied lm_head. A decoder layer
    registers self_attn, mlp, then its two norms, but uses input_layernorm first."""
    b = LayoutBuilder()
    emb = b.param("model.embed_tokens.weight", vocab_size, hidden)
    b.use(emb)
    for i in range(n_layer):
        p = f"model.layers.{i}"
        attn = [b.linear(f"{p}.self_attn.{x}_proj", hidden, hidden, bias=False)[0]
                for x in ("q", "k", "v", "o")]
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


PRESETS: dict[str, Callable[[], Layout]] = {
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
}

# Image classifiers, built at an image size (`topoprof.model.vision`, which builds on the
# LayoutBuilder above and is imported when one is asked for); their names are torchvision's.
VISION_PRESETS = ("resnet50", "resnet101", "resnext50_32x4d", "resnext101_32x8d")


def _vision(name: str) -> Callable[..., Layout]:
    def build(image_size: int | None = None) -> Layout:
        from topoprof.model.vision import resnet_layout

        return resnet_layout(name, image_size)
    return build


PRESETS.update({name: _vision(name) for name in VISION_PRESETS})


# Blocks and the longest sequence of each text preset (the configs cited in the layouts above: learned
# position embeddings; LLaMA's context length), for timing them as torch modules without importing torch.
# The vision presets have neither: they are timed whole (the largest, 88.8M parameters, fits any GPU).
PRESET_DEPTH = {"gpt2": 12, "gpt2-medium": 24, "bert-base": 12, "gpt3-xl": 24, "llama-7b": 32}
MAX_SEQ_LEN = {"gpt2": 1024, "gpt2-medium": 1024, "bert-base": 512, "gpt3-xl": 2048, "llama-7b": 2048}


def is_vision(name: str | None) -> bool:
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
