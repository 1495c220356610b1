"""Small passes of a preset or `--params` model on meta, at 1 and 2 blocks, for what the whole
model holds and takes under each activation checkpointing mode at any micro-batch size:

- `memory_set`: 1 and 2 blocks x 2 and 3 samples x the modes none, full and op (layer:N is
  composed from none and full), under autocast and, for FSDP's 16-bit param_dtype, with the
  weights cast (`topoprof.model.memory.traced.TracedMemory` extends them exactly);
- `compute_at`: a candidate's (mode, samples) at 1 and 2 blocks, priced and extended to the
  model's depth (`topoprof.model.compute.extended`).

Each set is one worker (`topoprof.measure.meta_trace.trace_models`): the CLI imports no torch. A text
model needs its sequence length (--tokens); an image model's stages are not one block repeated:
for it nothing is traced here, and the caller says why.

A `--model`'s depth cannot be changed: it is traced whole (`UserShape`), at 2 and 3 samples under
each mode the search asks for (`user_memory_set`), and at each candidate's (mode, samples) for its
compute (`user_compute_at`). Its callable builds each size where it takes `micro_batch` (or
`batch_size`); else its example batch is resized along its first dimension
(`topoprof/trace/op_trace.py:resized`), and where it cannot be, the search says why.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from topoprof.errors import InputError
from topoprof.measure.meta_trace import trace_models
from topoprof.model.compute.extended import at_depth, priced_line
from topoprof.model.compute.profile import load_profile
from topoprof.model.compute.traced import PRESET_SPEC, SYNTHETIC_SPEC, gpu_target, modelled_fields, target_for
from topoprof.model.memory.traced import MicroBatchBytes, TracedMemory, from_trace
from topoprof.model.strategies.search import searched_modes
from topoprof.workload.checkpointing import parse_checkpointing
from topoprof.workload.presets import MAX_SEQ_LEN, PRESET_DEPTH, context_sequences, is_vision
from topoprof.workload.synthetic import spec_for_params

TRACED_MODES = ("none", "full", "op")
DEPTHS = (1, 2)
SAMPLES = (2, 3)  # not 1: `topoprof.model.memory.traced`


@dataclass(frozen=True)
class ModelShape:
    """What is traced: a builder, its arguments, the sequence and the real depth. A sample longer
    than a preset's context is traced as `per_sample` sequences of `seq_len` tokens, as the main
    pass is (`compute.traced.preset_request`)."""

    spec: str
    kwargs: dict
    seq_len: int
    blocks: int
    label: str
    per_sample: int = 1


def model_shape(preset: str | None, params: int | None, micro_batch: int, tokens: int | None,
                sizes: dict | None = None) -> ModelShape | str:
    """The shape a preset (its module's arguments changed by `sizes`) or `--params` is traced at,
    or why it is not."""
    if preset is None and params is None:
        return "a --model's depth cannot be changed: its own pass counts it at the micro-batch given"
    if is_vision(preset):
        return "an image model's stages are not one block repeated: its own pass counts it at the micro-batch given"
    if not tokens:
        return "no --tokens: a text model's sequence length is unknown"
    seq = max(1, tokens // micro_batch)
    if preset is not None:
        name = preset.strip().lower()
        _, seq_len, per_sample = context_sequences(name, micro_batch, tokens)
        changed = ", ".join(f"{k} {v}" for k, v in (sizes or {}).items())
        label = f"{name} ({changed})" if changed else name
        if per_sample > 1:
            each = (f"its context {seq_len}" if seq_len == MAX_SEQ_LEN[name]
                    else f"{seq_len} tokens (its context: {MAX_SEQ_LEN[name]})")
            label += f", each sample of {seq} tokens as {per_sample} sequences of {each}"
        return ModelShape(PRESET_SPEC, {"preset": name, **({"sizes": sizes} if sizes else {})}, seq_len,
                          PRESET_DEPTH[name], label, per_sample)

    assert params is not None  # a preset or --params
    return ModelShape(SYNTHETIC_SPEC, {"params": params}, seq, spec_for_params(params, seq).n_layers,
                      f"the synthetic model of {params:,} parameters (a block: fc1, GELU, fc2)")


@dataclass(frozen=True)
class UserShape:
    """A user's `--model` as the search traces it: its callable, the micro-batch its example batch
    was built at, the sequence stated (None without --tokens), its checkpointing's block list
    (`unit`, --fsdp-unit) and the modes the search asks for."""

    spec: str
    micro_batch: int
    seq_len: int | None
    unit: str | None
    modes: tuple[str, ...]


def _user_variant(shape: UserShape, mode: str, samples: int, target: dict) -> dict:
    return {"stated": {"micro_batch": samples, "seq_len": shape.seq_len}, "ac": mode, "target": target}


def _user_traces(shape: UserShape, variants: list[dict]) -> list[dict] | str:
    """The passes, or the first failure's reason."""
    traces = trace_models(shape.spec, None, variants, unit=shape.unit, resize_from=shape.micro_batch)
    if isinstance(traces, dict):
        return traces["failure"]
    failed = next((t for t in traces if t.get("failure") or t.get("autocast_failure")), None)
    if failed is not None:
        return failed.get("failure") or f"in 16 bits: {failed['autocast_failure']}"
    return traces


def user_memory_set(shape: UserShape, precision: str, cast: bool, gpu: str | None = None) -> TracedMemory | str:
    """A user's model traced whole at 2 and 3 samples under each searched mode for the GPU named,
    or why not."""
    target = gpu_target(precision, gpu)
    targets = {"autocast": target}
    if cast and precision != "fp32":
        targets["cast"] = {**target, "weights": "cast"}
    keys = [(v, mode, m) for v in targets for mode in shape.modes for m in SAMPLES]
    traces = _user_traces(shape, [_user_variant(shape, mode, m, targets[v]) for v, mode, m in keys])
    if isinstance(traces, str):
        return traces
    points: dict = {}
    for (v, mode, m), trace in zip(keys, traces):
        points.setdefault((v, mode), {})[(1, m)] = from_trace(trace["memory"])
    source = (f"passes of {shape.spec} whole at {SAMPLES[0]} and {SAMPLES[1]} samples on meta, extended to the "
              "micro-batch (each sample the same)")
    return TracedMemory(1, 0, points, source, whole=True)


def user_compute_at(shape: UserShape, wanted: list[tuple[str, int]], gpu: str | None, precision: str,
                    compiled: bool, profile_path: str | None = None) -> dict[tuple[str, int], dict] | str:
    """Modelled compute fields of a user's model per (mode, samples) in `wanted`, each a pass of the
    whole model priced as the main pass is; or why none."""
    profile = load_profile(profile_path) if profile_path else None
    target = target_for(precision, profile, gpu)
    traces = _user_traces(shape, [_user_variant(shape, mode, m, target) for mode, m in wanted])
    if isinstance(traces, str):
        return traces
    try:
        return {key: modelled_fields(trace, gpu, precision, compiled, profile=profile, profile_path=profile_path)
                for key, trace in zip(wanted, traces)}
    except (InputError, ValueError, KeyError) as err:
        return f"pricing its ops failed ({err})"


def _variant(mode: str, depth: int, samples: int, seq: int, target: dict) -> dict:
    return {"kwargs": {"n_layer": depth, **({"ac": mode} if mode != "none" else {})},
            "stated": {"micro_batch": samples, "seq_len": seq}, "target": target}


def memory_set(shape: ModelShape, precision: str, cast: bool, gpu: str | None = None) -> TracedMemory | str:
    """The memory passes (module docstring) for the GPU named, or why they failed."""
    targets = {"autocast": gpu_target(precision, gpu)}
    if cast and precision != "fp32":
        targets["cast"] = {**gpu_target(precision, gpu), "weights": "cast"}
    keys = [(v, mode, d, m) for v in targets for mode in TRACED_MODES for d in DEPTHS for m in SAMPLES]
    traces = trace_models(shape.spec, shape.kwargs, [_variant(mode, d, m, shape.seq_len, targets[v])
                                                     for v, mode, d, m in keys])
    if isinstance(traces, dict):
        return traces["failure"]
    points: dict = {}
    for (v, mode, d, m), trace in zip(keys, traces):
        if trace.get("failure") or trace.get("autocast_failure"):
            return f"{mode} at {d} block(s) x {m}: {trace.get('failure') or trace['autocast_failure']}"
        points.setdefault((v, mode), {})[(d, m)] = from_trace(trace["memory"])
    source = (f"passes of {shape.label} at 1 and 2 blocks and {SAMPLES[0]} and {SAMPLES[1]} sequences of "
              f"{shape.seq_len} tokens on meta, "
              f"extended to {shape.blocks} blocks (each keeps the same) and the micro-batch (each sequence the same)")
    return TracedMemory(shape.blocks, shape.seq_len, points, source)


def compute_at(shape: ModelShape, wanted: list[tuple[str, int]], gpu: str | None, precision: str,
               compiled: bool, profile_path: str | None = None) -> dict[tuple[str, int], dict] | str:
    """Modelled compute fields per (checkpointing mode text, samples) in `wanted`, or why none;
    priced as the main pass is (`profile_path`: a --gpu-profile, else the nearest shipped one)."""
    profile = load_profile(profile_path) if profile_path else None
    parsed = {text: parse_checkpointing(text) for text, _ in wanted}
    wanted_sequences = {m: m * shape.per_sample for _, m in wanted}
    needed = sorted({(mode, wanted_sequences[m]) for text, m in wanted
                     for mode in (("none", "full") if parsed[text].mode == "layer" else (parsed[text].mode,))})
    keys = [(mode, m, d) for mode, m in needed for d in DEPTHS]
    traces = trace_models(shape.spec, shape.kwargs,
                          [_variant(mode, d, m, shape.seq_len, target_for(precision, profile, gpu))
                                                     for mode, m, d in keys])
    if isinstance(traces, dict):
        return traces["failure"]
    by_key = dict(zip(keys, traces))
    out = {}
    for text, m in wanted:
        ac = parsed[text]
        lines = {}
        try:
            for mode in (("none", "full") if ac.mode == "layer" else (ac.mode,)):
                one, two = by_key[(mode, wanted_sequences[m], 1)], by_key[(mode, wanted_sequences[m], 2)]
                if one.get("failure") or two.get("failure"):
                    return one.get("failure") or two["failure"]
                lines[mode] = priced_line(one, two, gpu, precision, compiled, profile)
        except (InputError, ValueError, KeyError) as err:
            return f"pricing its ops failed ({err})"
        out[(text, m)] = at_depth(lines, ac.mode, ac.every, shape.blocks, f"{wanted_sequences[m]}x{shape.seq_len}")
    return out


def user_shape(w) -> UserShape:
    """The user's model of a `WorkloadRequest` as the search traces it."""
    return UserShape(w.user_model, w.micro_batch_size, max(1, w.tokens // w.micro_batch_size) if w.tokens else None,
                     w.fsdp_unit, searched_modes(w.checkpointing))


def micro_batch_bytes(traced: TracedMemory, mode: str, samples: int) -> MicroBatchBytes:
    """For tests and reports: the parts of `samples` sequences under `mode`."""
    return traced.count(parse_checkpointing(mode), samples)


def with_traced_memory(workload, w, gpu: str | None, precision: str):
    """(`workload` with its `traced_memory`, a note or None): traced where a GPU is named or timed
    (the passes stand for it) and a preset or `--params` has its sequence; the note says why not
    where the passes failed."""
    if gpu is None or workload.activation_memory_gb is not None:
        return workload, None
    if w.user_model:
        if workload.measured_memory:  # timed here: its memory as measured, at its own size
            return workload, None
        traced = user_memory_set(user_shape(w), precision, cast=workload.fsdp_bytes[0] == 2, gpu=gpu)
        if isinstance(traced, str):
            return replace(workload, traced_memory_failure=traced), None
        return replace(workload, traced_memory=traced), None
    shape = model_shape(w.preset_name, w.param_count, w.micro_batch_size, w.tokens, w.preset_sizes)
    if isinstance(shape, str):  # an image model, or no --tokens: the main pass alone counts it
        return workload, None
    traced = memory_set(shape, precision, cast=workload.fsdp_bytes[0] == 2, gpu=gpu)
    if isinstance(traced, str):
        return workload, f"memory: the passes at 1 and 2 blocks failed ({traced}); counted from the main pass only"
    return replace(workload, traced_memory=traced), None
