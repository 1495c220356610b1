"""What one micro-batch holds over its forward and backward, point by point, as the op trace
follows it (`topoprof/trace/live_bytes.py`: a segment per block in each phase, and before, after,
the head and the tail): at each point the most held above the model's states, what is held besides
every gradient written so far, and the share of the gradients written before it. A step's peak
reads these against its states (`topoprof.model.memory.holding`): the first micro-batch after
`zero_grad(set_to_none=True)` writes each gradient as the engine reaches its parameter; a later
one holds the full gradients from its start, and its fresh gradients are temporaries added into
them.

A pass of a model of L identical blocks holds, in block j's segment (j from 0, in forward order),
what one block's segment holds plus what the blocks below it keep for backward (in the forward,
and in the backward where they are not reached yet) and the gradients of the blocks above it (in
the backward, written already): linear in j, with one block's profile on top. So the segments of a
pass at 2 blocks (the top one, whose recompute and first ops share its segment with the block
below's, and the bottom one, with the embedding's) give every block of a deeper model
(`composed`), each block keeping what its checkpointing mode keeps.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from topoprof.specs.traced_pass import PassMemory


@dataclass(frozen=True)
class Point:
    """The most one segment of the pass holds, in bytes above the model's states."""

    phase: str            # "forward" or "backward"
    kind: str             # "before", "block", "after" (forward); "head", "block", "tail" (backward)
    block: int | None     # the block's index, from 0 in forward order
    live: float           # the most held, less the gradients written before the segment
    fresh: float          # the most held besides every gradient written so far
    grads_before: float   # the gradients written before the segment, bytes
    op: str = ""          # the op that reached `live`
    fresh_op: str = ""    # the op that reached `fresh`


@dataclass(frozen=True)
class Timeline:
    """One micro-batch's points, in the order the pass runs them; `grads`: the gradients the pass
    writes in all, bytes (each point's `grads_before` is a share of them); `blocks`: its depth."""

    points: tuple[Point, ...]
    grads: float
    blocks: int = 0

    def grads_share(self, point: Point) -> float:
        return point.grads_before / self.grads if self.grads > 0 else 0.0


def from_segments(memory: PassMemory, blocks: int = 0) -> Timeline | None:
    """The timeline of one pass's `memory` (topoprof/trace/op_trace.py); None for a trace without
    segments."""
    if not memory.segments:
        return None
    points = tuple(Point(r.phase, r.kind, r.block, float(r.live - r.grads_before), float(r.fresh),
                         float(r.grads_before), r.live_op, r.fresh_op) for r in memory.segments)
    return Timeline(points, float(memory.grads_bytes), blocks)


def where(point: Point, blocks: int) -> str:
    """'block 3 of 12', 'after the blocks (the final layers and the loss)', ..."""
    if point.kind == "block":
        assert point.block is not None  # a block's point has its index
        return f"block {point.block + 1} of {blocks}" if blocks else f"block {point.block + 1}"
    if not blocks:
        return "the whole pass"
    return {"before": "before the blocks (the embedding)", "after": "after the blocks (the final layers and the loss)",
            "head": "the final layers' backward, before the last block's", "tail": "the embedding's backward, after "
            "the first block's"}[point.kind]


def interpolated(one: Timeline, two: Timeline, at: float) -> Timeline:
    """The timeline at `at` between two passes of the same model at two micro-batch sizes (`at`
    0 is `one`, 1 is `two`): each point's bytes are linear in the samples (each holds the same)."""
    def line(a: float, b: float) -> float:
        return a + at * (b - a)

    theirs = {(p.phase, p.kind, p.block): p for p in two.points}
    points = []
    for p in one.points:
        q = theirs.get((p.phase, p.kind, p.block), p)
        points.append(replace(p, live=line(p.live, q.live), fresh=line(p.fresh, q.fresh),
                              grads_before=line(p.grads_before, q.grads_before)))
    return Timeline(tuple(points), line(one.grads, two.grads), one.blocks)


@dataclass(frozen=True)
class BlockPass:
    """A pass at 2 blocks under one checkpointing mode (`timeline`), with what one block keeps from
    its forward to its backward (`kept`: the bytes alive at the forward's end, this pass's over the
    one-block pass's) and the gradients one block writes (`block_grads`)."""

    timeline: Timeline
    kept: float
    block_grads: float


# The points of a pass at 2 blocks that `composed` reads.
COMPOSED_FROM = (("forward", "before", None), ("forward", "block", 0), ("forward", "after", None),
                 ("backward", "head", None), ("backward", "block", 1), ("backward", "block", 0))


def composable(bp: BlockPass) -> bool:
    """Whether a pass at 2 blocks has every point `composed` reads: one whose blocks train nothing
    (frozen) marks no block in its backward."""
    have = {(p.phase, p.kind, p.block) for p in bp.timeline.points}
    return all(key in have for key in COMPOSED_FROM)


def composed(passes: dict[str, BlockPass], kinds: list[str]) -> Timeline:
    """The timeline of a model whose blocks, in forward order, run the modes `kinds` (each a key
    of `passes`), from the passes at 2 blocks (module docstring)."""
    depth = len(kinds)
    below = [0.0]
    for k in kinds:
        below.append(below[-1] + passes[k].kept)
    everything = below[-1]
    bottom, top = passes[kinds[0]], passes[kinds[-1]]
    seg = {k: {(p.phase, p.kind, p.block): p for p in bp.timeline.points} for k, bp in passes.items()}
    g = bottom.block_grads
    head_grads = seg[kinds[-1]][("backward", "block", 1)].grads_before
    grads = bottom.timeline.grads + (depth - 2) * g

    def shifted(p: Point, by: float, grads_before: float, block: int | None) -> Point:
        return replace(p, live=p.live + by, fresh=p.fresh + by, grads_before=grads_before, block=block)

    points = [seg[kinds[0]][("forward", "before", None)]]
    for j, k in enumerate(kinds):
        points.append(shifted(seg[k][("forward", "block", 0)], below[j], 0.0, j))
    points.append(shifted(seg[kinds[-1]][("forward", "after", None)], everything - 2 * top.kept, 0.0, None))
    points.append(shifted(seg[kinds[-1]][("backward", "head", None)], everything - 2 * top.kept, 0.0, None))
    for j in range(depth - 1, 0, -1):
        k = kinds[j]
        points.append(shifted(seg[k][("backward", "block", 1)], below[j] - passes[k].kept,
                              head_grads + (depth - 1 - j) * g, j))
    points.append(shifted(seg[kinds[0]][("backward", "block", 0)], 0.0, head_grads + (depth - 1) * g, 0))
    tail = seg[kinds[0]].get(("backward", "tail", None))
    if tail is not None:
        points.append(shifted(tail, 0.0, head_grads + depth * g, None))
    return Timeline(tuple(points), grads, depth)
