"""FSDP2's groups (`torch.distributed.fsdp.fully_shard` per block, then the root): which
parameters each group holds and its share of the compute, in forward order.

Groups. `fully_shard` on a module makes one group of its parameters not already in a group, and
"should be called bottom-up" (`_fully_shard.py:133-143`): here one group per transformer block
(or ResNet stage) by tensor-name prefix (`GROUP_PATTERNS`), then the root holding the rest
(embeddings, final norm, head). A `--params N` layout, whose 100 chunks have no blocks, groups
`CHUNKS_PER_GROUP` chunks per group: there a group stands for a block (of activation
checkpointing, too: `recompute_shares`). Each group's parameters are all-gathered in one collective
and its gradients reduce-scattered in one (`_fully_shard.py:139-141`, `_fsdp_collectives.py:
foreach_all_gather, foreach_reduce`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from topoprof.errors import InputError
from topoprof.workload.checkpointing import Checkpointing
from topoprof.workload.layout import Layout

# Blocks by tensor-name prefix: the module each group is `fully_shard` of.
GROUP_PATTERNS = (
    re.compile(r"^(transformer\.h\.\d+)\."),   # GPT-2, GPT-3 (Hugging Face GPT2Model)
    re.compile(r"^(model\.layers\.\d+)\."),    # LLaMA (LlamaModel)
    re.compile(r"^(encoder\.layer\.\d+)\."),   # BERT (BertModel)
    re.compile(r"^(layer\d+)\."),              # ResNet/ResNeXt stages (torchvision)
    re.compile(r"^(blocks\.\d+)\."),           # validate's synthetic model
)

# A `--params N` layout is 100 equal chunks (`presets.synthetic_layout`) with no blocks: groups of
# this many, 25 groups, about the blocks of a 1-7B transformer (GPT-3 XL 24, LLaMA-7B 32).
CHUNKS_PER_GROUP = 4

_CHUNK = re.compile(r"^chunk\.(\d+)$")

ROOT = "root"


def _group_of(name: str, unit: str | None) -> str:
    if unit is not None:
        match = re.match(rf"^({re.escape(unit)}\.[^.]+)\.", name)
        return match.group(1) if match else ROOT
    for pattern in GROUP_PATTERNS:
        match = pattern.match(name)
        if match:
            return match.group(1)
    match = _CHUNK.match(name)
    if match:
        first = int(match.group(1)) // CHUNKS_PER_GROUP * CHUNKS_PER_GROUP
        return f"chunk.{first}-{first + CHUNKS_PER_GROUP - 1}"
    return ROOT


@dataclass(frozen=True)
class FsdpGroup:
    name: str
    numel: int
    shapes: tuple[tuple[int, ...], ...] = ()

    def padded_numel(self, shards: int) -> int:
        """What its collectives move, in elements: each parameter's dim 0 padded to a multiple of
        the shard count (`_fsdp_common.py:129-131` `_get_dim0_padded_size`)."""
        if not self.shapes:
            return self.numel
        return sum(-(-shape[0] // shards) * shards * math.prod(shape[1:]) for shape in self.shapes)


@dataclass(frozen=True)
class Segment:
    """A run of forward uses of one group: its share of forward and of backward compute."""

    group: int
    forward_share: float
    backward_share: float


@dataclass(frozen=True)
class FsdpPlan:
    """The groups (root last, as `fully_shard` is applied bottom-up) and the compute in forward
    order as segments of groups; `grouping` says how the groups were found."""

    groups: tuple[FsdpGroup, ...]
    segments: tuple[Segment, ...]
    grouping: str

    @property
    def root(self) -> int:
        return len(self.groups) - 1

    # Each order is read by every FSDP timeline of the job (the sweep and the fits search run
    # hundreds): derived once per plan.
    @cached_property
    def forward_order(self) -> tuple[int, ...]:
        """Groups in the order their pre-forward hooks run: the root's first (its hook wraps the
        whole forward), then each group at its first use."""
        return tuple(dict.fromkeys([self.root, *(seg.group for seg in self.segments)]))

    @cached_property
    def post_forward_order(self) -> tuple[int, ...]:
        """The order of post-forward hooks: each block when its forward returns, the root last."""
        return (*(g for g in self.forward_order if g != self.root), self.root)

    @cached_property
    def largest_group_params(self) -> int:
        return max(g.numel for g in self.groups)


# One layout's plan is asked for at every size and mode the fits search counts; the plan and the
# layout are frozen, so each is built once.
@lru_cache(maxsize=16)
def fsdp_plan(layout: Layout, unit: str | None = None) -> FsdpPlan:
    """FSDP groups of a layout: one per block (GROUP_PATTERNS, or each child of the module `unit`)
    and the root holding the rest; compute shares per group from the layout's uses."""
    names = [t.name for t in layout.tensors]
    keys = [_group_of(n, unit) for n in names]
    blocks = [k for k in dict.fromkeys(keys) if k != ROOT]
    if not blocks:
        raise InputError(f"--fsdp-unit {unit}: no parameter of {layout.name} is inside a child of {unit!r}"
                         if unit else f"{layout.name}: no FSDP unit found (no blocks to wrap); give --fsdp-unit MODULE")
    index = {k: i for i, k in enumerate(blocks)}
    index[ROOT] = len(blocks)
    numel = [0] * (len(blocks) + 1)
    shapes: list[list[tuple[int, ...]]] = [[] for _ in numel]
    for t, k in zip(layout.tensors, keys):
        numel[index[k]] += t.numel
        shapes[index[k]].append(tuple(t.shape))
    groups = tuple(FsdpGroup(k, n, tuple(sh)) for k, n, sh in zip([*blocks, ROOT], numel, shapes))
    fwd_total, bwd_total = layout.forward_flops_per_token, layout.backward_flops_per_token
    segments: list[Segment] = []
    for use in layout.uses:
        g = index[keys[use.tensors[0]]]
        f = (use.backward_flops_per_token / 2 if use.forward_flops_per_token is None
             else use.forward_flops_per_token) / fwd_total
        b = use.backward_flops_per_token / bwd_total
        if segments and segments[-1].group == g:
            last = segments[-1]
            segments[-1] = Segment(g, last.forward_share + f, last.backward_share + b)
        else:
            segments.append(Segment(g, f, b))
    how = (f"each child of {unit}" if unit else
           f"{CHUNKS_PER_GROUP} chunks per group" if blocks[0].startswith("chunk.") else "one per block")
    return FsdpPlan(groups, tuple(segments), f"{len(blocks)} groups ({how}) + root")


