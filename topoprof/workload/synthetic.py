"""The synthetic language model that `validate` trains, as numbers and as a `presets.Layout`,
and the training worker's config (`parse_config`), checked here so bad input fails before any
rank starts.

Architecture (built in torch by `probes/ranks/training.py`, in this registration order):

    embed  = Embedding(vocab, d_model)
    blocks = n_layers x [fc1 = Linear(d_model, d_ff), GELU, fc2 = Linear(d_ff, d_model)],
             each added to its input (residual)
    norm   = LayerNorm(d_model)
    head   = Linear(d_model, vocab, bias=False)   untied from embed, no bias (as GPT-2/LLaMA heads)
    loss   = cross-entropy of head(norm(x)) against the next token

There is no attention: its score/value products have no parameters, and the step-time model
leaves them out too (Kaplan et al. 2020 C ~= 6N, see `presets`), so this module is exactly what
the cost model describes. `SyntheticSpec.layout()` lists the same tensors and uses with the
backward FLOPs `presets` assigns (a matmul 4 x numel per token; lookup, norm, bias ~0).

Dimension rules (both land within a few parameters of the target; the tests check 5 %):
- `spec_for_params(P)`: d_model is the largest rung of D_MODEL_LADDER that still leaves
  MIN_LAYERS layers; vocab = VOCAB_PER_D_MODEL x d_model; n_layers by rounding; d_ff (nominally
  FF_PER_D_MODEL x d_model) absorbs the rounding so the total lands on P.
- `spec_for_preset(name, scale)`: P = scale x the preset's parameters; width (and so depth)
  shrinks by scale^(1/3), because layer parameters grow as n_layers x d_model^2; vocab keeps the
  input embedding's share of the parameters (the last gradient DDP reduces, so the last
  bucket keeps its weight); n_layers and d_ff as above.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from topoprof.errors import InputError
from topoprof.workload.checkpointing import parse_checkpointing
from topoprof.workload.layout import Layout, LayoutBuilder
from topoprof.workload.presets import get_preset, is_vision

# Modelling choices, not measurements; each is stated in the module docstring.
FF_PER_D_MODEL = 4  # the MLP width ratio of GPT-2, BERT (Vaswani et al. 2017 d_ff = 4 d_model)
VOCAB_PER_D_MODEL = 8  # embedding = 8 d_model^2: a large last bucket, as in language models
MIN_LAYERS = 8  # enough layers that gradients become ready in many steps (GPT-2 small has 12)
# Widths of published models (GPT-2 768/1024/1280/1600, LLaMA 4096/5120/8192), with small rungs
# for CPU tests. Alignment: NVIDIA "Matrix Multiplication Background User's Guide" (Deep Learning
# Performance docs) asks for dimensions in multiples of 8 for FP16/BF16 tensor cores, 64 or more
# for full tile efficiency; all rungs >= 64 are multiples of 64.
D_MODEL_LADDER = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1280, 1600, 2048, 3072, 4096,
                  5120, 6144, 8192)
WIDTH_STEP = 16  # spec_for_preset rounds a scaled width to a multiple of this
FF_ALIGN = 8  # d_ff to a multiple of 8 (the same guide) when that moves the total < 1 %
FF_ALIGN_TOLERANCE = 0.01


@dataclass(frozen=True)
class SyntheticSpec:
    vocab: int
    d_model: int
    n_layers: int
    d_ff: int
    seq_len: int  # tokens per sample (the model reads seq_len + 1 tokens: inputs and targets)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "d_ff", "seq_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InputError(f"synthetic model: {name} must be an integer >= 1, "
                                 f"got {getattr(self, name)!r}")
        if not isinstance(self.vocab, int) or self.vocab < 2:
            raise InputError(f"synthetic model: vocab must be an integer >= 2, got {self.vocab!r}")

    @property
    def layer_params(self) -> int:
        return _layer_params(self.d_model, self.d_ff)

    @property
    def params(self) -> int:
        d = self.d_model
        return 2 * self.vocab * d + self.n_layers * self.layer_params + 2 * d

    @property
    def embedding_share(self) -> float:
        return self.vocab * self.d_model / self.params

    def layout(self) -> Layout:
        """Tensors in the module's registration order, uses in forward order."""
        d, ff = self.d_model, self.d_ff
        b = LayoutBuilder()
        b.use(b.param("embed.weight", self.vocab, d))
        for i in range(self.n_layers):
            fc1 = b.linear(f"blocks.{i}.fc1", d, ff)
            fc2 = b.linear(f"blocks.{i}.fc2", ff, d)
            b.matmul(*fc1)
            b.matmul(*fc2)
        b.use(*b.norm("norm", d))
        b.matmul(*b.linear("head", d, self.vocab, bias=False))
        return b.build(self.name, "topoprof.synthetic: Embedding -> MLP blocks -> LayerNorm -> "
                                  "untied Linear head")

    @property
    def name(self) -> str:
        return (f"synthetic-v{self.vocab}-d{self.d_model}-L{self.n_layers}-ff{self.d_ff}"
                f"-T{self.seq_len}")


