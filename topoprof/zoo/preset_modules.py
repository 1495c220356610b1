"""The presets as torch modules at their real size, for timing on a GPU: each callable returns
`(module, example_batch, loss_fn)` like a user's `--model` callable, so the same worker
(`probes/ranks/model_timing.py`) times them.

The modules follow the Hugging Face architectures that `topoprof/workload/presets.py` lists tensor
by tensor (GPT2LMHeadModel, BertModel with its pooler, LlamaForCausalLM): the same parameter
names, shapes and registration order, so the measured buckets and the preset's layout agree
(`tests/test_preset_models.py` checks it on the meta device). Attention is PyTorch's fused
`scaled_dot_product_attention`, as HF uses by default (`attn_implementation="sdpa"`). The LLaMA
family (LLaMA 1 7B, Llama 2 13B and 70B, Llama 3 8B and 70B: grouped-query attention, SwiGLU,
RMSNorm, rotary embedding, untied head) is `topoprof/zoo/llama.py`, from the published configs.

`n_layer` builds fewer blocks: a model too large for one GPU is timed at two depths and
extrapolated linearly in the block count (`topoprof/model/compute/measured.py`).

The vision presets are torchvision's ResNet and ResNeXt (`torchvision/models/resnet.py`,
github.com/pytorch/vision; the layout in `topoprof/model/vision.py`), written out here without
torchvision: the same modules, parameter names, shapes and order, and torchvision's
initialisation. Their batch is `micro_batch` random images of `image_size` square pixels; the
loss is cross-entropy over 1000 classes, BN in training mode as the module is built.
"""
from __future__ import annotations

import inspect
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from topoprof.workload.synthetic import spec_for_params
from topoprof.zoo.checkpoint_wrap import apply_activation_checkpointing, children_of
from topoprof.zoo.llama import LLAMA_CONFIGS, Llama
from topoprof.zoo.synthetic_lm import SyntheticLM


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

    BLOCKS = ("transformer.h",)  # the repeated blocks (`preset_blocks`)

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

    BLOCKS = ("encoder.layer",)

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


def _next_token_loss(logits, tokens):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def _bert_loss(out, tokens):
    sequence, pooled = out
    return sequence.float().pow(2).mean() + pooled.float().pow(2).mean()


def _conv(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    """torchvision's conv1x1 / conv3x3 (padding kernel // 2, no bias)."""
    return nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False)


class _Bottleneck(nn.Module):
    """torchvision's Bottleneck (v1.5: the stride on the 3x3)."""

    def __init__(self, inplanes: int, planes: int, stride: int, downsample, groups: int, width_per_group: int):
        super().__init__()
        width = int(planes * (width_per_group / 64.0)) * groups
        self.conv1, self.bn1 = _conv(inplanes, width, 1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride, groups), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, planes * 4, 1), nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet with Bottleneck blocks (resnet50/101, resnext50_32x4d, resnext101_32x8d)."""

    BLOCKS = ("layer1", "layer2", "layer3", "layer4")  # the residual blocks, stage by stage

    def __init__(self, blocks=(3, 4, 6, 3), groups=1, width_per_group=64, num_classes=1000):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = 64
        for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if stage == 0 else 2
            downsample = None
            if stride != 1 or inplanes != planes * 4:
                downsample = nn.Sequential(_conv(inplanes, planes * 4, 1, stride), nn.BatchNorm2d(planes * 4))
            layers = [_Bottleneck(inplanes, planes, stride, downsample, groups, width_per_group)]
            inplanes = planes * 4
            layers += [_Bottleneck(inplanes, planes, 1, None, groups, width_per_group) for _ in range(1, count)]
            setattr(self, f"layer{stage + 1}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * 4, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _classification_loss(logits, images):
    """Cross-entropy over the classes; the labels (any: the cost does not depend on them) are
    0, 1, 2, ... on the images' device."""
    labels = torch.arange(logits.shape[0], device=logits.device) % logits.shape[1]
    return F.cross_entropy(logits.float(), labels)