def describe_plan(plan: FsdpPlan) -> dict:
    return {"grouping": plan.grouping, "groups": len(plan.groups),
            "root_params": plan.groups[plan.root].numel,
            "largest_group_params": plan.largest_group_params}


def recompute_shares(plan: FsdpPlan, ac: Checkpointing, blocks: int | None) -> tuple[float, ...]:
    """Each group's share of activation checkpointing's recompute (by group index, summing to 1;
    empty when nothing is recomputed). Where the groups are the model's `blocks` (one per block),
    the blocks `ac` checkpoints share it evenly (`full`, `op`: all; `layer:N`: every N-th); where
    they are not (a `--params` layout's chunks, grouped `CHUNKS_PER_GROUP` at a time, against the
    traced synthetic model's MLP blocks), it is spread over the groups by their backward compute."""
    if ac.mode == "none":
        return ()
    inner = [g for g in range(len(plan.groups)) if g != plan.root]
    if blocks is not None and len(inner) == blocks:
        chosen = [g for i, g in enumerate(inner) if ac.mode == "op" or ac.wraps(i)]
        share = {g: 1 / len(chosen) for g in chosen} if chosen else {}
    else:
        backward = {g: 0.0 for g in inner}
        for seg in plan.segments:
            if seg.group in backward:
                backward[seg.group] += seg.backward_share
        total = sum(backward.values()) or 1.0
        share = {g: b / total for g, b in backward.items()}
    return tuple(share.get(g, 0.0) for g in range(len(plan.groups)))