def _layer_params(d_model: int, d_ff: int) -> int:
    return 2 * d_model * d_ff + d_ff + d_model  # fc1 weight+bias, fc2 weight+bias


def _fit(params: int, d_model: int, vocab: int, seq_len: int) -> SyntheticSpec:
    """Layers by rounding at d_ff = 4 d_model, then d_ff absorbs what rounding left over."""
    fixed = 2 * vocab * d_model + 2 * d_model
    budget = params - fixed
    nominal = _layer_params(d_model, FF_PER_D_MODEL * d_model)
    n_layers = max(1, round(budget / nominal))
    # n_layers * (d_ff * (2 d + 1) + d) = budget
    exact_ff = (budget / n_layers - d_model) / (2 * d_model + 1)
    if exact_ff < 1:
        raise InputError(f"{params} parameters are too few for a synthetic model with "
                         f"d_model {d_model} and vocab {vocab}")
    d_ff = max(1, round(exact_ff))
    aligned = FF_ALIGN * round(exact_ff / FF_ALIGN)
    if aligned >= FF_ALIGN:
        candidate = SyntheticSpec(vocab, d_model, n_layers, aligned, seq_len)
        if abs(candidate.params - params) <= FF_ALIGN_TOLERANCE * params:
            d_ff = aligned
    return SyntheticSpec(vocab, d_model, n_layers, d_ff, seq_len)


def _min_params(d_model: int, layers: int) -> int:
    vocab = VOCAB_PER_D_MODEL * d_model
    return (2 * vocab * d_model + 2 * d_model
            + layers * _layer_params(d_model, FF_PER_D_MODEL * d_model))


def spec_for_params(params: int, seq_len: int = 64) -> SyntheticSpec:
    """A synthetic model of about `params` parameters (rule in the module docstring)."""
    if not isinstance(params, int) or params < _min_params(D_MODEL_LADDER[0], 1):
        raise InputError(f"params must be an integer >= {_min_params(D_MODEL_LADDER[0], 1)} "
                         f"for a synthetic model, got {params!r}")
    fitting = [d for d in D_MODEL_LADDER if _min_params(d, MIN_LAYERS) <= params]
    d_model = fitting[-1] if fitting else D_MODEL_LADDER[0]
    return _fit(params, d_model, VOCAB_PER_D_MODEL * d_model, seq_len)