# name: (module class, its kwargs, vocabulary size (None: an image model), loss)
PRESET_MODULES = {
    "gpt2": (Gpt2, {"n_layer": 12}, 50257, _next_token_loss),
    "gpt2-medium": (Gpt2, {"n_layer": 24, "n_embd": 1024, "n_head": 16}, 50257, _next_token_loss),
    "bert-base": (Bert, {"n_layer": 12}, 30522, _bert_loss),
    # 2048 / 16 heads = 128 per head, GPT-3's d_head (its table's 24 heads would not divide 2048)
    "gpt3-xl": (Gpt2, {"n_layer": 24, "n_embd": 2048, "n_head": 16, "n_positions": 2048}, 50257, _next_token_loss),
    **{name: (Llama, config.kwargs(), config.vocab_size, _next_token_loss) for name, config in LLAMA_CONFIGS.items()},
    # torchvision's resnet50, resnet101, resnext50_32x4d, resnext101_32x8d
    "resnet50": (ResNet, {"blocks": (3, 4, 6, 3)}, None, _classification_loss),
    "resnet101": (ResNet, {"blocks": (3, 4, 23, 3)}, None, _classification_loss),
    "resnext50_32x4d": (ResNet, {"blocks": (3, 4, 6, 3), "groups": 32, "width_per_group": 4}, None,
                        _classification_loss),
    "resnext101_32x8d": (ResNet, {"blocks": (3, 4, 23, 3), "groups": 32, "width_per_group": 8}, None,
                         _classification_loss),
}
DEFAULT_IMAGE_SIZE = 224  # torchvision's ImageNet training crop, as topoprof/model/vision.py



# The sequence each text preset was trained at (its position table, or its release's context),
# read when no seq_len is given: GPT-2's n_positions 1024, BERT's max_position_embeddings 512,
# GPT-3's context 2048 (Brown et al. 2020, Table 2.1); the LLaMA family's in LLAMA_CONFIGS.
DEFAULT_SEQ_LEN = {"gpt2": 1024, "gpt2-medium": 1024, "bert-base": 512, "gpt3-xl": 2048,
                   **{name: config.seq_len for name, config in LLAMA_CONFIGS.items()}}


def preset_blocks(module: nn.Module) -> list[str]:
    """A preset module's repeated blocks (qualified names, in forward order): what activation
    checkpointing wraps."""
    containers: tuple[str, ...] = getattr(type(module), "BLOCKS")  # every preset module's class names them
    return [name for container in containers for name in children_of(module, container)]


def build(preset: str, micro_batch: int = 1, seq_len: int | None = None, n_layer: int | None = None, seed: int = 0,
          image_size: int | None = None, ac: str = "none", sizes: dict | None = None):
    """(module, example_batch, loss_fn) of a preset at its real size (or with `n_layer` blocks).
    A text preset reads `micro_batch` x `seq_len` tokens (default DEFAULT_SEQ_LEN); an image
    preset `micro_batch` images of 3 x `image_size` x `image_size` (default 224; `seq_len` and
    `n_layer` do not apply). `ac`: activation checkpointing of its blocks (`topoprof/zoo/checkpoint_wrap.py`);
    `sizes`: its module's arguments changed (e.g. {"hidden": 256, "vocab_size": 1024}), for a
    smaller model of the same design."""
    cls, kwargs, vocab, loss = PRESET_MODULES[preset]
    unknown = set(sizes or {}) - set(inspect.signature(cls).parameters)
    if unknown:
        raise ValueError(f"{preset}: sizes {sorted(unknown)} are not arguments of {cls.__name__}")
    kwargs = {**kwargs, **(sizes or {})}
    torch.manual_seed(seed)
    if vocab is None:
        if n_layer is not None:
            raise ValueError(f"{preset} is timed whole: n_layer does not apply")
        size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        module, batch = cls(**kwargs), torch.randn(micro_batch, 3, size, size)
    else:
        if image_size is not None:
            raise ValueError(f"{preset} reads tokens: image_size does not apply")
        if n_layer is not None:
            kwargs = {**kwargs, "n_layer": n_layer}
        vocab = kwargs.get("vocab_size", vocab)
        module = cls(**kwargs)
        batch = torch.randint(0, vocab, (micro_batch, DEFAULT_SEQ_LEN[preset] if seq_len is None else seq_len))
    return apply_activation_checkpointing(module, ac, preset_blocks(module)), batch, loss


def build_synthetic(params: int, micro_batch: int = 1, seq_len: int = 1024, seed: int = 0, ac: str = "none",
                    n_layer: int | None = None):
    """(module, tokens, None) of `--params N`: topoprof's synthetic language model of about N
    parameters (`topoprof.workload.synthetic.spec_for_params`, the one `validate` trains: embedding,
    MLP blocks, LayerNorm, untied head; no attention), reading `micro_batch` x `seq_len` tokens.
    Its forward returns the loss. `ac` checkpoints its blocks (`topoprof/zoo/checkpoint_wrap.py`);
    `n_layer` builds fewer of them, of the same width."""
    spec = spec_for_params(int(params), seq_len)
    if n_layer is not None:
        spec = replace(spec, n_layers=n_layer)
    torch.manual_seed(seed)
    tokens = torch.randint(0, spec.vocab, (micro_batch, seq_len + 1))
    module = SyntheticLM(spec)
    return apply_activation_checkpointing(module, ac, children_of(module, "blocks")), tokens, None
