"""Compute from the model's own operations for a GPU: which module to trace for a preset,
`--params` or `--model`, at which shape, and the roofline's range (`topoprof.model.compute.roofline`)
as a `Compute`'s modelled fields.

- a preset: its torch module (`topoprof/zoo/preset_modules.py:build`) at `--micro-batch-size` sequences
  of `--tokens` / micro-batch tokens (split into more sequences where that passes the preset's
  context, as a scan times it), or `--micro-batch-size` images of `--image-size`;
- `--params N`: the synthetic language model of N parameters that `validate` trains
  (`topoprof/zoo/preset_modules.py:build_synthetic`): MLP blocks, no attention, as the layout assumes;
- `--model`: the user's callable, traced in the same worker that reads and times it.

The pass runs on the meta device for the GPU's precision (`topoprof/trace/op_trace.py`, its target),
in a worker (`topoprof.model.inputs.traces.trace_for_gpu`), so the CLI imports no torch; this module
prices its record and runs nothing. Where it cannot run (a text model without --tokens,
an op without a meta kernel, a worker that fails), the caller keeps the datasheet range and
says why (`fallback_note`).

The ops are priced from a device profile (`profile_choice.pricing_for`): the one given
(`--gpu-profile`, a scan's own), else the nearest shipped one, as measured or scaled to the GPU
named; where no profile can be had, on the datasheet (`roofline.gpu_device`), and the notes say so.
A CPU's profile prices the model on that CPU: traced for a CPU target (fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.errors import InputError
from topoprof.model.compute.modelled import ModelledCompute, ModelledDetail
from topoprof.model.compute.profile_choice import Pricing
from topoprof.model.compute.roofline import roofline
from topoprof.model.compute.timing import UTILIZATION_BASIS
from topoprof.specs.messages import TraceFailure
from topoprof.specs.traced_pass import TracedPass
from topoprof.workload.presets import MAX_SEQ_LEN, context_sequences, is_vision
from topoprof.workload.vision import DEFAULT_IMAGE_SIZE

PRESET_SPEC = "topoprof.zoo.preset_modules:build"
SYNTHETIC_SPEC = "topoprof.zoo.preset_modules:build_synthetic"


@dataclass(frozen=True)
class TraceRequest:
    spec: str
    kwargs: dict
    stated: dict
    note: str | None = None  # how the stated shape was fitted to the model


def _ac(ac: str) -> dict:
    """The builder's `ac` argument, left out for `none` (the builders' default)."""
    return {} if ac == "none" else {"ac": ac}


def preset_request(preset: str, micro_batch: int, tokens: int | None, image_size: int | None,
                   ac: str = "none", sizes: dict | None = None) -> TraceRequest | str:
    """What to trace for a preset, or why it cannot be (a text preset needs --tokens); `ac`: its
    blocks' activation checkpointing (`topoprof/zoo/checkpoint_wrap.py`), as `Checkpointing.text` spells it;
    `sizes`: its module's arguments changed (`WorkloadRequest.preset_sizes`)."""
    name = preset.strip().lower()
    if is_vision(name):
        size = image_size or DEFAULT_IMAGE_SIZE
        return TraceRequest(PRESET_SPEC, {"preset": name, "image_size": size, **_ac(ac)}, {"micro_batch": micro_batch})
    if not tokens:
        return "no --tokens: a text model's sequence length is unknown"
    sequences, seq_len, _ = context_sequences(name, micro_batch, tokens)
    note = (None if sequences == micro_batch else
            f"{tokens} tokens exceed {micro_batch} sequence(s) of {name}'s {MAX_SEQ_LEN[name]}: traced as {sequences} "
            f"of {seq_len}")
    return TraceRequest(PRESET_SPEC, {"preset": name, **_ac(ac), **({"sizes": sizes} if sizes else {})},
                        {"micro_batch": sequences, "seq_len": seq_len}, note)


