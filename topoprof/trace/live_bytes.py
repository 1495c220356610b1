"""What a meta pass holds, storage by storage (`topoprof/trace/op_trace.py`): the bytes alive and their
peak, where in the forward each was allocated (before the repeated blocks, in which block, after
them), the parameters' gradients apart, and the caching allocator's rounding.

A meta storage keeps its Python object while anything holds it (a view, autograd's saved
tensors), so a weak reference to it ends exactly when the storage is freed: what is alive at the
end of the forward is what the backward will read, in the dtypes the target runs, as
`torch.cuda.memory_allocated` after a forward counts it. Copies of a parameter (autocast's 16-bit
weights) are kept apart: they scale with the parameters, not with the batch.

In backward the count keeps the parameters' gradients apart too (a storage becomes one when the
post-accumulate-grad hook sees it as `param.grad`): the backward's transient is the most the pass
holds besides them, above what it held when the backward began (the gradients of activations in
flight, a checkpointed block's recompute, the activations not yet freed are already in the start).
The forward's own peak is kept too: above what the forward ends with, its transient (the logits'
fp32 upcast before the loss keeps only its log-probabilities).

The pass is also followed segment by segment (`segment`, named by the tracer: in the forward,
before the repeated blocks, each block, after them; in the backward, the head until the first
block's gradient is written, each block from its first gradient on, the tail after the last
block's): per segment the most held (`live`) and the op that reached it, the most held besides
every gradient written so far (`fresh`: what a later micro-batch holds above its full gradients,
where a fresh gradient is a temporary added into `.grad`), and the gradients written before the
segment began (`grads_before`). What a step holds at each point of it follows from these
(`topoprof.model.memory.timeline`).

The caching allocator (c10/cuda/CUDACachingAllocator.cpp) rounds every block up to 512 bytes
(`kMinBlockSize`) and gives an allocation of 10 MiB or more (`kMinLargeAlloc`) a segment rounded
up to 2 MiB (`kRoundLarge`); the peak counted so is `rounded_peak`, the reserve that rounding alone
adds (smaller allocations share 2 MiB and 20 MiB segments, `kSmallBuffer` and `kLargeBuffer`).
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._pytree import tree_leaves

MIN_BLOCK_BYTES = 512                 # kMinBlockSize
MIN_LARGE_ALLOC_BYTES = 10 * 2 ** 20  # kMinLargeAlloc
ROUND_LARGE_BYTES = 2 * 2 ** 20       # kRoundLarge


def allocator_rounded(size: int) -> int:
    """`size` bytes as the caching allocator holds them (module docstring)."""
    if size <= 0:  # nothing allocated
        return 0
    step = ROUND_LARGE_BYTES if size >= MIN_LARGE_ALLOC_BYTES else MIN_BLOCK_BYTES
    return -(-size // step) * step


def storage_key(t) -> int | None:
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return id(t.untyped_storage())
    except (RuntimeError, NotImplementedError):  # a tensor without a storage (a subclass): not counted
        return None


class LiveBytes:
    """The bytes of the storages a pass allocated that are still alive, and their peaks (module
    docstring). `op_index` is the index of the op the caller is recording, for `where`."""

    def __init__(self) -> None:
        self.live = self.peak = self.param_copies = 0
        self.rounded = self.rounded_peak = 0
        self.grads = 0
        self.backward = False
        self.backward_start = 0
        self.forward_peak = 0
        self.backward_peak = 0        # the most held besides the parameters' gradients, in backward
        self._held: set[int] = set()
        self._grads: set[int] = set()
        self._copies: set[int] = set()
        # key: (bytes, op index, op, dtype, shape) of each live storage
        self._born: dict[int, tuple[int, int, str, str, tuple[int, ...]]] = {}
        self.segment: tuple = ("forward", "before", None)
        self.segments: dict[tuple, dict] = {}
        self._op = ""

    def enter(self, segment: tuple) -> None:
        """The ops from here on belong to `segment` ((phase, kind, block index or None))."""
        if segment != self.segment:
            self.segment = segment
            self._touch()

    def _touch(self) -> None:
        """Note what is held now in the current segment (module docstring)."""
        row = self.segments.get(self.segment)
        if row is None:
            row = self.segments[self.segment] = {"phase": self.segment[0], "kind": self.segment[1],
                                                 "block": self.segment[2], "live": -1, "fresh": -1,
                                                 "grads_before": self.grads, "live_op": "", "fresh_op": ""}
        if self.live > row["live"]:
            row["live"], row["live_op"] = self.live, self._op
        if self.live - self.grads > row["fresh"]:
            row["fresh"], row["fresh_op"] = self.live - self.grads, self._op

    def allocated(self, out, param_copy: bool = False, written=(), op_index: int = 0, op: str = "") -> None:
        """`out`'s storages, where new: `written` are the inputs a mutating op wrote (its in-place
        or out= result is one of them: a buffer's `add_` allocates nothing)."""
        self._op = op
        mutated = {key for t in tree_leaves(written) if (key := storage_key(t)) is not None}
        for t in tree_leaves(out):
            key = storage_key(t)  # one Python object per live storage, kept while the storage lives
            if key is None or key in self._held or key in mutated:  # an in-place result, or one already counted
                continue
            storage = t.untyped_storage()
            self._held.add(key)
            if param_copy:
                self._copies.add(key)
            size = storage.nbytes()
            self._born[key] = (size, op_index, op, str(t.dtype).replace("torch.", ""), tuple(t.shape))
            self._count(size, param_copy)
            self._touch()
            weakref.finalize(storage, self._freed, key, size, param_copy).atexit = False

    def mark_grad(self, grad) -> None:
        """`grad` is a parameter's `.grad` now: its storage counts as a gradient from here on."""
        key = storage_key(grad)
        if key is not None and key in self._held and key not in self._grads:
            self._grads.add(key)
            self.grads += grad.untyped_storage().nbytes()

    def start_backward(self) -> None:
        self.backward = True
        self.forward_peak = self.peak  # the forward's own peak (the loss's upcast, a norm's temporaries)
        self.backward_start = self.backward_peak = self.live

    def _count(self, size: int, param_copy: bool) -> None:
        self.live += size
        self.rounded += allocator_rounded(size) if size >= 0 else -allocator_rounded(-size)
        self.param_copies += size if param_copy else 0
        self.peak = max(self.peak, self.live)
        self.rounded_peak = max(self.rounded_peak, self.rounded)
        if self.backward:
            self.backward_peak = max(self.backward_peak, self.live - self.grads)

    def _freed(self, key: int, size: int, param_copy: bool) -> None:
        self._held.discard(key)
        self._copies.discard(key)
        self._born.pop(key, None)
        if key in self._grads:
            self._grads.discard(key)
            self.grads -= size
        self._count(-size, param_copy)

    def kept(self, blocks: list[tuple[int, int]]) -> dict:
        """What is alive now besides the parameters' copies, by where it was allocated: before the
        first block, in each block (forward op ranges [start, end)), after the last; and the
        tensors after the last block (the final norm, the head's logits, the loss) one by one."""
        before = after = 0
        per_block = [0] * len(blocks)
        tail: list[tuple[int, int, dict]] = []
        first = blocks[0][0] if blocks else None
        last = blocks[-1][1] if blocks else None
        for key in self._held - self._copies:
            size, index, op, dtype, shape = self._born[key]
            if first is None or last is None or index < first:
                before += size
            elif index >= last:
                after += size
                tail.append((-size, index, {"op": op, "dtype": dtype, "shape": list(shape), "bytes": size}))
            else:
                inside = [i for i, (a, b) in enumerate(blocks) if a <= index < b]
                if inside:
                    per_block[inside[0]] += size
                else:  # between two blocks (a residual add outside them): with the block before
                    per_block[max(i for i, (a, _) in enumerate(blocks) if a <= index)] += size
        return {"before_blocks_bytes": before, "blocks_bytes": per_block, "after_blocks_bytes": after,
                # largest first, equal sizes in the order the ops ran (the held set's order is not stable)
                "after_blocks_tensors": [row for *_, row in sorted(tail, key=lambda t: (t[0], t[1], str(t[2])))]}
