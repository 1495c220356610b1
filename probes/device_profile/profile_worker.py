"""The device in front of it, measured for the what-if compute model: the device profile
(`topoprof.model.compute.profile` reads it; `probes/device_profile/points.py` says which points,
`probes/device_profile/sections.py` measures each section, this module runs them in a time budget).

- host_costs: seconds per op from Python on tiny tensors, ops issued back to back so that the host
  is the bottleneck: a plain op; an op recorded by autograd; one node of the autograd engine's
  backward (a chain of N recorded ops, its backward's time / N); a matmul under autocast (bf16)
  with its input's cast; the optimizer's host cost per parameter tensor (AdamW, fused on a GPU,
  foreach on a CPU, over many tiny tensors: a step's time / tensors). On a CPU also a tiny
  convolution's forward and backward (`probes/device_profile/device_costs.py`);
- gemm: FLOP/s of torch.mm over the plan's grid, in the training dtype (bf16 on a GPU, fp32 on a CPU);
- memory: bytes read + written per second of copy, add, gelu, layer_norm, rms_norm, softmax and
  a bf16 -> fp32 upcast, by size;
- sdpa: scaled_dot_product_attention forward + backward FLOP/s by sequence, head dim, causal;
- optimizer: AdamW's bytes per second over its 7 fp32 words per parameter on one large parameter;
- cpu (a CPU only): the cost of writing fresh pages (`probes/device_profile/device_costs.py`).
How each is timed: `probes/device_profile/clock.py`. Every section has a share of the time budget; a point past
it, or one that fails (out of memory), is skipped with the reason. Check a GEMM point by hand with
torch.utils.benchmark: Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b}).blocked_autorange()
(its time includes the host's cost of issuing each call, which the profile's GPU points leave out).
"""
from __future__ import annotations

import dataclasses
import datetime
import platform
import time
from typing import Callable

import psutil

from topoprof import __version__
from topoprof.probes.device_profile.clock import HOST_BLOCK_S, MAX_CALLS
from topoprof.probes.device_profile.points import PLANS
from topoprof.probes.device_profile.sections import ADAMW_WORDS, PASSES, SECTIONS
from topoprof.probes.device_profile.timing_run import ProfileRun
from topoprof.probes.hardware.host import read_cpu
from topoprof.probes.hardware.nvml import query_driver_version
from topoprof.specs.messages import DeviceProfileResult, ProfileJob, ProfileProgress, WorkerFailure
from topoprof.specs.profile_schema import PROFILE_KIND, PROFILE_SCHEMA_VERSION, SDPA_CONVENTION


class NoDevice(Exception):
    """The device asked for is not there (no CUDA device visible to torch)."""


# ---- the whole profile --------------------------------------------------------------------------

