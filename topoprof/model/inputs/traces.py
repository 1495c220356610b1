"""Small passes of a preset or `--params` model on meta, at 1 and 2 blocks, for what the whole
model holds and takes under each activation checkpointing mode at any micro-batch size:

- `memory_set`: 1 and 2 blocks x 2 and 3 samples x the modes none, full and op (layer:N is
  composed from none and full), under autocast and, for FSDP's 16-bit param_dtype, with the
  weights cast (`topoprof.model.memory.traced.TracedMemory` extends them exactly);
- `candidate_passes`: a candidate's (mode, samples) at 1 and 2 blocks, which `candidates.priced_candidates`
  prices and extends to the model's depth (`topoprof.model.compute.extended`).

Each set is one worker (`topoprof.measure.meta_trace.trace_models`): the CLI imports no torch. A text
model needs its sequence length (--tokens); an image model's stages are not one block repeated:
for it nothing is traced here, and the caller says why.

A `--model` (`UserShape`) is traced so too where its blocks are alike: cut to its first 1 and 2
blocks, once two passes so cut at its main pass's size, mode and target extend to that whole pass
exactly, checked in the same worker (`user_passes`); else whole, at 2 and 3 samples under each
mode the search asks for (`user_memory_set`), and at each candidate's (mode, samples) for its
compute (`candidate_passes`). Its callable builds each size where it takes `micro_batch` (or
`batch_size`); else its example batch is resized along its first dimension
(`topoprof/trace/op_trace.py:resized`), and where it cannot be, the search says why.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from topoprof.measure.meta_trace import trace_model, trace_models
from topoprof.model.compute.modelled import ModelledCompute
from topoprof.model.compute.profile_choice import Pricing
from topoprof.model.compute.traced import TraceRequest, priced
from topoprof.model.inputs.candidates import (
    DEPTHS,
    SAMPLES,
    TRACED_MODES,
    CandidatePasses,
    ModelShape,
    UserShape,
    WholePass,
    block_passes,
    by_blocks,
)
from topoprof.model.inputs.sampled import Key, SampledPasses, extend, to_trace_first
from topoprof.model.memory.traced import TracedMemory, from_trace
from topoprof.specs.messages import TraceFailure, TraceVariant
from topoprof.specs.traced_pass import PassMemory, TracedPass, TraceTarget


@dataclass(frozen=True)
class MemoryPasses:
    """What the memory's passes give: the memory (or why the passes failed), the passes at
    SAMPLES for the GPU the memory is counted for, which the search's candidates extend
    (`sampled`), and a user's model as traced (its alike blocks, where its passes were cut to them)."""

    memory: TracedMemory | str
    sampled: SampledPasses | None = None
    traced_as: UserShape | None = None


def _sampled(target: TraceTarget, keys: list[tuple], traces: list, variant: str = "autocast") -> SampledPasses:
    """The passes keyed (variant, mode, depth, samples) of `variant`, keyed as candidates key theirs."""
    return SampledPasses(target, {(mode, m, d): t for (v, mode, d, m), t in zip(keys, traces)
                                  if v == variant and isinstance(t, TracedPass)})


def _user_variant(shape: UserShape, mode: str, samples: int, target: TraceTarget,
                  depth: int | None = None) -> TraceVariant:
    return TraceVariant(stated={"micro_batch": samples, "seq_len": shape.seq_len}, target=target, ac=mode, depth=depth)


def _user_traces(shape: UserShape, variants: list[TraceVariant]) -> list[TracedPass] | str:
    """The passes, or the first failure's reason."""
    return _every_pass(trace_models(shape.spec, None, variants, unit=shape.unit))


def _why_not(trace: TracedPass | TraceFailure) -> str | None:
    """Why a pass does not stand for the target asked: it failed, or ran in fp32 only."""
    if isinstance(trace, TraceFailure):
        return trace.reason
    return f"in 16 bits: {trace.autocast_failure}" if trace.autocast_failure else None


