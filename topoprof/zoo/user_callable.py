"""The user's `--model` callable: imported, called, and its loss, as every worker that runs or
traces it reads them (`probes/ranks/model_timing.py` times it, `topoprof/trace/op_trace.py` traces it on the meta
device, `probes/ranks/validation.py` trains it).

`--model PATH.py:CALLABLE` or `package.module:CALLABLE` names a function that returns
`(module, example_batch)` or `(module, example_batch, loss_fn)`. The loss: `loss_fn(output,
batch)` when given; else the output's `.loss` (Hugging Face models); else the mean of the output
in float32. What is wrong with the callable (import, call, return value, loss) raises
`UserModelError` with its stage (`kind`) and traceback: it is the user's to fix.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
import traceback

from topoprof.specs.traced_pass import ParamEntry
from topoprof.zoo.hf_spec import HFModelError, is_hf_spec, split_spec


class UserModelError(Exception):
    """The user's callable cannot be used; `kind` says at which stage."""

    def __init__(self, kind: str, message: str, trace: str = ""):
        super().__init__(message)
        self.kind = kind
        self.trace = trace


def load_callable(spec: str):
    """The callable `spec` names (`PATH.py:CALLABLE` or `package.module:CALLABLE`), imported; for
    `hf:PATH[#ATTN]`, the Hugging Face builder bound to that config (`topoprof.zoo.hf_models`)."""
    if is_hf_spec(spec):
        return _hf_builder(spec)
    target, _, name = spec.rpartition(":")
    try:
        if target.endswith(".py") or os.sep in target:
            path = os.path.abspath(target)
            sys.path.insert(0, os.path.dirname(path))
            module_spec = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(path))[0], path)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"no Python module can be loaded from {path}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as err:
        raise UserModelError("import", f"importing {target} raised {type(err).__name__}: {err}",
                             traceback.format_exc()) from None
    if not callable(getattr(module, name, None)):
        raise UserModelError("callable", f"{target} has no callable named {name!r}")
    return getattr(module, name)


def _hf_builder(spec: str):
    from topoprof.zoo.hf_models import build_hf, parse_hf_spec  # lazy: imports transformers (topoprof[hf]) and torch

    try:
        path, attn = split_spec(spec)
        return functools.partial(build_hf, parse_hf_spec(path), attn=attn)
    except HFModelError as err:
        raise UserModelError("import", str(err)) from None


def call_user_callable(spec: str, kwargs: dict | None = None):
    import torch  # lazy: torch, loaded only where a user's model is built or run

    build = load_callable(spec)
    try:
        made = build(**(kwargs or {}))
    except Exception as err:
        raise UserModelError("call", f"{spec}() raised {type(err).__name__}: {err}",
                             traceback.format_exc()) from None
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise UserModelError("return", f"{spec}() returned {type(made).__name__}"
                             f"{f' of {len(made)}' if isinstance(made, tuple) else ''}; expected "
                             "(module, example_batch) or (module, example_batch, loss_fn)")
    module, batch, loss_fn = (*made, None) if len(made) == 2 else made
    if not isinstance(module, torch.nn.Module):
        raise UserModelError("return", f"{spec}()[0] is {type(module).__name__}, not a torch.nn.Module")
    if loss_fn is not None and not callable(loss_fn):
        raise UserModelError("return", f"{spec}()[2] is {type(loss_fn).__name__}, not callable")
    return module, batch, loss_fn


def to_device(batch, device):
    import torch  # lazy: torch, loaded only where a user's model is built or run

    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def leading_sizes(batch) -> list[int]:
    """The first dimension of every tensor in the batch (nested dict, list, tuple), in order."""
    import torch  # lazy: torch, loaded only where a user's model is built or run

    if isinstance(batch, torch.Tensor):
        return [batch.shape[0]] if batch.dim() else []
    if isinstance(batch, dict):
        return [n for v in batch.values() for n in leading_sizes(v)]
    if isinstance(batch, (list, tuple)):
        return [n for v in batch for n in leading_sizes(v)]
    return []


def batch_samples(batch) -> int | None:
    """The samples an example batch holds: the first dimension every tensor of it shares (nested
    dict, list, tuple); None where it holds no tensor with one, or its tensors lead with different
    sizes (tokens beside a mask of their positions, say)."""
    sizes = set(leading_sizes(batch))
    return sizes.pop() if len(sizes) == 1 else None


def resize_batch(batch, old: int, new: int):
    """The example batch at `new` samples: every tensor whose first dimension is `old` taken along
    it as samples 0, 1, ..., old - 1, 0, 1, ... (nested dict, list, tuple); the rest as it is.
    ValueError where no tensor has `old` as its first dimension."""
    import torch  # lazy: torch, loaded only where a user's model is built or run

    if old not in leading_sizes(batch):
        raise ValueError(f"no tensor of its example batch has {old} as its first dimension")

    def one(value):
        if isinstance(value, torch.Tensor):
            if not value.dim() or value.shape[0] != old:
                return value
            return value[torch.arange(new, device=value.device) % old]
        if isinstance(value, dict):
            return {k: one(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(one(v) for v in value)
        return value

    return one(batch)


def _check_loss_takes_output_and_batch(loss_fn, out, batch) -> None:
    """A loss_fn is called as loss_fn(output, batch): one that cannot take both is the user's to
    fix, said before it runs (a TypeError from inside it would read as the model's own failure)."""
    try:
        signature = inspect.signature(loss_fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to read, it is called as is
        return
    try:
        signature.bind(out, batch)
    except TypeError:
        raise UserModelError("loss", f"the loss_fn {getattr(loss_fn, '__qualname__', loss_fn)}{signature} cannot be "
                             "called as loss_fn(output, batch): take both, e.g. lambda out, batch: ...") from None


def user_loss(module, batch, loss_fn):
    import torch  # lazy: torch, loaded only where a user's model is built or run

    if isinstance(batch, dict):
        out = module(**batch)
    elif isinstance(batch, (list, tuple)):
        out = module(*batch)
    else:
        out = module(batch)
    if loss_fn is not None:
        _check_loss_takes_output_and_batch(loss_fn, out, batch)
        loss = loss_fn(out, batch)
    elif getattr(out, "loss", None) is not None:
        loss = out.loss
    else:
        loss = (out[0] if isinstance(out, (list, tuple)) else out).float().mean()
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise UserModelError("loss", "the loss is not a one-element tensor "
                             f"(got {type(loss).__name__}); return a loss_fn as the third element")
    return loss


def parameter_list(module) -> list[ParamEntry]:
    """DDP's view of the parameters: registration order, shared tensors once with their aliases."""
    aliases: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    return [ParamEntry(name, list(p.shape), str(p.dtype).replace("torch.", ""), bool(p.requires_grad),
                       aliases[id(p)][1:])
            for name, p in module.named_parameters()]
