"""One forward and backward of a model on the meta device, as topoprof/trace/op_trace.py records it:
every aten op with its FLOPs and bytes, the ops summed, the memory the pass held, and the order its
gradients were ready in; with the device it was run as (`TraceTarget`), the model's parameters
(`ParamEntry`), its blocks as checkpointing wrapped them (`WrappedBlocks`), the attention kernels it
took (`AttentionChoices`) and what `op` mode's policy costs the host (`SelectiveCheckpointCost`),
which a model's timed record and the trace jobs carry too. The trace worker sends it
(`OpTraceResult`, `OpTracesResult`, a user's model's record) and the predict stage reads it: compute
prices its ops (topoprof.model.compute), memory counts its bytes (topoprof.model.memory), the fits
search extends it to other sizes (topoprof.model.inputs.sampled). It imports nothing of torch, so
both sides import it; the one codec (topoprof.specs.messages) writes and reads it field by field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParamEntry:
    """One parameter tensor as DDP sees it (topoprof/zoo/user_callable.py:parameter_list): in
    registration order, a tensor shared under several names once, with its other names (`aliases`)."""

    name: str
    shape: list[int]
    dtype: str = "float32"
    requires_grad: bool = True
    aliases: list[str] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class WrappedBlocks:
    """A user's model's blocks as activation checkpointing wrapped them
    (topoprof/zoo/user_blocks.py:checkpoint_user_model): under `mode`, `wrapped` of the `blocks`
    children of `container` (None: the model itself), found as `chosen` says."""

    mode: str
    container: str | None
    blocks: int
    wrapped: int
    chosen: str

    def describe(self) -> str:
        """'activation checkpointing full on model.layers (32 blocks; found: ...)'."""
        count = f"{self.blocks} blocks" if self.wrapped == self.blocks else f"{self.wrapped} of {self.blocks} blocks"
        return f"activation checkpointing {self.mode} on {self.container or 'the model'} ({count}; {self.chosen})"


@dataclass(frozen=True)
class AttentionChoices:
    """The attention kernel each call took on the target (topoprof/trace/target_lens.py): its calls
    per backend run, and why the faster backends were refused, per backend run."""

    calls: dict[str, int]
    refused: dict[str, str]


@dataclass(frozen=True)
class SelectiveCheckpointCost:
    """What an op run under torchtitan's `op` policy costs the host, as a `ratio` over a plain op
    autograd records (topoprof/trace/selective_cost.py), and `how` it was had: stated, or measured
    on this machine's CPU (then with both seconds per op)."""

    ratio: float
    how: str
    seconds_per_op: float | None = None
    recorded_seconds_per_op: float | None = None


@dataclass(frozen=True)
class TraceTarget:
    """The device a pass on meta is run as (topoprof/trace/target_lens.py): a CUDA GPU at
    `precision` ("bf16", "fp16" or "fp32"), or a CPU, which trains in fp32. `weights` "cast": a
    16-bit pass with the model's weights cast to that dtype and no autocast, as FSDP2's
    MixedPrecisionPolicy(param_dtype) runs its blocks (the all-gathered parameters in param_dtype,
    the inputs cast to it); else "autocast". `capability`: the CUDA GPU's (its attention backend
    depends on it; None: the lens's default); `attention`: a backend forced where the model's own
    attention is that kernel (Hugging Face's flash_attention_2). `check_target` there refuses
    what no device runs and drops what the device ignores."""

    device: str
    precision: str = "fp32"
    weights: str = "autocast"
    capability: tuple[int, int] | None = None
    attention: str | None = None

    def __post_init__(self) -> None:
        if self.capability is not None and not isinstance(self.capability, tuple):  # read back from JSON
            object.__setattr__(self, "capability", tuple(self.capability))


@dataclass(frozen=True, slots=True)
class TracedOp:
    """One aten op as it ran (or one fused kernel standing for several, topoprof.model.compute.fusion).
    `reads` and `writes`: [storage key, bytes] of each storage it touched (None for a view);
    `outputs`: the bytes of each tensor it returned."""

    name: str
    phase: str                          # "forward" or "backward"
    flops: int
    view: bool
    bytes_read: int
    bytes_written: int
    shapes: list[list[int]] | None = None   # its tensor arguments' shapes, where it has FLOPs
    causal: bool | None = None              # an attention op's mask, as it ran
    recompute: bool = False                 # run again in the backward by checkpointing
    selective: bool = False                 # inside a module `op` mode checkpoints
    outputs: list[int] | None = None
    inplace: bool = False
    reads: list[list[int]] | None = None
    writes: list[list[int]] | None = None
    fused_kinds: list[str] | None = None    # a fused kernel's members' memory kinds
    fused_ops: int = 0                      # how many ops a fused kernel stands for


@dataclass(frozen=True, slots=True)
class OpSum:
    """The ops of one name in one phase (the recomputed apart), summed."""

    name: str
    phase: str
    count: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    recompute: bool = False