def _every_pass(traces: list[TracedPass | TraceFailure] | TraceFailure) -> list[TracedPass] | str:
    """The passes where every one stands, else the first one's reason."""
    if isinstance(traces, TraceFailure):
        return traces.reason
    failed = next((why for why in map(_why_not, traces) if why is not None), None)
    return failed if failed is not None else [t for t in traces if isinstance(t, TracedPass)]


def _memory(trace: TracedPass | TraceFailure) -> PassMemory:
    """A pass's memory: a user's passes have every failure taken out (`_every_pass`), and every
    pass the worker sends has its memory."""
    assert isinstance(trace, TracedPass) and trace.memory is not None
    return trace.memory


Passes = dict[Any, TracedPass | TraceFailure]  # by key: (mode, samples, depth), or as a plan keys them
Plan = Callable[[UserShape], list[tuple[tuple, TraceVariant]]]  # the (key, variant) of each pass, by blocks or whole


def blocks_alike(whole: TracedPass, one: TracedPass | TraceFailure, two: TracedPass | TraceFailure) -> int | None:
    """N, the blocks of a user's model, where its passes cut to 1 and 2 blocks (`one`, `two`, at
    the same size, mode and target as `whole`) extended to N blocks are its whole pass: the same
    forward and backward FLOPs and the same bytes kept for backward, so each block takes and keeps
    what the others do; else None (it is then traced whole)."""
    if isinstance(one, TraceFailure) or isinstance(two, TraceFailure):
        return None
    n = one.blocks_of
    if not n:
        return None

    def measures(t: TracedPass) -> tuple[int, ...]:
        return t.totals.forward.flops, t.totals.backward.flops, *([t.memory.activations_bytes] if t.memory else [])

    extended = tuple(a + (n - 1) * (b - a) for a, b in zip(measures(one), measures(two)))
    return n if extended == measures(whole) else None


def user_passes(shape: UserShape, plan: Plan, whole: WholePass | None) -> tuple[UserShape, Passes | str]:
    """(the shape as traced, its passes by key, or why they failed): by its first 1 and 2 blocks
    where its blocks are known alike (`shape.blocks`) or found so in the same worker, two passes
    cut to 1 and 2 blocks held against `whole` (`blocks_alike`); else whole, as before."""
    if shape.blocks is None and whole is not None and whole.trace.target:
        probes = [_user_variant(shape, whole.ac, shape.micro_batch, whole.trace.target, d) for d in DEPTHS]
        pairs = plan(replace(shape, blocks=0))  # laid out by blocks; their number once the probes say it
        traces = _user_traces(shape, probes + [variant for _, variant in pairs])
        blocks = None if isinstance(traces, str) else blocks_alike(whole.trace, traces[0], traces[1])
        if blocks is not None:
            assert not isinstance(traces, str)
            return replace(shape, blocks=blocks), dict(zip([key for key, _ in pairs], traces[2:]))
    pairs = plan(shape)
    traces = _user_traces(shape, [variant for _, variant in pairs])
    return shape, traces if isinstance(traces, str) else dict(zip([key for key, _ in pairs], traces))


