"""The passes on meta the memory and the search's candidates are counted from, as records:
what is traced (`traced_shape`: `ModelShape`, a preset or `--params` model at 1 and 2 blocks;
`UserShape`, a `--model` whole), the candidates' passes (`CandidatePasses`, run by `traces.candidate_passes`)
and their compute priced as the main pass is (`priced_candidates`). Pure: the passes are run in
`traces`, from `gather`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topoprof.errors import InputError
from topoprof.model.compute.extended import at_depths, composed_of
from topoprof.model.compute.modelled import ModelledCompute
from topoprof.model.compute.profile_choice import Pricing
from topoprof.model.compute.traced import PRESET_SPEC, SYNTHETIC_SPEC, modelled_compute
from topoprof.model.inputs.request import WorkloadRequest
from topoprof.specs.messages import TraceFailure
from topoprof.specs.traced_pass import TracedPass
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
    (`unit`, --fsdp-unit), the modes the search asks for, and `blocks`: how many alike blocks it
    has, where it is traced by its first 1 and 2 blocks as a preset is (checked against the pass of
    the whole model, `traces.user_passes`); None: traced whole."""

    spec: str
    micro_batch: int
    seq_len: int | None
    unit: str | None
    modes: tuple[str, ...]
    blocks: int | None = None
    per_sample: int = 1  # sequences per sample (a preset's `ModelShape` may split one)


@dataclass(frozen=True)
class WholePass:
    """The pass of a user's whole model (its trace, under the job's checkpointing `ac`) that its
    passes at 1 and 2 blocks are checked against (`traces.blocks_alike`)."""

    trace: TracedPass
    ac: str


@dataclass(frozen=True)
class CandidatePasses:
    """The passes the search's candidates (`wanted`: (checkpointing mode text, samples)) are
    priced from: at 1 and 2 blocks (`by_blocks`), keyed (traced mode, sequences, depth); a
    `--model`'s whole, keyed (mode text, samples); each its pass or its failure."""

    shape: ModelShape | UserShape
    wanted: tuple[tuple[str, int], ...]
    traces: dict[Any, TracedPass | TraceFailure]


def block_passes(shape: ModelShape | UserShape, wanted: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(traced mode, sequences) of the passes at 1 and 2 blocks the candidates need."""
    return sorted({(mode, m * shape.per_sample) for text, m in wanted for mode in composed_of(text)})


def priced_candidates(passes: CandidatePasses, pricing: Pricing) -> dict[tuple[str, int], ModelledCompute] | str:
    """The modelled compute of each candidate, priced as the main pass is (`gather.gather`'s
    `Pricing`), or why none: a `--model`'s pass whole, a preset's or `--params` model's at 1 and 2
    blocks extended to its depth. Each pass is priced once, whatever the candidates that share it."""
    shape, blocks = passes.shape, by_blocks(passes.shape)
    failed = next((t.reason for t in passes.traces.values() if isinstance(t, TraceFailure)), None)
    if failed is not None:  # a pass that failed is why the candidates have no price
        return failed if blocks else f"pricing its ops failed ({failed})"
    try:
        priced = {key: modelled_compute(t, pricing) for key, t in passes.traces.items() if isinstance(t, TracedPass)}
        if not blocks:
            return {key: priced[key] for key in passes.wanted}
        assert shape.blocks is not None  # `by_blocks`
        return at_depths(priced, passes.wanted, shape.blocks, shape.per_sample, shape.seq_len)
    except (InputError, ValueError, KeyError) as err:
        return f"pricing its ops failed ({err})"


def by_blocks(shape: ModelShape | UserShape) -> bool:
    """Whether the model is traced by its first 1 and 2 blocks (a preset or `--params` always; a
    `--model` of alike blocks), else whole."""
    return isinstance(shape, ModelShape) or shape.blocks is not None


def traced_shape(w: WorkloadRequest) -> ModelShape | UserShape | str:
    """What a `WorkloadRequest`'s model is traced at for its memory's and its candidates' passes
    (a user's model whole, until its passes find its blocks alike), or why a preset or `--params`
    model is not (`model_shape`)."""
    if not w.user_model:
        return model_shape(w.preset_name, w.param_count, w.micro_batch_size, w.tokens, w.preset_sizes)
    return UserShape(w.user_model, w.micro_batch_size, max(1, w.tokens // w.micro_batch_size) if w.tokens else None,
                     w.fsdp_unit, w.checkpointing.searched_modes)
