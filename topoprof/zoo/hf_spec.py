"""`--model hf:PATH`: a Hugging Face causal-LM architecture from a local `config.json` (PATH is the
file or a folder holding one), read without torch or transformers, so the command checks it before
any worker starts; `topoprof.zoo.hf_models` builds it. The attention implementation rides on the
spec as `hf:PATH#ATTN` (`--hf-attn`), so every process that reads the spec builds the same model.
"""
from __future__ import annotations

import importlib.util
import json
import os

HF_PREFIX = "hf:"

#: attention implementations accepted on the command line.  ``flash_attention_2`` is built
#: as ``sdpa`` (flash_attn is not installed and cannot run on meta anyway) and flagged so
#: that the cost model prices it as flash attention.
ATTN_CHOICES = ("sdpa", "eager", "flash_attention_2")

#: default sequence length cap: ``seq_len=None`` means
#: ``min(max positions from the config, DEFAULT_MAX_SEQ_LEN)`` (or this value when the
#: config states no maximum).  2048 is a common pre-training length; long-context configs
#: (131072 for Llama 3.1) would otherwise give absurd default plans.
DEFAULT_MAX_SEQ_LEN = 2048

_PIP_HINT = 'transformers is not installed; --model hf:... needs it: pip install "topoprof[hf]"'


class HFModelError(ValueError):
    """A user-facing error about an ``hf:`` model; its message is always one line."""

    def __init__(self, msg: str):
        super().__init__(" ".join(str(msg).split()))


class HFDependencyError(HFModelError, ImportError):
    """transformers is missing."""


def _read_json(path: str) -> dict:
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise HFModelError(f"{path}: invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise HFModelError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    except OSError as e:
        raise HFModelError(f"{path}: cannot read: {e.strerror or e}") from None
    if not isinstance(data, dict):
        raise HFModelError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data



def is_hf_spec(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(HF_PREFIX)


def split_spec(spec: str) -> tuple[str, str]:
    """`hf:PATH[#ATTN]` -> (PATH, ATTN), ATTN `sdpa` when not given."""
    raw = spec[len(HF_PREFIX):] if spec.startswith(HF_PREFIX) else spec
    path, sep, attn = raw.rpartition("#")
    if not sep or attn not in ATTN_CHOICES:  # no suffix, or a '#' that is the path's own
        return raw.strip(), "sdpa"
    return path.strip(), attn


def with_attn(spec: str, attn: str) -> str:
    """The spec that builds `attn` attention (`--hf-attn`)."""
    path, _ = split_spec(spec)
    if attn not in ATTN_CHOICES:
        raise HFModelError(f"--hf-attn {attn!r}: one of {', '.join(ATTN_CHOICES)}")
    return f"{HF_PREFIX}{path}" + ("" if attn == "sdpa" else f"#{attn}")


def config_path(spec: str) -> str:
    """The absolute path of the `config.json` an `hf:` spec names, checked to be a JSON object that
    names its `model_type`; one-line `HFModelError` otherwise."""
    raw, _ = split_spec(spec)
    if not raw:
        raise HFModelError(f"empty path in {spec!r}: use {HF_PREFIX}PATH where PATH is a config.json or a folder "
                           f"holding one")
    path = os.path.abspath(os.path.expanduser(raw))
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise HFModelError(f"folder {path} has no config.json")
        path = os.path.join(path, "config.json")
    elif not os.path.exists(path):
        raise HFModelError(f"{path}: no such file or folder")
    elif not os.path.isfile(path):
        raise HFModelError(f"{path}: not a regular file")
    model_type = _read_json(path).get("model_type")
    if not model_type or not isinstance(model_type, str):
        raise HFModelError(f"{path}: no \"model_type\" key; cannot tell which architecture to build")
    return path


def check_installed() -> None:
    """transformers is importable (found, not imported: the command stays light)."""
    if importlib.util.find_spec("transformers") is None:
        raise HFDependencyError(_PIP_HINT)