def machine_facts(torch, device: str) -> dict:
    """What was measured: the device, its software, the host; a missing field with its reason."""
    cpu, missing = read_cpu(), {}
    facts = {"kind": "cuda" if device.startswith("cuda") else "cpu", "torch": torch.__version__,
             "python": platform.python_version(), "cpu_model": cpu.model, "threads": torch.get_num_threads(),
             "hostname": platform.node(),
             "created_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if cpu.model is None:
        missing["cpu_model"] = cpu.missing.get("model", "not in /proc/cpuinfo")
    if facts["kind"] == "cuda":  # GPU only

        props = torch.cuda.get_device_properties(device)
        driver, why = query_driver_version()
        facts.update(device=props.name, sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                     driver=driver, cuda=torch.version.cuda)
        if driver is None:
            missing["driver"] = why or "unknown"
    else:
        facts.update(device=cpu.model or "CPU", sm_count=None, memory_bytes=psutil.virtual_memory().total,
                     driver=None, cuda=None)
        missing.update(sm_count="a CPU has none", driver="a CPU has none", cuda="a CPU has none")
    facts["missing"] = missing
    return facts


def conventions(run: ProfileRun) -> dict:
    device_time = ("CUDA events on the current stream around n calls queued behind a sleep kernel, so that the "
                   "host's cost of issuing them is not in it" if run.cuda else "the wall clock around n calls")
    pick = "the median block" if run.cuda else "the fastest block (a CPU shares its cores with other work)"
    return {
        "timing": f"device points: {device_time}; n from a first timing so that a block lasts about "
                  f"{run.plan.block_s * 1e3:g} ms (at most {MAX_CALLS} calls), up to 3 blocks after a warm-up call; "
                  f"per call, {pick} (probes/device_profile/clock.py)",
        "host": "the wall clock between two device synchronizations around n calls issued back to back on tiny "
                f"tensors, n from a first timing so that a block lasts about {HOST_BLOCK_S * 1e3:g} ms; per call, "
                f"{pick}",
        "gemm": "2 m n k FLOPs of torch.mm(a, b, out=c), a: m x k, b: k x n, over its time per call",
        "memory": "bytes read + written per call over its time: "
                  + ", ".join(f"{k} {p}" for k, p in PASSES.items())
                  + " passes over the input's bytes; upcast: bf16 read + fp32 written; outputs allocated per call "
                  "as training allocates them; rows of 1024 elements",
        "sdpa": SDPA_CONVENTION,
        "optimizer": f"AdamW's {ADAMW_WORDS} fp32 words per parameter (param, grad, exp_avg, exp_avg_sq read; "
                     "param, exp_avg, exp_avg_sq written) over its step's time, on one flat parameter",
    }


def measure_profile(device: str | None = None, quick: bool = False, budget_s: float | None = None,
                    on_progress: Callable[[str], None] | None = None) -> dict:
    """The device profile document of `device` ("cuda", "cuda:N", "cpu"; None: cuda where torch
    sees a GPU, else cpu). NoDevice when a GPU is asked for and torch sees none."""
    import torch  # lazy: torch, loaded only inside the worker process that measures


    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise NoDevice(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__})")
    if device == "cuda":  # torch.cuda.set_device refuses a CUDA device without its index
        device = f"cuda:{torch.cuda.current_device()}"
    if device.startswith("cuda"):  # GPU only
        torch.cuda.set_device(torch.device(device))
    started = time.perf_counter()
    # torch.optim's first optimizer imports torch._dynamo (seconds): once here, so that it does not
    # eat the first section's share of the budget
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    kind = "cuda" if device.startswith("cuda") else "cpu"
    plan = PLANS[(kind, quick)]
    if budget_s is not None:
        plan = dataclasses.replace(plan, budget_s=budget_s)
    run = ProfileRun(torch, device, plan, on_progress or (lambda line: None))
    machine = machine_facts(torch, device)
    out: dict = {"host_costs": {"seconds_per_op": {}, "how": {}}, "gemm": [], "memory": [], "sdpa": [],
                 "optimizer": None, "cpu": None}
    order = [s for s in SECTIONS if kind == "cpu" or s != "cpu"]
    for name in order:
        run.section(name, SECTIONS[name], order, out)
    notes = []
    if run.behind:
        notes.append(f"{run.behind} device point(s) where the host did not issue the calls before the sleep kernel "
                     "ended: their time may hold host gaps, an upper bound")
    if kind == "cpu":
        notes.append("the CPU runs every op on the calling thread: host and device times add (no overlap)")
    day = machine["created_utc"][:10]
    return {
        "schema_version": PROFILE_SCHEMA_VERSION, "kind": PROFILE_KIND,
        "tool": {"name": "topoprof", "version": __version__},
        "host": machine["hostname"], "created_utc": machine["created_utc"],
        "source": ("measured by `topoprof profile` (probes/device_profile/profile_worker.py)"
                   + (", quick" if quick else "")),
        "citation": f"measured on {machine['device']}, torch {torch.__version__}, {day} (topoprof profile"
                    + (" --quick)" if quick else ")"),
        "quick": quick, "seconds": time.perf_counter() - started, "dtype": str(run.dtype).split(".")[-1],
        "machine": machine, "conventions": conventions(run), **out, "skipped": run.skipped, "notes": notes,
        "section_seconds": run.seconds,
    }


def run_rank(ctx, job: ProfileJob) -> None:
    """The `profile` worker: one process, rank 0, reports the profile (or why there is none)."""
    if ctx.rank != 0:
        return
    ctx.progress("starting")
    try:
        doc = measure_profile(job.device, job.quick, job.budget_s,
                              on_progress=lambda line: ctx.send(ProfileProgress(line=line)))
    except NoDevice as err:
        ctx.send(WorkerFailure(stage="device", reason=str(err)))
        return
    ctx.send(DeviceProfileResult(profile=doc))
