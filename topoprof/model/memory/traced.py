"""What one micro-batch holds per GPU beyond the model's states, counted from its op trace
(`topoprof/trace/op_trace.py`, `topoprof/trace/live_bytes.py`): what its blocks keep for backward under each
activation checkpointing mode, the logits and the loss, autocast's weight copies held for
backward, the backward's transient and the allocator's rounding.

A model of L identical blocks at m samples per micro-batch (a fixed sequence length) holds
a + b·L + c·m + d·L·m bytes of each of them: each block keeps the same, each sample the same.
Four passes on meta, at 1 and 2 blocks and 2 and 3 samples, give the four coefficients exactly, and
with them any depth and any micro-batch (`TracedMemory`; `tests/test_memory_parts.py` checks the
extension against the pass of the whole model). Not 1 sample: there a slice of the batch can be a
view where from 2 samples on it is a copy (the next-token labels, `tokens[:, 1:].flatten()`), so a
micro-batch of 1 is counted as the line through 2 and 3 puts it, a few bytes high. The backward's transient does not
grow with the depth (its peak is the head's gradient or one block's recompute and backward): it is taken at 2
blocks, linear in the samples. `layer:N` is composed from `none` and `full`: a block keeps, beside
its output (which the next block or the final norm keeps in every mode), what its own mode keeps.

Each part is what the micro-batch adds; the step never holds them all at once. What it holds over
the pass (`timeline`, `topoprof.model.memory.timeline`) is composed from the passes at 2 blocks,
each block as its mode runs it, at the micro-batch by the line through the two sizes.

A user's `--model` is traced so too where its blocks are alike (cut to its first 1 and 2 blocks,
`topoprof.model.inputs.traces.user_passes`); where they are not, it is traced whole (`whole`), at
2 and 3 samples under each mode the search asks for (`layer:N` too, traced as such), and extended
to the micro-batch alone, the line through the two: each sample keeps the same.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from topoprof.model.memory.timeline import (
    BlockPass,
    Timeline,
    composable,
    composed,
    from_segments,
    interpolated,
)
from topoprof.specs.traced_pass import KeptTensor, PassMemory
from topoprof.workload.checkpointing import Checkpointing

# The parts a micro-batch adds, as the trace names them (topoprof/trace/op_trace.py `memory`)
PARTS = ("activations", "logits", "param_copies", "backward_transient", "rounding")


@dataclass(frozen=True)
class MicroBatchBytes:
    """Bytes one micro-batch adds on a GPU, part by part (module docstring)."""

    activations: float          # what the embedding and the blocks keep for backward
    logits: float = 0.0         # what the final norm, the head and the loss keep (the logits' log-softmax)
    param_copies: float = 0.0   # autocast's 16-bit copies of the weights that backward reads
    # the most the pass holds above what its forward ends with: the backward's transient (gradients
    # apart) or the forward's own (the loss's upcast), the larger
    backward_transient: float = 0.0
    rounding: float = 0.0       # the caching allocator's rounding of the pass's peak
    logits_detail: str = ""     # the tensors after the last block, with their dtypes
    timeline: Timeline | None = None  # what the pass holds point by point (`topoprof.model.memory.timeline`)

    @property
    def forward_end(self) -> float:
        """What the forward leaves for the backward, autocast's copies included."""
        return self.activations + self.logits + self.param_copies


def from_trace(memory: PassMemory) -> MicroBatchBytes:
    """The parts of one pass's `memory` (topoprof/trace/op_trace.py), and its timeline."""
    kept = memory.kept
    logits = float(kept.after_blocks_bytes if kept else 0)
    return MicroBatchBytes(
        activations=float(memory.activations_bytes) - logits, logits=logits,
        param_copies=float(memory.param_copies_bytes),
        backward_transient=float(max(memory.backward_transient_bytes, memory.forward_transient_bytes)),
        rounding=float(max(0, memory.rounded_peak_bytes - memory.peak_bytes)),
        logits_detail=describe_tensors(kept.after_blocks_tensors if kept else []),
        timeline=from_segments(memory, kept.blocks if kept else 0))


def describe_tensors(rows: list[KeptTensor], largest: int = 3) -> str:
    """'log_softmax 16382x128256 float32 8.4 GB, mul 2x8192x4096 float32 0.27 GB, ...'."""
    def one(r: KeptTensor) -> str:
        op = r.op.replace("aten.", "").split(".")[0].lstrip("_")
        return f"{op} {'x'.join(map(str, r.shape))} {r.dtype} {r.bytes / 1e9:.3g} GB"
    shown = [one(r) for r in rows[:largest]]
    rest = sum(r.bytes for r in rows[largest:])
    return ", ".join(shown + ([f"{len(rows) - largest} more {rest / 1e9:.2g} GB"] if rows[largest:] else []))


def _bilinear(points: dict[tuple[int, int], float], blocks: int, samples: float) -> float:
    """q(L, m) = a + b·L + c·m + d·L·m through the four points at L in {1, 2} and two sizes."""
    m1, m2 = sorted({m for _, m in points})
    q11, q12, q21, q22 = points[(1, m1)], points[(1, m2)], points[(2, m1)], points[(2, m2)]
    dl, dm = blocks - 1, (samples - m1) / (m2 - m1)
    return q11 + dl * (q21 - q11) + dm * (q12 - q11) + dl * dm * (q22 - q21 - q12 + q11)


