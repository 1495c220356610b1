"""A user's model built and run on the meta device, whatever device its code names.

The meta pass (`topoprof/trace/op_trace.py`) calls the user's callable under `torch.device("meta")`, so
that a model of any size costs no memory and no time (a 70B model cannot be built for real on a
laptop). That context only gives factory functions a device where none is named; code written
for a real device still names one: `Net().to(device)` (a meta tensor cannot be copied out:
"Cannot copy out of meta tensor; no data!"), `torch.zeros(..., device="cuda")` (no CUDA here),
`batch.cuda()`. `KeepOnMeta` keeps all of that on meta: a device named to a factory function or
to `Tensor.to` becomes meta, and `Tensor.cuda()` / `.cpu()` / `.pin_memory()` of a meta tensor
return it as it is. Dtype changes stay what they are. A module or batch the callable already
built on meta is used as it is.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

# Tensor methods that only move a tensor (or pin it): a meta tensor stays where it is.
_MOVES = frozenset({torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.pin_memory})


def _names_a_device(value) -> bool:
    if isinstance(value, torch.device):
        return True
    if isinstance(value, str):
        try:
            torch.device(value)
        except (RuntimeError, ValueError):
            return False
        return True
    return isinstance(value, int) and not isinstance(value, bool)  # Tensor.to(0): cuda:0


class KeepOnMeta(TorchFunctionMode):
    """Every device the code names becomes meta (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _MOVES and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return args[0]
        if kwargs.get("device") is not None:
            kwargs["device"] = "meta"
        if func is torch.Tensor.to and len(args) > 1 and _names_a_device(args[1]):
            args = (args[0], "meta", *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def on_meta():
    """Factory functions on meta where no device is named (`torch.device("meta")`), and meta
    wherever one is (`KeepOnMeta`)."""
    with torch.device("meta"), KeepOnMeta():
        yield


def has_meta_tensors(module, batch) -> bool:
    """Whether the module's parameters and buffers or the batch hold meta tensors (no data)."""
    tensors = [*module.parameters(), *module.buffers(), *tree_leaves(batch)]
    return any(isinstance(t, torch.Tensor) and t.is_meta for t in tensors)
