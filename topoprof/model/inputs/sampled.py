"""A pass on meta at any micro-batch size from the same pass at two sizes. Where a model runs the
same ops on each sample's rows, every count its pass records (an op's FLOPs and bytes, a tensor's
shape, the backward FLOPs at each gradient) is affine in the samples: c(m) = c(2) + (m - 2) x
(c(3) - c(2)), from the passes at SAMPLES = (2, 3) its memory is counted from
(`traces.memory_set`). The fits search prices its candidates from such passes (`extend`) where
those were traced for the device it prices for, once a pass at the largest size of each
checkpointing mode, traced for real at 1 and 2 blocks, is the pass extended to it, equal count for
count: one pass checks a mode's line where one pass per size was traced.

A pass not extended (its size below SAMPLES, whose ops may differ there; its mode's check failed;
no passes at SAMPLES for its device) is traced as before. What is not extended: the batch's
description ("shape", which names its size; a candidate priced by blocks names its own), the
memory (counted from the memory's own passes; its rounded peak is not affine), the gradients'
ready fractions (made anew from their FLOPs, as `topoprof/trace/op_trace.py:trace_pass` makes
them) and the host cost of selective checkpointing (measured in the candidates' worker: taken from
the pass that checked the line).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

from topoprof.model.inputs.candidates import SAMPLES
from topoprof.specs.traced_pass import TracedPass, TraceTarget

Key = tuple[str, int, int]  # (traced checkpointing mode, samples, depth), as the candidates key their passes


class _Differs(Exception):
    """Two passes differ in more than their counts."""


@dataclass(frozen=True)
class SampledPasses:
    """The passes at SAMPLES of a model's depths and checkpointing modes, traced for `target`,
    keyed (mode, samples, depth)."""

    target: TraceTarget
    passes: dict[Key, TracedPass] = field(default_factory=dict)

    def for_target(self, target: TraceTarget) -> dict[Key, TracedPass]:
        """Its passes where they were traced for `target`, else none."""
        return self.passes if target == self.target else {}


def _affine(two: Any, three: Any, steps: int) -> Any:
    """`two` where the two values are equal, an int `steps` sizes past SAMPLES[0] on its line,
    lists, dicts and records of the same layout item by item; _Differs otherwise."""
    if type(two) is type(three) and two == three:
        return two
    if type(two) is int and type(three) is int:  # not a bool: bool is an int's subclass, not int
        return two + steps * (three - two)
    if isinstance(two, list) and isinstance(three, list) and len(two) == len(three):
        return [_affine(a, b, steps) for a, b in zip(two, three)]
    if isinstance(two, dict) and isinstance(three, dict) and two.keys() == three.keys():
        return {k: _affine(two[k], three[k], steps) for k in two}
    if dataclasses.is_dataclass(two) and not isinstance(two, type) and type(two) is type(three):
        return replace(two, **{f.name: _affine(getattr(two, f.name), getattr(three, f.name), steps)
                               for f in dataclasses.fields(two)})
    raise _Differs


def pass_at(two: TracedPass, three: TracedPass, samples: int) -> TracedPass | None:
    """The pass at `samples` from `two` and `three` (the same pass at SAMPLES), each count extended
    on its own line; None where they differ in more than their counts (an op, a name, a float)."""
    try:
        out = _affine(replace(counts_of(two), ready=[]), replace(counts_of(three), ready=[]), samples - SAMPLES[0])
    except _Differs:
        return None
    total = out.totals.backward.flops
    return replace(out, ready=[[i, f / total] for i, f in out.ready_flops] if total > 0 else [])


def same_counts(extended: TracedPass, traced: TracedPass) -> bool:
    """Whether a pass extended is the pass traced at its size, in all it extends and recomputes."""
    return extended == counts_of(traced)


def counts_of(traced: TracedPass) -> TracedPass:
    """What a pass extended holds of a pass traced: its counts and what is recomputed from them.
    Left empty, what it does not take from the counts (the module docstring says why of each): the
    pass's own description and its memory, and the host cost of selective checkpointing, copied
    from the pass that checked the line."""
    return replace(traced, shape="", memory=None, selective_checkpoint=None)


def checks(keys: list[Key], known: dict[Key, TracedPass]) -> dict[str, int]:
    """Per mode, the size its line is checked at: its largest past SAMPLES that its known passes
    reach (a mode asked at SAMPLES alone needs no check)."""
    out: dict[str, int] = {}
    for mode, samples, depth in keys:
        if samples > SAMPLES[-1] and _extendable((mode, samples, depth), known):
            out[mode] = max(out.get(mode, 0), samples)
    return out


def _extendable(key: Key, known: dict[Key, TracedPass]) -> bool:
    mode, samples, depth = key
    return samples >= SAMPLES[0] and all((mode, s, depth) in known for s in SAMPLES)


def _extended(key: Key, known: dict[Key, TracedPass]) -> TracedPass | None:
    mode, samples, depth = key
    return pass_at(known[(mode, SAMPLES[0], depth)], known[(mode, SAMPLES[1], depth)], samples)


def to_trace_first(keys: list[Key], known: dict[Key, TracedPass]) -> list[Key]:
    """The passes traced before any is extended: those no known line reaches, and the checks."""
    checked = checks(keys, known)
    return [key for key in keys if not _extendable(key, known) or checked.get(key[0]) == key[1]]


def extend(keys: list[Key], known: dict[Key, TracedPass], traced: dict[Key, Any]
           ) -> tuple[dict[Key, TracedPass], list[Key]]:
    """(the passes extended, the keys left to trace): each key not traced whose mode's check held
    at every depth (or that needs none, at SAMPLES), from its known passes."""
    held = {mode: _check_held(mode, size, keys, known, traced) for mode, size in checks(keys, known).items()}
    out, rest = {}, []
    for key in keys:
        if key in traced:
            continue
        mode, samples, depth = key
        extended = _extended(key, known) if _extendable(key, known) and (
            samples <= SAMPLES[-1] or held.get(mode) is not None) else None
        if extended is None:
            rest.append(key)
            continue
        cost_from = held.get(mode) or known[(mode, SAMPLES[0], depth)]
        out[key] = replace(extended, selective_checkpoint=cost_from.selective_checkpoint)
    return out, rest


def _check_held(mode: str, size: int, keys: list[Key], known: dict[Key, TracedPass], traced: dict[Key, Any]
                ) -> TracedPass | None:
    """A pass that checked `mode`'s line at `size` (the extended pass was the traced one at each
    depth), else None."""
    at_size = [key for key in keys if key[0] == mode and key[1] == size]
    for key in at_size:
        extended, real = _extended(key, known), traced.get(key)
        if extended is None or not isinstance(real, TracedPass) or not same_counts(extended, real):
            return None
    return traced[at_size[0]]
