"""A model's pass on the meta device (`topoprof/trace/op_trace.py`) in a process of its own (the `op_trace`
worker), so that the CLI imports no torch: for a model nothing times here, a preset, `--params`
or a user's `--model` predicted for a GPU that is not here (a what-if never runs the model on
this machine: the worker only traces, and a model the callable builds on meta can only be
traced). It never raises: what went wrong comes back as a `TraceFailure` in the trace's place, and
the caller keeps the datasheet range with its reason."""
from __future__ import annotations

import os
from typing import Callable

from topoprof.measure.launch import JobSpec, OnMessage, launch_local, progress_messages, worker_result
from topoprof.specs.messages import Message, OpTraceJob, OpTraceResult, OpTracesResult, TraceFailure, TraceVariant
from topoprof.specs.traced_pass import TracedPass, TraceTarget

TRACE_TIMEOUT_S = 300.0


def trace_model(spec: str, kwargs: dict | None = None, stated: dict | None = None, target: TraceTarget | None = None,
                timeout_s: float = TRACE_TIMEOUT_S, progress: Callable[[str], None] | None = None,
                ac: str | None = None, unit: str | None = None) -> TracedPass | TraceFailure:
    """The worker's trace of `spec` (a `module:callable` returning (module, batch[, loss_fn])),
    built with `kwargs` and the `stated` shape for the `target` device, or its `TraceFailure`;
    `progress` hears each stage the worker reports; `ac`, `unit`: a user's model's blocks (the
    children of `unit`, else the block list found) checkpointed so (`topoprof/zoo/user_blocks.py`)."""
    checkpointed = bool(ac and ac != "none")  # "none" checkpoints nothing: the worker is sent no mode
    job = OpTraceJob(spec, kwargs, stated, target, os.getcwd(), ac=ac if checkpointed else None, blocks=unit)
    result = _run_trace_worker(job, (OpTraceResult, TraceFailure), timeout_s, progress_messages(progress))
    if isinstance(result, OpTraceResult):
        return result.trace
    return result if isinstance(result, TraceFailure) else TraceFailure(str(result), "worker")


def trace_models(spec: str, kwargs: dict | None, variants: list[TraceVariant], target: TraceTarget | None = None,
                 timeout_s: float = TRACE_TIMEOUT_S, unit: str | None = None,
                 progress: Callable[[str], None] | None = None) -> list[TracedPass | TraceFailure] | TraceFailure:
    """Several passes of one model in one worker: each variant's `kwargs` (over `kwargs`), `stated`
    shape, `target` (default `target`) and, for a user's model, `ac` (its blocks, the children of
    `unit` else the block list found, checkpointed so); a variant with `whole` keeps the whole
    trace (the ops by name, the parameters), as `trace_model` does; a user's example batch is
    resized from the samples it holds to each variant's (`op_trace.resized`). The traces in the variants'
    order (each may be its `TraceFailure`), or the worker's `TraceFailure` where it gave nothing;
    `progress` hears the stages of a `whole` pass."""
    unique, index = _distinct(variants)
    job = OpTraceJob(spec, kwargs, target=target, cwd=os.getcwd(), blocks=unit, variants=unique)
    result = _run_trace_worker(job, (OpTracesResult,), timeout_s, progress_messages(progress))
    if not isinstance(result, OpTracesResult):
        return TraceFailure(str(result), "worker")
    return [result.traces[i] for i in index]


def _distinct(variants: list[TraceVariant]) -> tuple[list[TraceVariant], list[int]]:
    """The variants without repeats (a pass asked twice, as a check of a user's blocks and as one
    of its memory passes, is traced once), and where each variant asked is among them."""
    unique: list[TraceVariant] = []
    index = []
    for variant in variants:
        if variant not in unique:
            unique.append(variant)
        index.append(unique.index(variant))
    return unique, index


def _run_trace_worker(job: OpTraceJob, kinds: tuple[type[Message], ...], timeout_s: float,
                      on_message: OnMessage | None = None) -> Message | str:
    """The worker's result of one of `kinds`, or why there is none: the caller keeps the datasheet
    range with that reason, so nothing here raises."""
    try:
        run = launch_local(JobSpec("op_trace", job, 1, "gloo", timeout_s), on_message)
    except Exception as err:  # noqa: BLE001 - no worker at all: the datasheet range stands, with the reason
        return f"the trace worker did not start ({type(err).__name__}: {err})"
    result = worker_result(run, *kinds)
    if result is None:
        why = run.failure.describe() if run.failure is not None else "it reported nothing"
        return f"the trace worker failed: {why}"
    return result
