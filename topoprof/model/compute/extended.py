"""A micro-batch's modelled compute from passes of the model at 1 and 2 blocks, extended to its
depth: each block runs the same ops, so every end of the roofline's range (and the forward, and
the recompute) grows by the same amount per block, T(L) = T(1) + (L - 1) x (T(2) - T(1)), as a model
too large for one GPU is timed at two depths (`scaled`). Where the host and the device trade the
bound from one depth to the next this is the line through the two, not the roofline of the whole
pass. `layer:N` (every N-th block checkpointed) is composed from the lines of `none` and `full`:
T_none(L - W) + T_full(W) - T_none(0) for W = L // N checkpointed blocks. The search over
micro-batch sizes and checkpointing modes prices its candidates so, at a fraction of a whole
pass's cost.
"""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.model.compute.modelled import ModelledCompute, ModelledDetail
from topoprof.workload.checkpointing import parse_checkpointing


@dataclass(frozen=True)
class Line:
    """Seconds at 1 and 2 blocks, per quantity: the range's (fast, middle, slow) ends, the forward
    (middle) and the recompute (middle)."""

    one: tuple[float, ...]
    two: tuple[float, ...]
    device: str

    def at(self, blocks: int) -> tuple[float, ...]:
        return tuple(a + (blocks - 1) * (b - a) for a, b in zip(self.one, self.two))


def _values(priced: ModelledCompute) -> tuple[float, ...]:
    fast, middle, slow = priced.seconds
    assert priced.backward_fraction is not None  # a pass priced op by op has its backward's share
    return fast, middle, slow, middle * (1 - priced.backward_fraction), priced.detail.recomputed_middle_s


def line_of(one_block: ModelledCompute, two_blocks: ModelledCompute) -> Line:
    """The line through the passes at 1 and 2 blocks, each priced (`traced.modelled_compute`)."""
    return Line(_values(one_block), _values(two_blocks), one_block.detail.device)


def composed_of(text: str) -> tuple[str, ...]:
    """The traced modes a checkpointing mode is composed from: layer:N from none and full."""
    mode = parse_checkpointing(text).mode
    return ("none", "full") if mode == "layer" else (mode,)


def at_depths(priced: dict[tuple[str, int, int], ModelledCompute], wanted: tuple[tuple[str, int], ...],
              blocks: int, per_sample: int, seq_len: int | None) -> dict[tuple[str, int], ModelledCompute]:
    """Each wanted (checkpointing mode text, samples)'s modelled compute at `blocks` blocks, from
    the passes priced at 1 and 2 blocks keyed (traced mode, sequences, depth); a sample is
    `per_sample` sequences of `seq_len` tokens (None: no sequence stated)."""
    out = {}
    for text, m in wanted:
        ac, sequences = parse_checkpointing(text), m * per_sample
        lines = {mode: line_of(priced[(mode, sequences, 1)], priced[(mode, sequences, 2)])
                 for mode in composed_of(text)}
        size = f"{sequences}x{seq_len}" if seq_len else f"micro-batch {sequences}"
        out[(text, m)] = at_depth(lines, ac.mode, ac.every, blocks, size)
    return out


def extended_compute(values: tuple[float, ...], device: str, shape: str, how: str) -> ModelledCompute:
    """A `Compute`'s `modelled` from (fast, middle, slow, forward, recompute) seconds."""
    fast, middle, slow, forward, recompute = values
    # each end is extended on its own line: where the host and the device trade the bound between
    # depths, the lines can cross (a fast end past the middle). The range then holds both ends
    # about the middle as extended.
    fast, slow = min(fast, middle, slow), max(fast, middle, slow)
    basis = f"its ops at {shape} on {device}, {how}"
    detail = ModelledDetail(seconds=(fast, middle, slow), device=device, shape=shape, basis=(basis,), summary=basis,
                            recompute_s=(recompute,) * 3 if recompute > 0 else None)
    return ModelledCompute((fast, middle, slow), basis, 1 - forward / middle if middle > 0 else None, detail)


def at_depth(lines: dict[str, Line], mode: str, every: int, blocks: int, shape: str) -> ModelledCompute:
    """The modelled compute of `blocks` blocks under checkpointing `mode` ("none", "full", "op", or
    "layer" every `every`-th block) from the priced lines of the modes (module docstring)."""
    if mode == "layer":
        wrapped = blocks // every
        none, full = lines["none"], lines["full"]
        values = tuple(u + w - z for u, w, z in zip(none.at(blocks - wrapped), full.at(wrapped), none.at(0)))
        how = (f"none at {blocks - wrapped} and full at {wrapped} blocks, each priced at 1 and 2 blocks and extended "
               "(each block runs the same ops)")
        return extended_compute(values, none.device, shape, how)
    line = lines[mode]
    return extended_compute(line.at(blocks), line.device, shape,
                           f"priced at 1 and 2 blocks and extended to {blocks} (each block runs the same ops)")
