"""Measure this machine's device profile (`probes/device_profile/profile_worker.py`) in a process of its own (the
`profile` worker), so that the CLI never imports torch and a hang ends at the timeout."""
from __future__ import annotations

from typing import Callable

from topoprof.errors import NothingMeasured, RunFailed
from topoprof.measure.launch import JobSpec, as_message, launch_local, worker_result
from topoprof.specs.messages import DeviceProfileResult, ProfileJob, ProfileProgress, WorkerFailure


def measure_device_profile(device: str | None = None, quick: bool = False, timeout_s: float = 300.0,
                           budget_s: float | None = None,
                           on_progress: Callable[[str], None] | None = None) -> dict:
    """The worker's profile document. NothingMeasured (exit 1) when the device asked for is not
    there; RunFailed (exit 3) when the worker died, hung for `timeout_s` without a word, or sent
    nothing. Each section's progress line goes to `on_progress` as it comes."""
    def on_message(rank: int, msg: dict) -> None:
        progress = as_message(msg, ProfileProgress)
        if isinstance(progress, ProfileProgress) and on_progress is not None:
            on_progress(progress.line)

    job = ProfileJob(device, quick, budget_s)
    run = launch_local(JobSpec("profile", job, 1, "gloo", timeout_s), on_message)
    result = worker_result(run, DeviceProfileResult, WorkerFailure)
    if isinstance(result, WorkerFailure):
        raise NothingMeasured(result.reason)
    if run.failure is not None or not isinstance(result, DeviceProfileResult):
        why = run.failure.describe() if run.failure else "the worker reported nothing"
        raise RunFailed(f"profiling the {device or 'default'} device failed: {why}")
    return result.profile