def params_request(params: int, micro_batch: int, tokens: int | None, ac: str = "none") -> TraceRequest | str:
    if not tokens:
        return "no --tokens: a text model's sequence length is unknown"
    return TraceRequest(SYNTHETIC_SPEC, {"params": params, **_ac(ac)},
                        {"micro_batch": micro_batch, "seq_len": max(1, tokens // micro_batch)},
                        "--params N is traced as topoprof's synthetic model of N parameters (validate's: "
                        "embedding, MLP blocks, LayerNorm, untied head; no attention)")


def modelled_compute(trace: TracedPass, pricing: Pricing, note: str | None = None) -> ModelledCompute:
    """A `Compute`'s `modelled` from a trace priced by `pricing`; InputError where the GPU,
    its precision or the profile cannot price it (`Pricing.why`), ValueError where the trace cannot
    be priced."""
    if pricing.why is not None:
        raise InputError(pricing.why)
    pricer, chosen_notes = pricing.pricer, pricing.notes
    recompute = recompute_seconds(trace, pricer)
    result = roofline(trace, pricer)
    fast, middle, slow = result.seconds
    shape = trace.shape or "its example batch"
    how = ("per op the rate a device profile measured for its kind and size" if hasattr(pricer, "profile") else
           "per op the larger of FLOPs over peak x efficiency and bytes over bandwidth")
    basis = f"{result.kernels} kernels of its op trace at {shape} on {result.device}, {how}, and a host cost per op"
    if recompute is not None:
        basis += ("; activation checkpointing's recompute ops are in its backward, priced with it "
                  f"({recompute[1] * 1e3:.3g} ms of them alone, middle)")
    detail = ModelledDetail(
        seconds=(fast, middle, slow), device=result.device, shape=shape, recompute_s=recompute,
        kernels=result.kernels, views=result.views, flops=result.flops, bytes_moved=result.bytes_moved,
        backward_fraction=result.backward_fraction, host_s=result.middle.host_s, device_s=result.middle.device_s,
        device_s_by_kind=result.middle.by_kind, host_bound=result.host_bound, summary=result.summary(),
        basis=tuple(result.basis), memory=trace.memory,
        notes=tuple(dict.fromkeys([*result.notes, *chosen_notes, *([note] if note else [])])),
        optimizer=pricer.optimizer_rates(trace.params) if hasattr(pricer, "optimizer_rates") else None)
    return ModelledCompute((fast, middle, slow), basis, result.backward_fraction, detail)


def recompute_seconds(trace: TracedPass, pricer) -> tuple[float, float, float] | None:
    """(fast, middle, slow) seconds of the trace's recompute ops (`topoprof/trace/op_trace.py` marks them
    in the backward) priced alone by the same pricer; None where nothing is recomputed."""
    ops = [op for op in trace.ops if op.recompute]
    if not ops:
        return None
    return roofline(TracedPass(ops), pricer).seconds


def priced(trace: TracedPass | TraceFailure | None, pricing: Pricing,
           note: str | None = None) -> tuple[ModelledCompute | None, str | None]:
    """(`modelled_compute`, None), or (None, why the trace could not be priced: none was run, it
    failed, it was run for another device or precision, or its ops could not be priced)."""
    if not trace:
        return None, "no pass on the meta device was run"
    if isinstance(trace, TraceFailure):
        return None, trace.reason
    want = pricing.target
    target = trace.target
    if target is None or target.device != want.device:
        return None, f"the pass on the meta device was not run for a {'GPU' if want.device == 'cuda' else 'CPU'}"
    if target.precision != want.precision:
        return None, (f"the pass on the meta device ran in {target.precision}, not {want.precision} "
                    f"({trace.autocast_failure or 'another precision'})")
    try:
        return modelled_compute(trace, pricing, note), None
    except (InputError, ValueError, KeyError) as err:
        return None, f"pricing its ops failed ({err})"


def fallback_note(why: str) -> str:
    return (f"compute: the model's own ops could not be priced ({why}); the datasheet range stands in: "
            f"6 x params x tokens over peak x {UTILIZATION_BASIS}")
