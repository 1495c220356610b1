"""Read and time the user's own model in a process of its own (the `user_model` worker), so that
its import, its memory and its bugs stay out of the CLI, and a hang ends at the timeout."""
from __future__ import annotations

import os
from typing import Callable

from topoprof.errors import InputError, RunFailed
from topoprof.measure.launch import JobSpec, launch_local, progress_messages, worker_result
from topoprof.specs.messages import UserModelJob, UserModelRecord, UserModelResult, WorkerFailure
from topoprof.specs.traced_pass import TraceTarget


def measure_user_model(spec: str, device: str = "cpu", repeats: int = 3, timeout_s: float = 300.0,
                       precision: str = "bf16", optimizer: str = "adamw", kwargs: dict | None = None,
                       trace: dict | None = None, target: TraceTarget | None = None,
                       progress: Callable[[str], None] | None = None, ac: str | None = None,
                       unit: str | None = None, stated: dict | None = None) -> UserModelRecord:
    """The worker's record, timed at `stated` (the shape the prediction is for: its callable built
    at it, or its batch resized to it, as its pass on meta is; None: as its callable builds it);
    InputError (exit 2) when the user's callable cannot be used, with its
    traceback as the error's detail, printed once under its one line. With `trace` (the stated
    shape, e.g. {"micro_batch": 4, "seq_len": 512}) the record's `op_trace` is the model's pass
    on the meta device (`topoprof/trace/op_trace.py`) for the `target` device, or its `TraceFailure`.
    `progress` hears each stage the worker reports. `ac`: the model's blocks (the children of
    `unit`, else the block list found) checkpointed so, timed and traced (`topoprof/zoo/user_blocks.py`)."""
    checkpointed = bool(ac and ac != "none")  # the blocks are only named when they are checkpointed
    job = UserModelJob(spec, device, repeats, os.getcwd(), precision, optimizer, kwargs, trace, target,
                       ac if checkpointed else None, unit if checkpointed else None, stated)
    run = launch_local(JobSpec("user_model", job, 1, "gloo", timeout_s), progress_messages(progress))
    result = worker_result(run, UserModelResult, WorkerFailure)
    if isinstance(result, WorkerFailure):
        error = InputError(f"--model {spec}: {result.reason}")
        error.detail_text = result.trace
        raise error
    if run.failure is not None or not isinstance(result, UserModelResult):
        why = run.failure.describe() if run.failure else "the worker reported nothing"
        raise RunFailed(f"--model {spec}: timing it failed: {why}")
    return result.record