def spec_for_preset(name: str, scale: float, seq_len: int = 64) -> SyntheticSpec:
    """A preset's shape family at `scale` x its parameters (rule in the module docstring).

    The preset's first tensor is its input embedding (vocab, d_model) in every text preset."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise InputError(f"scale must be a positive number, got {scale!r}")
    if is_vision(name):
        raise InputError(f"--preset {name}: an image model has no language-model shape to scale "
                         "(its token embedding and width); train it with --model PATH.py:CALLABLE")
    layout = get_preset(name)
    vocab_full, d_full = layout.tensors[0].shape
    share = vocab_full * d_full / layout.params
    params = round(scale * layout.params)
    d_model = max(WIDTH_STEP, WIDTH_STEP * round(d_full * scale ** (1 / 3) / WIDTH_STEP))
    vocab = max(2, round(share * params / d_model))
    return _fit(params, d_model, vocab, seq_len)


# --- the training worker's job (probes/ranks/training.py) ------------------------------------------

MODES = ("single", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only", "dp", "numerics")
DDP_MODES = ("ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only")
OPTIMIZERS = ("adamw", "sgd")
AMP_MODES = ("none", "bf16")  # autocast dtype on GPU
# lr when none is given: torch.optim.AdamW's own default; for SGD (and numerics) 0.1, large
# enough that a wrong 1/K loss scaling moves parameters far beyond rounding (the lr does not
# change step time).
DEFAULT_LR = {"adamw": 1e-3, "sgd": 0.1}
# numerics: (rtol, atol) for torch.allclose. fp32: rounding of sums reordered across ranks
# stays within ~1e-7 relative per gradient; fp64 leaves ~1e-16, so far tighter bounds hold.
NUMERICS_TOLERANCE = {"float32": (1e-5, 1e-6), "float64": (1e-9, 1e-12)}
STREAM_SEED_BITS = 40  # a sample's generator seed is (seed << 40) | sample index
MAX_SEED = 1 << (63 - STREAM_SEED_BITS)  # keeps generator seeds below 2**63


@dataclass(frozen=True)
class TrainConfig:
    """What `probes/ranks/training.py` runs; `parse_config` builds it from the JSON config."""

    spec: SyntheticSpec
    mode: str
    micro_batch: int
    accum: int
    steps: int
    warmup_steps: int
    bucket_cap_mb: float | None  # None: torch's default (25 MiB, first bucket 1 MiB)
    seed: int
    optimizer: str
    lr: float
    amp: str
    threads: int | None
    count_comm_hook_calls: bool  # wrap DDP's all-reduce in a counting comm hook
    numerics_dtype: str
    ac: str = "none"  # activation checkpointing of the blocks (topoprof.workload.checkpointing)


def _int(config: dict, key: str, default=None, low: int = 1, high: int = 1 << 62) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise InputError(f"training config: {key} must be an integer in [{low}, {high}), "
                         f"got {value!r}")
    return value


def _choice(config: dict, key: str, default, choices) -> str:
    value = config.get(key, default)
    if value not in choices:
        raise InputError(f"training config: {key} must be one of {', '.join(choices)}, "
                         f"got {value!r}")
    return value


def _spec(value) -> SyntheticSpec:
    fields = ("vocab", "d_model", "n_layers", "d_ff", "seq_len")
    if not isinstance(value, dict) or sorted(value) != sorted(fields):
        raise InputError(f"training config: spec must be a dict with keys {', '.join(fields)}, "
                         f"got {value!r}")
    return SyntheticSpec(**value)


def parse_config(config: dict) -> TrainConfig:
    """The training worker's config (keys in probes/ranks/training.py), checked before any rank starts."""
    optimizer = _choice(config, "optimizer", "adamw", OPTIMIZERS)
    cap = config.get("bucket_cap_mb")
    if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
        raise InputError(f"training config: bucket_cap_mb must be > 0 or null, got {cap!r}")
    threads = config.get("threads")
    lr = config.get("lr")
    if lr is None:
        lr = DEFAULT_LR["sgd" if config.get("mode") == "numerics" else optimizer]
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise InputError(f"training config: lr must be > 0, got {lr!r}")
    return TrainConfig(
        spec=_spec(config.get("spec")), mode=_choice(config, "mode", None, MODES),
        micro_batch=_int(config, "micro_batch"), accum=_int(config, "accum", 1),
        steps=_int(config, "steps"), warmup_steps=_int(config, "warmup_steps", low=0),
        bucket_cap_mb=cap, seed=_int(config, "seed", 0, low=0, high=MAX_SEED), optimizer=optimizer,
        lr=float(lr), amp=_choice(config, "amp", "none", AMP_MODES),
        threads=None if threads is None else _int(config, "threads"),
        count_comm_hook_calls=bool(config.get("count_comm_hook_calls", False)),
        numerics_dtype=_choice(config, "numerics_dtype", "float64", tuple(NUMERICS_TOLERANCE)),
        ac=_checkpointing(config.get("ac")))


def _checkpointing(value) -> str:
    if value is not None and not isinstance(value, str):
        raise InputError(f"training config: ac must be none, full, layer:N or op, got {value!r}")
    return parse_checkpointing(value).text


def check_supported(cfg: TrainConfig, device: str, world_size: int, cuda_gpus: int) -> None:
    """Refuse, with the reason, what cannot run here (all ranks decide alike)."""
    if cfg.mode == "dp" and cuda_gpus == 0:
        raise InputError("mode 'dp' needs CUDA GPUs: torch.nn.DataParallel replicates the model "
                         "over the GPUs of one process, and none is visible here")
    # `single` on several ranks means every rank trains its own copy alone, at the same time:
    # the calibration then sees the same sharing of cores and memory as the DDP runs do.
    if cfg.mode == "dp" and world_size != 1:
        raise InputError(f"mode 'dp' runs in one process; launch it with 1 rank, not {world_size}")
    gpu = cfg.mode == "dp" or device.startswith("cuda")
    if cfg.amp != "none" and not gpu:
        raise InputError(f"amp {cfg.amp!r} is for GPUs (CUDA autocast) and this rank runs on "
                         f"{device}; use amp 'none' on CPU")
