"""A model's pass on the meta device (`topoprof/trace/op_trace.py`) in a process of its own (the `op_trace`
worker), so that the CLI imports no torch: for a model nothing times here, a preset, `--params`
or a user's `--model` predicted for a GPU that is not here (a what-if never runs the model on
this machine: the worker only traces, and a model the callable builds on meta can only be
traced). It never raises: what went wrong comes back as the trace's `failure`, and the caller
keeps the datasheet range with that reason."""
from __future__ import annotations

import os
from typing import Callable

from topoprof.measure.launch import JobSpec, launch_local, progress_messages

TRACE_TIMEOUT_S = 300.0


def trace_model(spec: str, kwargs: dict | None = None, stated: dict | None = None, target: dict | None = None,
                timeout_s: float = TRACE_TIMEOUT_S, progress: Callable[[str], None] | None = None,
                ac: str | None = None, unit: str | None = None) -> dict:
    """The worker's trace of `spec` (a `module:callable` returning (module, batch[, loss_fn])),
    built with `kwargs` and the `stated` shape for the `target` device, or {"failure": reason};
    `progress` hears each stage the worker reports; `ac`, `unit`: a user's model's blocks (the
    children of `unit`, else the block list found) checkpointed so (`topoprof/zoo/user_blocks.py`)."""
    job = JobSpec("op_trace", {"spec": spec, "kwargs": kwargs, "stated": stated, "target": target,
                               "cwd": os.getcwd(), **_checkpointing(ac, unit)}, 1, "gloo", timeout_s)
    try:
        run = launch_local(job, progress_messages(progress))
    except Exception as err:  # noqa: BLE001 - no worker at all: the datasheet range stands, with the reason
        return {"failure": f"the trace worker did not start ({type(err).__name__}: {err})"}
    found = [msg for _, msg in run.messages if msg.get("type") == "op_trace"]
    if not found:
        why = run.failure.describe() if run.failure is not None else "it reported nothing"
        return {"failure": f"the trace worker failed: {why}"}
    return {k: v for k, v in found[0].items() if k != "type"}


def _checkpointing(ac: str | None, unit: str | None) -> dict:
    return {"ac": ac, "blocks": unit} if ac and ac != "none" else {"blocks": unit} if unit else {}


def trace_models(spec: str, kwargs: dict | None, variants: list[dict], target: dict | None = None,
                 timeout_s: float = TRACE_TIMEOUT_S, unit: str | None = None,
                 resize_from: int | None = None) -> list[dict] | dict:
    """Several passes of one model in one worker: each variant's `kwargs` (over `kwargs`), `stated`
    shape, `target` (default `target`) and, for a user's model, `ac` (its blocks, the children of
    `unit` else the block list found, checkpointed so); `resize_from`: the micro-batch a user's
    example batch was built at, resized to each variant's. The traces in the variants' order (each
    may be a {"failure": reason}), or {"failure": reason} where the worker gave nothing."""
    job = JobSpec("op_trace", {"spec": spec, "kwargs": kwargs, "target": target, "variants": variants,
                               "cwd": os.getcwd(), **_checkpointing(None, unit),
                               **({"resize_from": resize_from} if resize_from else {})}, 1, "gloo", timeout_s)
    try:
        run = launch_local(job)
    except Exception as err:  # noqa: BLE001 - no worker at all: the caller says why
        return {"failure": f"the trace worker did not start ({type(err).__name__}: {err})"}
    found = [msg for _, msg in run.messages if msg.get("type") == "op_traces"]
    if not found:
        why = run.failure.describe() if run.failure is not None else "it reported nothing"
        return {"failure": f"the trace worker failed: {why}"}
    return found[0]["traces"]
