"""The bytes a forward leaves for its backward, measured exactly on a CPU: one real forward (and
the loss) in fp32 under `torch.autograd.graph.saved_tensors_hooks`, whose pack hook sees every
tensor autograd saves for backward (torch/autograd/graph.py).

Counted: each storage once (two saved views of one tensor hold one block of memory; a view
counts as the whole storage it looks at, which is what stays allocated), only while it is still
held when the forward ends (a graph branch the loss does not reach frees what it saved), and
only storages the forward made: not the parameters and buffers, not the batch, which are there
before the forward and after the backward. Under activation checkpointing the hook sees what
checkpointing saves (a block's inputs; a reentrant block's saved inputs too), and nothing from
inside a checkpointed block, whose saving checkpointing takes over; selective checkpointing
(`create_selective_checkpoint_contexts`) keeps the outputs its policy saves in a cache of its own,
each wrapped in `torch.utils.checkpoint._VersionWrapper` (`_CachingTorchDispatchMode`), which is
watched here for the forward's length and counted alike.

`held_bytes` adds the loss, the one tensor the caller itself holds from the forward to the
backward: the same thing the meta pass counts as activations (`topoprof/trace/op_trace.py`), which is
what a memory plan adds per micro-batch. Check by hand: the same hooks around your forward,
`sum(s.nbytes() for s in {t.untyped_storage() for t in packed})`.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint as checkpoint
from torch.utils._pytree import tree_leaves

from topoprof.zoo.user_callable import user_loss


@dataclass(frozen=True)
class SavedBytes:
    saved_bytes: int          # distinct storages saved for backward (autograd's and checkpointing's)
    loss_bytes: int           # the loss's storage, where it is none of those
    saved_tensors: int        # tensors packed or cached (before merging those that share a storage)

    @property
    def held_bytes(self) -> int:
        """What stays in memory from the end of the forward to the backward."""
        return self.saved_bytes + self.loss_bytes


class _Storages:
    """Weak references to the storages of the tensors seen, by storage object (one Python object
    per live storage, kept while it lives)."""

    def __init__(self) -> None:
        self.refs: dict[int, weakref.ref] = {}
        self.seen = 0

    def add(self, t) -> None:
        if isinstance(t, torch.Tensor):
            self.seen += 1
            storage = t.untyped_storage()
            known = self.refs.get(id(storage))
            if known is None or known() is None:  # new, or an id a freed storage left behind
                self.refs[id(storage)] = weakref.ref(storage)

    def alive(self) -> dict[int, int]:
        return {key: s.nbytes() for key, ref in self.refs.items() if (s := ref()) is not None}


@contextlib.contextmanager
def _selective_cache_seen(storages: _Storages):
    """Each output selective checkpointing caches for backward, added to `storages` while inside."""
    wrapper: Any = getattr(checkpoint, "_VersionWrapper", None)
    if wrapper is None:  # a torch that caches elsewhere: its cache would go uncounted, so say so
        raise RuntimeError("torch.utils.checkpoint has no _VersionWrapper: selective checkpointing's "
                           "cache cannot be watched in this torch")

    class Seen(wrapper):
        def __init__(self, val) -> None:
            super().__init__(val)
            storages.add(val)

    setattr(checkpoint, "_VersionWrapper", Seen)  # torch's private class, replaced while inside
    try:
        yield
    finally:
        setattr(checkpoint, "_VersionWrapper", wrapper)


def saved_activation_bytes(module, batch, loss_fn=None) -> SavedBytes:
    """One real forward of `module` on `batch` (CPU, fp32, as built), with the loss as
    `topoprof/zoo/user_callable.py:user_loss` takes it; no backward. See the module docstring."""
    before = {id(t.untyped_storage()) for t in [*module.parameters(), *module.buffers(), *tree_leaves(batch)]
              if isinstance(t, torch.Tensor)}
    storages = _Storages()

    def pack(t):
        storages.add(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _selective_cache_seen(storages):
        loss = user_loss(module, batch, loss_fn)
    saved = {key: size for key, size in storages.alive().items() if key not in before}
    loss_storage = loss.untyped_storage()
    loss_bytes = 0 if id(loss_storage) in saved or id(loss_storage) in before else loss_storage.nbytes()
    return SavedBytes(sum(saved.values()), loss_bytes, storages.seen)
