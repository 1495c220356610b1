"""The live tensor bytes a real training step reaches on this CPU: a storage-tracking
`TorchDispatchMode` counts each op's output storages once (by their `untyped_storage`) and a
`weakref.finalize` on each sees it freed; the parameters, buffers, the batch and the optimizer's
state are live from the start. The step is the one `topoprof` counts: K micro-batches of forward
and backward, the optimizer step, `zero_grad(set_to_none=True)`; it is measured after one step
has made the optimizer's state, as every step after the first holds it."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from topoprof.zoo.user_callable import user_loss


@dataclass(frozen=True)
class LivePeak:
    peak_bytes: int        # the most alive at once, everything included
    start_bytes: int       # alive when the step began: weights, buffers, the batch, the optimizer's state
    phase: str             # where the peak fell: "forward", "backward" or "optimizer step"
    micro_batch: int
    op: str


class _Storages(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._keys: set[int] = set()
        self.phase, self.micro_batch, self.where = "", 0, ("", 0, "")

    def hold(self, t, op: str = "") -> None:
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key = id(storage)  # one Python object per live storage
        if key in self._keys:
            return
        self._keys.add(key)
        size = storage.nbytes()
        self.live += size
        if self.live > self.peak:
            self.peak, self.where = self.live, (self.phase, self.micro_batch, op)
        weakref.finalize(storage, self._freed, key, size).atexit = False

    def _freed(self, key: int, size: int) -> None:
        self._keys.discard(key)
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self.hold(t, str(func))
        return out


def live_peak(model, batch, loss_fn, accumulation: int) -> LivePeak:
    """The peak of one training step of `model` with AdamW (torch's for-loop on CPU), measured."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])

    def step(mode: _Storages | None) -> None:
        for i in range(accumulation):
            if mode is not None:
                mode.phase, mode.micro_batch = "forward", i + 1
            loss = user_loss(model, batch, loss_fn)
            if mode is not None:
                mode.phase = "backward"
            loss.backward()
            del loss
        if mode is not None:
            mode.phase = "optimizer step"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(None)
    mode = _Storages()
    for t in [*model.parameters(), *model.buffers(), *tree_leaves(batch),
              *(v for state in optimizer.state.values() for v in state.values())]:
        mode.hold(t)
    start = mode.live
    with mode:
        step(mode)
    return LivePeak(mode.peak, start, *mode.where)
