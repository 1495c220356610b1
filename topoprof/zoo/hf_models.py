"""Build a Hugging Face causal-LM architecture from a local `config.json` (`--model hf:PATH`,
`topoprof.zoo.hf_spec`), as a user's callable would: `build_hf` returns `(module, example_batch,
None)`; the batch is `dict(input_ids, labels)`, so `module(**batch).loss` is Hugging Face's own
causal-LM loss (transformers/loss/loss_utils.py `ForCausalLMLoss`: the logits upcast with
`.float()`, the labels padded with -100 and shifted left by one, `cross_entropy(ignore_index=-100,
reduction="mean")`), which the tool reads as the output's `.loss`.

Nothing here touches the network: the config is read with `json` and made a config object with
`CONFIG_MAPPING[model_type].from_dict` (no Hub lookup, no `trust_remote_code`); the model is built
with `AutoModelForCausalLM.from_config`, on the default device (meta inside the trace), in fp32
unless told: fp32 weights, as torch.autocast trains them and as the presets are built.
transformers is an optional dependency (`topoprof[hf]`), imported at the first build.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from topoprof.zoo.hf_spec import (
    _PIP_HINT,
    ATTN_CHOICES,
    DEFAULT_MAX_SEQ_LEN,
    HFDependencyError,
    HFModelError,
    _read_json,
)
from topoprof.zoo.hf_spec import config_path as checked_config_path

# --------------------------------------------------------------------------- transformers


@functools.lru_cache(maxsize=None)
def _tf():
    """Import transformers lazily; one-line error telling how to install it."""
    try:
        # lazy: transformers, the optional extra topoprof[hf]
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError as e:  # pragma: no cover - exercised by monkeypatching in tests
        raise HFDependencyError(_PIP_HINT) from e
    return dict(
        version=transformers.__version__,
        AutoModelForCausalLM=AutoModelForCausalLM,
        CONFIG_MAPPING=CONFIG_MAPPING,
        CAUSAL_LM_NAMES=MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )


def install_meta_patches() -> None:
    """Make HF's mask preprocessing usable on meta tensors.

    transformers 5.x ``masking_utils._preprocess_mask_arguments`` calls
    ``find_packed_sequence_indices(position_ids)`` when no attention_mask and no cache are
    given (i.e. exactly our training setup).  That function ends with the data-dependent
    ``(packed_sequence_mask[:, -1] == 0).all()`` which calls ``.item()`` and raises
    "Tensor.item() cannot be called on meta tensors".  For the position ids the model makes
    itself (``arange``) the answer is always "not packed" -> ``None``; we return that for
    meta tensors only and leave every other device untouched.  Idempotent.
    """
    try:
        from transformers import masking_utils as mu  # lazy: transformers, the optional extra topoprof[hf]
    except ImportError:  # pragma: no cover
        return
    orig = getattr(mu, "find_packed_sequence_indices", None)
    if orig is None or getattr(orig, "_topoprof_meta_safe", False):
        return

    @functools.wraps(orig)
    def find_packed_sequence_indices(position_ids, *args, **kwargs):
        if isinstance(position_ids, torch.Tensor) and position_ids.device.type == "meta":
            return None
        return orig(position_ids, *args, **kwargs)

    setattr(find_packed_sequence_indices, "_topoprof_meta_safe", True)
    setattr(find_packed_sequence_indices, "_topoprof_orig", orig)
    mu.find_packed_sequence_indices = find_packed_sequence_indices


# --------------------------------------------------------------------------- config


def parse_hf_spec(spec: str) -> str:
    """`hf:PATH` (or plain PATH) -> the absolute path of its `config.json`, checked as
    `hf_spec.config_path` checks it, and that transformers knows its `model_type` and has a
    causal-LM class for it; one-line `HFModelError` otherwise."""
    if not isinstance(spec, str):
        raise HFModelError(f"hf model spec must be a string, got {type(spec).__name__}")
    path = checked_config_path(spec)
    data = _read_json(path)
    model_type = data["model_type"]
    tf = _tf()
    if model_type not in tf["CONFIG_MAPPING"]:
        extra = " (custom-code models with auto_map are not supported)" if "auto_map" in data else ""
        raise HFModelError(f"{path}: unknown model_type {model_type!r} for transformers {tf['version']}{extra}")
    if model_type not in tf["CAUSAL_LM_NAMES"]:
        raise HFModelError(f"{path}: model_type {model_type!r} has no causal-LM class (AutoModelForCausalLM) in "
                           f"transformers {tf['version']}")
    return path


def load_hf_config(config_path: str):
    """Validated path (or spec) -> transformers config object, built offline with from_dict."""
    path = parse_hf_spec(config_path)
    data = _read_json(path)
    tf = _tf()
    try:
        return tf["CONFIG_MAPPING"][data["model_type"]].from_dict(data)
    except Exception as e:  # bad values inside a config
        raise HFModelError(f"{path}: transformers rejected the config: {type(e).__name__}: {e}") from None


def resolve_attn(attn: str) -> tuple[str, bool]:
    """-> (implementation actually built, price_as_flash)."""
    if attn not in ATTN_CHOICES:
        raise HFModelError(f"unknown attention implementation {attn!r}; choose one of: {', '.join(ATTN_CHOICES)}")
    if attn == "flash_attention_2":
        return "sdpa", True
    return attn, False


def _max_positions(config) -> int | None:
    tc = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx"):
        v = getattr(tc, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _uses_rope(config) -> bool:
    tc = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(tc, "rope_parameters", None) or getattr(tc, "rope_theta", None))


def default_seq_len(config) -> int:
    """``min(max positions in the config, DEFAULT_MAX_SEQ_LEN)``; DEFAULT_MAX_SEQ_LEN if unstated."""
    mp = _max_positions(config)
    return min(mp, DEFAULT_MAX_SEQ_LEN) if mp else DEFAULT_MAX_SEQ_LEN


def _resolve_dtype(dtype):
    if dtype is None:
        return None
    if isinstance(dtype, str):
        d = getattr(torch, dtype.replace("torch.", ""), None)
        if not isinstance(d, torch.dtype):
            raise HFModelError(f"unknown dtype {dtype!r}")
        dtype = d
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise HFModelError(f"dtype must be a floating torch dtype, got {dtype!r}")
    return dtype


# --------------------------------------------------------------------------- build


@dataclasses.dataclass
class HFBuildInfo:
    """Attached to the built module as ``module.topoprof_hf``."""

    config_path: str
    model_type: str
    architecture: str  # class actually built, e.g. "LlamaForCausalLM"
    attn_requested: str  # what the user asked for
    attn_built: str  # what transformers runs ("sdpa" or "eager")
    price_as_flash: bool  # True for flash_attention_2: cost it as a flash kernel
    micro_batch: int
    seq_len: int
    dtype: torch.dtype
    gradient_checkpointing: bool
    transformers_version: str


def build_hf(
    config_path: str,
    attn: str = "sdpa",
    micro_batch: int = 1,
    seq_len: int | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = torch.float32,
    gradient_checkpointing: bool = False,
    seed: int = 0,
):
    """Build the config's causal-LM class on ``device``; return ``(module, batch, None)``.

    * ``config_path``: a config.json, a folder holding one, or an ``hf:`` spec.
    * ``attn``: ``sdpa`` | ``eager`` | ``flash_attention_2`` (built as sdpa;
      ``module.topoprof_hf.price_as_flash`` is True).
    * ``seq_len=None``: :func:`default_seq_len` (min(max positions, 2048)).  Longer than the
      config's max positions is an error for learned absolute position embeddings
      (GPT-2, BERT: it would index out of range on a real device but pass silently on meta);
      allowed for RoPE models.
    * ``device=None``: torch's default device (meta inside the trace's `on_meta`).
    * ``dtype``: float32 by default (the module docstring); None: what ``from_config`` does, the
      config's ``dtype``/``torch_dtype`` (bfloat16 for Llama 3.1) if given.
    * ``gradient_checkpointing``: non-reentrant activation checkpointing of every block.
    * ``seed``: weight init and token ids on real devices (global RNG left untouched).

    The model is in ``train()`` mode (dropout as configured) with ``use_cache=False``.
    ``batch = {"input_ids": LongTensor[mb, S], "labels": LongTensor[mb, S]}`` on ``device``
    (zeros on meta; random ids with labels == input_ids elsewhere), so
    ``module(**batch).loss`` is HF's ForCausalLMLoss.
    """
    path = parse_hf_spec(config_path)
    built_attn, price_as_flash = resolve_attn(attn)
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise HFModelError(f"micro_batch must be a positive integer, got {micro_batch!r}")
    config = load_hf_config(path)
    tf = _tf()

    if seq_len is None:
        seq_len = default_seq_len(config)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise HFModelError(f"seq_len must be a positive integer, got {seq_len!r}")
    max_pos = _max_positions(config)
    if max_pos is not None and seq_len > max_pos and not _uses_rope(config):
        raise HFModelError(
            f"seq_len {seq_len} exceeds the {max_pos} learned positions of model_type {config.model_type!r} in {path}"
        )
    dtype = _resolve_dtype(dtype)
    device = torch.device(device) if device is not None else torch.get_default_device()

    # Training: no KV cache (HF would otherwise build a DynamicCache in every forward).
    config.use_cache = False
    tc = config.get_text_config() if hasattr(config, "get_text_config") else config
    if tc is not config:
        tc.use_cache = False

    install_meta_patches()
    kwargs: dict[str, Any] = {"attn_implementation": built_attn}
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with torch.device(device):
                model = tf["AutoModelForCausalLM"].from_config(config, **kwargs)
    except HFModelError:
        raise
    except Exception as e:
        raise HFModelError(
            f"{path}: building {config.model_type!r} failed: {type(e).__name__}: {e}"
        ) from None

    # GPT2LMHeadModel / BertLMHeadModel do not match a LOSS_MAPPING key; HF then warns and
    # falls back to ForCausalLM.  Set it explicitly: same function, no warning.
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"

    model.train()
    if gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise HFModelError(f"{type(model).__name__} does not support gradient checkpointing")
        gc_kwargs = {"use_reentrant": False}
        try:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=gc_kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)
        except ValueError as e:
            raise HFModelError(f"{type(model).__name__}: cannot enable gradient checkpointing: {e}") from None
        model.train()

    shape = (micro_batch, seq_len)
    if device.type == "meta":
        input_ids = torch.zeros(shape, dtype=torch.long, device=device)
        labels = torch.zeros(shape, dtype=torch.long, device=device)
    else:
        g = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(0, tc.vocab_size, shape, generator=g, dtype=torch.long).to(device)
        labels = input_ids.clone()

    model.topoprof_hf = HFBuildInfo(
        config_path=path,
        model_type=config.model_type,
        architecture=type(model).__name__,
        attn_requested=attn,
        attn_built=built_attn,
        price_as_flash=price_as_flash,
        micro_batch=micro_batch,
        seq_len=seq_len,
        dtype=next(model.parameters()).dtype,
        gradient_checkpointing=bool(gradient_checkpointing),
        transformers_version=tf["version"],
    )
    return model, {"input_ids": input_ids, "labels": labels}, None