@dataclass(frozen=True)
class TracedMemory:
    """The parts at 1 and 2 blocks and 1 and 2 samples, per checkpointing mode ("none", "full",
    "op") and variant ("autocast": fp32 weights under autocast, as DDP trains; "cast": the weights
    in 16 bits, as FSDP2's MixedPrecisionPolicy runs its blocks), extended to `blocks` blocks.
    `whole`: the model traced whole (module docstring), its points at (1, samples) per mode as
    `Checkpointing.text` spells it; `seq_len` 0 (the samples are the micro-batch's own)."""

    blocks: int
    seq_len: int
    # (variant, mode) -> {(blocks, samples): MicroBatchBytes}
    points: dict = field(default_factory=dict)
    source: str = ""
    whole: bool = False

    def variants(self) -> tuple[str, ...]:
        return tuple(sorted({v for v, _ in self.points}))

    def has(self, variant: str, ac: Checkpointing) -> bool:
        if self.whole:
            return (variant, ac.text) in self.points
        modes = ("none", "full") if ac.mode == "layer" else (ac.mode,)
        return all((variant, m) in self.points for m in modes)

    def count(self, ac: Checkpointing, samples: float, variant: str = "autocast") -> MicroBatchBytes:
        """The parts of a micro-batch of `samples` sequences of the whole model under `ac`."""
        if self.whole:
            return replace(self._at(ac.text, variant, 1, samples),
                           timeline=self._whole_timeline(ac.text, variant, samples))
        if ac.mode == "layer":
            wrapped = self.blocks // ac.every  # torchtitan wraps where the block count % N == 0
            parts = _composed(self._at("none", variant, self.blocks - wrapped, samples),
                              self._at("full", variant, wrapped, samples), self._at("none", variant, 0, samples))
            kinds = ["full" if (i + 1) % ac.every == 0 else "none" for i in range(self.blocks)]
        else:
            parts, kinds = self._at(ac.mode, variant, self.blocks, samples), [ac.mode] * self.blocks
        return replace(parts, timeline=self._timeline(kinds, variant, samples))

    def _whole_timeline(self, mode: str, variant: str, samples: float) -> Timeline | None:
        """What a model traced whole holds over its pass, at the micro-batch by the line through
        the two sizes traced."""
        pts = self.points[(variant, mode)]
        m1, m2 = sorted({m for _, m in pts})
        one, two = pts[(1, m1)].timeline, pts[(1, m2)].timeline
        return None if one is None or two is None else interpolated(one, two, (samples - m1) / (m2 - m1))

    def _timeline(self, kinds: list[str], variant: str, samples: float) -> Timeline | None:
        """What the whole model holds over its pass, block by block (module docstring)."""
        if not kinds:
            return None
        passes = {}
        for mode in set(kinds):
            pts = self.points[(variant, mode)]
            m1, m2 = sorted({m for _, m in pts})
            at = (samples - m1) / (m2 - m1)
            one, two, single = pts[(2, m1)].timeline, pts[(2, m2)].timeline, pts[(1, m1)].timeline
            if one is None or two is None or single is None:
                return None
            kept = [pts[(2, m)].forward_end - pts[(1, m)].forward_end for m in (m1, m2)]
            grads = one.grads - single.grads
            passes[mode] = BlockPass(interpolated(one, two, at), kept[0] + at * (kept[1] - kept[0]), grads)
        if not all(composable(bp) for bp in passes.values()):
            return None  # as where a pass has no timeline: the peak is read from the parts
        return composed(passes, kinds)

    def per_block(self, ac: Checkpointing, samples: float, variant: str = "autocast") -> str:
        """What one block keeps for backward at `samples` sequences, as text: 'a block keeps 2.08 GB'
        (and for layer:N, a checkpointed one's beside it)."""
        if self.whole:
            return f"the model keeps {self._at(ac.text, variant, 1, samples).activations / 1e9:.3g} GB"

        def one(mode):
            return (self._at(mode, variant, 2, samples).activations
                    - self._at(mode, variant, 1, samples).activations) / 1e9
        if ac.mode == "layer":
            return f"a block keeps {one('none'):.3g} GB, a checkpointed one {one('full'):.3g} GB"
        return f"a block keeps {one(ac.mode):.3g} GB"

    def _at(self, mode: str, variant: str, blocks: int, samples: float) -> MicroBatchBytes:
        pts = self.points[(variant, mode)]
        values = {}
        deepest = max(d for d, _ in pts)
        for part in PARTS:
            per = {key: getattr(p, part) for key, p in pts.items()}
            if part == "backward_transient" or self.whole:  # not growing with depth (module docstring)
                m1, m2 = sorted({m for _, m in per})
                values[part] = (per[(deepest, m1)]
                                + (samples - m1) * (per[(deepest, m2)] - per[(deepest, m1)]) / (m2 - m1))
            else:
                values[part] = _bilinear(per, blocks, samples)
        m1 = min(m for _, m in pts)
        detail = pts[(1, m1)].logits_detail
        return MicroBatchBytes(**values, logits_detail=f"at {m1} sequences: {detail}" if detail else "")


def _composed(unwrapped: MicroBatchBytes, wrapped: MicroBatchBytes, base: MicroBatchBytes) -> MicroBatchBytes:
    """`layer:N`: the unwrapped blocks as `none` keeps them, the wrapped ones as `full` does; the
    embedding, head and loss (`base`, the part at 0 blocks) once; the transient the larger."""
    parts = {}
    for part in ("activations", "logits", "param_copies", "rounding"):
        parts[part] = getattr(unwrapped, part) + getattr(wrapped, part) - getattr(base, part)
    parts["backward_transient"] = max(unwrapped.backward_transient, wrapped.backward_transient)
    return MicroBatchBytes(**parts, logits_detail=unwrapped.logits_detail)