def user_memory_set(shape: UserShape, precision: str, cast: bool, target: TraceTarget,
                    whole: WholePass | None = None) -> MemoryPasses:
    """A user's model traced for the GPU `target` (`profile_choice.gpu_target`) at 2 and 3 samples under
    each searched mode, by its first 1 and 2 blocks where they are alike (`user_passes`), else
    whole: its memory or why not, and the shape as traced."""
    targets = {"autocast": target}
    if cast and precision != "fp32":
        targets["cast"] = replace(target, weights="cast")

    def plan(at: UserShape) -> list[tuple[tuple, TraceVariant]]:
        if by_blocks(at):
            return [((v, mode, d, m), _user_variant(at, mode, m, targets[v], d))
                    for v in targets for mode in TRACED_MODES for d in DEPTHS for m in SAMPLES]
        return [((v, mode, m), _user_variant(at, mode, m, targets[v])) for v in targets for mode in at.modes
                for m in SAMPLES]

    shape, traces = user_passes(shape, plan, whole)
    if isinstance(traces, str):
        return MemoryPasses(traces, traced_as=shape)
    points: dict = {}
    if shape.blocks is not None:
        for (v, mode, d, m), trace in traces.items():
            points.setdefault((v, mode), {})[(d, m)] = from_trace(_memory(trace))
        source = (f"passes of {shape.spec} cut to its first 1 and 2 blocks at {SAMPLES[0]} and {SAMPLES[1]} samples "
                  f"on meta, extended to its {shape.blocks} blocks (each keeps what the others do: the cut passes "
                  "extended are its whole pass) and the micro-batch (each sample the same)")
        return MemoryPasses(TracedMemory(shape.blocks, shape.seq_len or 0, points, source),
                            _sampled(target, list(traces), list(traces.values())), shape)
    for (v, mode, m), trace in traces.items():
        points.setdefault((v, mode), {})[(1, m)] = from_trace(_memory(trace))
    source = (f"passes of {shape.spec} whole at {SAMPLES[0]} and {SAMPLES[1]} samples on meta, extended to the "
              "micro-batch (each sample the same)")
    return MemoryPasses(TracedMemory(1, 0, points, source, whole=True), traced_as=shape)


def _variant(mode: str, depth: int, samples: int, seq: int, target: TraceTarget) -> TraceVariant:
    return TraceVariant({"n_layer": depth, **({"ac": mode} if mode != "none" else {})},
                        {"micro_batch": samples, "seq_len": seq}, target)


def memory_set(shape: ModelShape, precision: str, cast: bool, target: TraceTarget) -> MemoryPasses:
    """The memory passes (module docstring) for the GPU `target` (as `user_memory_set`), or why they failed."""
    keys, variants = _memory_variants(shape, precision, cast, target)
    traces = trace_models(shape.spec, shape.kwargs, variants)
    return MemoryPasses(traces.reason) if isinstance(traces, TraceFailure) else _memory_of(shape, keys, traces, target)


def main_and_memory(request: TraceRequest, target: TraceTarget, shape: ModelShape, precision: str, cast: bool,
                    memory_target: TraceTarget, progress: Callable[[str], None] | None = None
                    ) -> tuple[TracedPass | TraceFailure, MemoryPasses]:
    """The main pass (`trace_for_gpu`'s, for `target`) and the memory passes (`memory_set`'s, for
    `memory_target`) of one preset or `--params` model in one worker: one start and one torch
    import where two would be the same. The main pass is a variant that keeps the whole trace,
    with its own arguments over the shape's."""
    keys, variants = _memory_variants(shape, precision, cast, memory_target)
    main = TraceVariant(request.kwargs, request.stated, target, whole=True)
    traces = trace_models(shape.spec, shape.kwargs, [main, *variants], progress=progress)
    if isinstance(traces, TraceFailure):
        return traces, MemoryPasses(traces.reason)
    return traces[0], _memory_of(shape, keys, traces[1:], memory_target)


def _memory_variants(shape: ModelShape, precision: str, cast: bool,
                     target: TraceTarget) -> tuple[list[tuple], list[TraceVariant]]:
    targets = {"autocast": target}
    if cast and precision != "fp32":
        targets["cast"] = replace(target, weights="cast")
    keys = [(v, mode, d, m) for v in targets for mode in TRACED_MODES for d in DEPTHS for m in SAMPLES]
    return keys, [_variant(mode, d, m, shape.seq_len, targets[v]) for v, mode, d, m in keys]


def _memory_of(shape: ModelShape, keys: list[tuple], traces: list[TracedPass | TraceFailure],
               target: TraceTarget) -> MemoryPasses:
    points: dict = {}
    for (v, mode, d, m), trace in zip(keys, traces):
        why = _why_not(trace)
        if why is not None or not isinstance(trace, TracedPass):
            return MemoryPasses(f"{mode} at {d} block(s) x {m}: {why}")
        points.setdefault((v, mode), {})[(d, m)] = from_trace(_memory(trace))
    source = (f"passes of {shape.label} at 1 and 2 blocks and {SAMPLES[0]} and {SAMPLES[1]} sequences of "
              f"{shape.seq_len} tokens on meta, "
              f"extended to {shape.blocks} blocks (each keeps the same) and the micro-batch (each sequence the same)")
    return MemoryPasses(TracedMemory(shape.blocks, shape.seq_len, points, source), _sampled(target, keys, traces))