@dataclass(frozen=True, slots=True)
class PhaseTotals:
    ops: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass(frozen=True, slots=True)
class PassTotals:
    """The ops per phase, and the recompute within the backward."""

    forward: PhaseTotals = field(default_factory=PhaseTotals)
    backward: PhaseTotals = field(default_factory=PhaseTotals)
    recompute: PhaseTotals = field(default_factory=PhaseTotals)


@dataclass(frozen=True, slots=True)
class KeptTensor:
    """A tensor kept for the backward after the last block: the op that made it, its dtype and shape."""

    op: str
    dtype: str
    shape: list[int]
    bytes: int


@dataclass(frozen=True, slots=True)
class KeptByPlace:
    """What the forward keeps for the backward by where it was allocated: before the first block, in
    each block, after the last (and those tensors one by one, the largest first)."""

    blocks: int
    before_blocks_bytes: int
    blocks_bytes: list[int]
    after_blocks_bytes: int
    after_blocks_tensors: list[KeptTensor]


@dataclass(frozen=True, slots=True)
class MemorySegment:
    """One stretch of the pass (topoprof/trace/live_bytes.py): in `phase`, before the blocks, in
    block `block`, after them (or the backward's head and tail); the most held and the op that
    reached it, the most held besides the gradients written, and those gradients."""

    phase: str
    kind: str
    block: int | None
    live: int
    fresh: int
    grads_before: int
    live_op: str
    fresh_op: str


@dataclass(frozen=True, slots=True)
class PassMemory:
    """What the pass held (topoprof/trace/live_bytes.py): at the forward's end for the backward,
    its peaks, the backward's transient above its start, the gradients, the allocator's rounding."""

    activations_bytes: int
    param_copies_bytes: int
    kept: KeptByPlace | None            # None where the repeated blocks were not known
    peak_bytes: int
    rounded_peak_bytes: int
    forward_peak_bytes: int
    forward_transient_bytes: int
    backward_start_bytes: int
    backward_peak_bytes: int
    backward_transient_bytes: int
    grads_bytes: int
    segments: list[MemorySegment]


@dataclass(frozen=True, slots=True)
class TracedPass:
    """One pass on meta. `ready`: [parameter index, share of the backward's FLOPs done] as each
    gradient was ready (`ready_flops`: the FLOPs themselves); `target`: the device it was run as
    (None: as meta runs it); `attention`: which kernel each attention call took there, and why
    not another. What only the main pass keeps (`by_name`, `params`) is None in the passes the
    memory and the fits search trace."""

    ops: list[TracedOp]
    totals: PassTotals = field(default_factory=PassTotals)
    memory: PassMemory | None = None
    ready: list[list[float]] = field(default_factory=list)
    ready_flops: list[list[int]] = field(default_factory=list)
    autograd_nodes: int | None = None
    autograd_leaves: int | None = None
    by_name: list[OpSum] | None = None
    target: TraceTarget | None = None
    attention: AttentionChoices | None = None
    # the model the pass is of: its callable, the batch it was given (its description, the shape
    # named to its callable, its samples), its parameters
    spec: str = ""
    device: str = "meta"
    shape: str = ""
    kwargs: dict = field(default_factory=dict)
    samples: int | None = None
    params: list[ParamEntry] | None = None
    checkpointing: WrappedBlocks | None = None  # its blocks as checkpointed, where they were
    blocks_of: int | None = None            # the blocks it had, where it was cut to its first ones
    block_list: str | None = None           # the module whose children are its repeated blocks
    autocast_failure: str | None = None     # why it ran in fp32, where autocast failed
    selective_checkpoint: SelectiveCheckpointCost | None = None  # what `op` mode costs per op here


def aggregate(ops: list[TracedOp]) -> list[OpSum]:
    """The ops summed by name and phase (recomputed ones apart), the most FLOPs first (then the
    most bytes)."""
    rows: dict[tuple[str, str, bool], list[int]] = {}
    for op in ops:
        row = rows.setdefault((op.name, op.phase, op.recompute), [0, 0, 0, 0])
        row[0] += 1
        row[1] += op.flops
        row[2] += op.bytes_read
        row[3] += op.bytes_written
    sums = [OpSum(name, phase, count, flops, read, written, recompute)
            for (name, phase, recompute), (count, flops, read, written) in rows.items()]
    return sorted(sums, key=lambda r: (-r.flops, -(r.bytes_read + r.bytes_written), r.name))


def totals(ops: list[TracedOp]) -> PassTotals:
    """Per phase, and for the recompute within the backward."""
    out = {part: [0, 0, 0, 0] for part in ("forward", "backward", "recompute")}
    for op in ops:
        for part in (op.phase, "recompute") if op.recompute else (op.phase,):
            row = out[part]
            row[0] += 1
            row[1] += op.flops
            row[2] += op.bytes_read
            row[3] += op.bytes_written
    return PassTotals(*(PhaseTotals(*out[part]) for part in ("forward", "backward", "recompute")))