def candidate_passes(shape: ModelShape | UserShape, wanted: list[tuple[str, int]], target: TraceTarget,
                     whole: WholePass | None = None, sampled: SampledPasses | None = None) -> CandidatePasses | str:
    """The passes for `wanted` on meta for the `target` device, or why they failed: at 1 and 2
    blocks (a preset's, a user's model's whose blocks are alike), each traced or extended from the
    memory's passes at SAMPLES (`sampled`, where they were traced for `target`: `by_samples`);
    else a user's model whole, or by its first 1 and 2 blocks where they are found alike (`user_passes`)."""
    known = sampled.for_target(target) if sampled is not None else {}
    if isinstance(shape, ModelShape) or shape.blocks is not None:
        keys = [(mode, m, d) for mode, m in block_passes(shape, wanted) for d in DEPTHS]
        passes = by_samples(keys, known, lambda some: _block_passes(shape, some, target))
        return passes if isinstance(passes, str) else CandidatePasses(shape, tuple(wanted), passes)

    def plan(at: UserShape) -> list[tuple[tuple, TraceVariant]]:
        if by_blocks(at):
            return [((mode, m, d), _user_variant(at, mode, m, target, d))
                    for mode, m in block_passes(at, wanted) for d in DEPTHS]
        return [((mode, m), _user_variant(at, mode, m, target)) for mode, m in wanted]

    traced, found = user_passes(shape, plan, whole)
    return found if isinstance(found, str) else CandidatePasses(traced, tuple(wanted), found)


def _block_passes(shape: ModelShape | UserShape, keys: list[Key], target: TraceTarget) -> Passes | str:
    """The passes of `keys` (mode, samples, depth) traced in one worker, or why they failed: a
    user's model's, the first failure's reason (`_user_traces`); a preset's, each its own failure."""
    if isinstance(shape, UserShape):
        traces = _user_traces(shape, [_user_variant(shape, mode, m, target, d) for mode, m, d in keys])
        return traces if isinstance(traces, str) else dict(zip(keys, traces))
    found = trace_models(shape.spec, shape.kwargs, [_variant(mode, d, m, shape.seq_len, target) for mode, m, d in keys])
    return found.reason if isinstance(found, TraceFailure) else dict(zip(keys, found))


def by_samples(keys: list[Key], known: dict[Key, TracedPass], trace: Callable[[list[Key]], Passes | str]
               ) -> Passes | str:
    """The passes of `keys`: `trace`d (one worker a call) where no known pass at SAMPLES extends to
    them or its mode's check failed, else extended (`topoprof.model.inputs.sampled`); or why the
    tracing failed."""
    first = to_trace_first(keys, known)
    traced: Passes | str = trace(first) if first else {}
    if isinstance(traced, str):
        return traced
    extended, rest = extend(keys, known, traced)
    more: Passes | str = trace(rest) if rest else {}
    if isinstance(more, str):
        return more
    passes: Passes = {**traced, **extended, **more}
    return {key: passes[key] for key in keys}


def trace_for_gpu(request: TraceRequest, target: TraceTarget, progress=None) -> TracedPass | TraceFailure:
    """The main pass for `target` (`profile_choice.target_for`)."""
    return trace_model(request.spec, request.kwargs, request.stated, target, progress=progress)


def model_on_gpu(request: TraceRequest | str, pricing: Pricing,
                 progress=None) -> tuple[ModelledCompute | None, str | None]:
    """(the modelled compute, None), or (None, why not) where no trace or no price could be had,
    for the device `pricing` prices; `progress` hears the trace's stages."""
    if isinstance(request, str):
        return None, request
    trace = trace_for_gpu(request, pricing.target, progress)
    return priced(trace, pricing, request.note)
