"""Rank worker: the user's own model, read and timed on one process.

`--model PATH.py:CALLABLE` or `package.module:CALLABLE` names a function that returns
`(module, example_batch)` or `(module, example_batch, loss_fn)`. This worker calls it and reports:

- the parameter list as DDP sees it: `module.named_parameters()` (shared tensors once, in
  registration order; DDP's `_build_params_for_reducer` walks the same modules with the same
  memo), each with its shape, dtype and `requires_grad`, and the names that alias it;
- the order in which gradients become ready in backward, and when: a post-accumulate-grad hook
  per trainable parameter fires where DDP's reducer hook fires (`Reducer::autograd_hook` runs on
  the same AccumulateGrad node), which is the order DDP rebuilds its buckets in;
- forward, backward and optimizer times over a few repeats, under the user's precision (bf16
  autocast by default on a GPU, fp16 with a gradient scaler, or fp32; CPU ranks train in fp32)
  and optimizer (AdamW, fused on CUDA where torch has it, or SGD);
- the timed GPU's name, and, when asked (`UserModelJob.trace`: the stated shape), the same model's
  forward and backward on the meta device (`topoprof/trace/op_trace.py`): its ops, and the backward FLOPs
  done before each gradient is ready, a ready order that does not depend on this machine.

The callable and its loss are read as `topoprof/zoo/user_callable.py` reads them. A user error
(import, call, return value, a failing forward) is reported as a `WorkerFailure` with its kind as
the stage and its traceback, not raised: it is the user's to fix, not a rank failure. The job and
the messages are topoprof.specs.messages's.
"""
from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import replace

import torch

from topoprof.specs.messages import (
    StepMemory,
    TimedPass,
    UserModelJob,
    UserModelRecord,
    UserModelResult,
    WorkerFailure,
)
from topoprof.trace.meta_device import has_meta_tensors
from topoprof.trace.op_trace import resized, shape_kwargs, trace_user_model, with_selective_cost
from topoprof.zoo.user_blocks import checkpoint_user_model, find_block_list
from topoprof.zoo.user_callable import (
    UserModelError,
    batch_samples,
    call_user_callable,
    load_callable,
    parameter_list,
    to_device,
    user_loss,
)


def _stamp(device):
    """A moment of the device's own clock: an event on the current stream of that CUDA device (the
    host queues work ahead of the GPU, so its clock says when work was launched, not done); the
    host's for a CPU tensor."""
    if device is not None and device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event
    return time.perf_counter()


def _seconds_between(start, end) -> float:
    return start.elapsed_time(end) / 1e3 if hasattr(start, "elapsed_time") else end - start


def _timed_pass(module, batch, loss_fn, params, sync, autocast, scaler, memory=None, hooks: bool = True) -> TimedPass:
    """One forward and backward; with `hooks`, each trainable gradient's ready moment after
    backward starts, on the device's clock (`_stamp`). Without, nothing is added to the backward
    (a hook and an event per tensor are host work of their own on a host-bound model)."""
    device = next((p.device for p in params), None)
    ready: list[tuple[int, object]] = []
    handles = [p.register_post_accumulate_grad_hook(
        lambda p, i=i: ready.append((i, _stamp(p.device)))) for i, p in enumerate(params)
        if p.requires_grad] if hooks else []
    try:
        sync()
        t0 = time.perf_counter()
        with autocast():
            loss = user_loss(module, batch, loss_fn)
        sync()
        t1 = time.perf_counter()
        start = _stamp(device)
        if memory is not None:
            memory.mark("forward")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        end = _stamp(device)
        sync()
        t2 = time.perf_counter()
        if memory is not None:
            memory.mark("backward")
    finally:
        for h in handles:
            h.remove()
    span = max(_seconds_between(start, end), 1e-12)
    return TimedPass(t1 - t0, t2 - t1, [[i, _seconds_between(start, t) / span] for i, t in ready])


def _optimizer(name: str, params: list, device: str):
    """AdamW, fused on CUDA where this torch has it (one kernel for every tensor); or SGD."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4), "SGD"
    if device.startswith("cuda"):
        try:
            return torch.optim.AdamW(params, lr=1e-4, fused=True), "AdamW (fused)"
        except (TypeError, RuntimeError):  # torch without fused AdamW, or unsupported dtypes
            pass
    return torch.optim.AdamW(params, lr=1e-4), "AdamW"


def precision_context(precision: str, device: str):
    """The forward under the user's precision: bf16 or fp16 autocast over fp32 weights on a GPU
    (fp16 with a gradient scaler), fp32 otherwise. CPU ranks train in fp32, as `validate` does."""
    if not device.startswith("cuda") or precision == "fp32":
        return contextlib.nullcontext, "fp32", None
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    return (lambda: torch.autocast("cuda", dtype=dtype)), f"{precision} autocast", scaler


# How long a GPU timing runs, as PyTorch's own timer does it (torch.utils.benchmark.Timer.
# blocked_autorange runs until a minimum time has passed, 0.2 s by default): a few short passes
# of a host-bound model spread by a quarter on one H200 (reports/gpu-nvidia-h200-20261126: gpt2
# at 4 x 1024 tokens, 3 passes 20.1..25.1 ms), and the first passes after a process starts still
# pay first use (the caching allocator's first cudaMallocs, the optimizer's state, each new
# shape's kernel choice, clocks rising from idle after the seconds spent importing and building).
GPU_WARMUP_S = 0.2      # warm-up passes go on at least this long, and at least two
GPU_TIMED_S = 0.5       # timed passes go on at least this long, and at least `repeats`
MAX_PASSES_PER_REPEAT = 10


def measure(spec: str, device: str, repeats: int, precision: str = "bf16", optimizer: str = "adamw",
            kwargs: dict | None = None, progress=None, ac: str | None = None, unit: str | None = None,
            stated: dict | None = None) -> UserModelRecord:
    """Forward, backward and optimizer times of the user's model on `device`. On a GPU, warm-up
    and timed passes each run for a minimum time (GPU_WARMUP_S, GPU_TIMED_S); on a CPU, where a
    pass is long and steady, one warm-up and `repeats` timed passes. The ready order of the
    gradients comes from the last warm-up pass, so that no timed pass carries a hook per tensor.
    `progress` is called with each stage's text. `ac`: a user's model's blocks (the children of
    `unit`, else the block list found) checkpointed as the meta trace checkpoints them
    (`topoprof/zoo/user_blocks.py`); a preset takes it in `kwargs`. `stated`: the shape it is
    timed at, as its pass on meta is built (`shape_kwargs`, `resized`); None: as it is built."""

    say = progress or (lambda text: None)
    say(f"building {spec}")
    shape = shape_kwargs(load_callable(spec), stated)
    module, batch, loss_fn = call_user_callable(spec, {**(kwargs or {}), **shape})
    batch = resized(batch, shape, stated, None)
    if has_meta_tensors(module, batch):
        raise UserModelError("meta", f"{spec}() built its model or batch on the meta device: there is no data "
                             "to time here; it can only be traced (topoprof.measure.meta_trace.trace_model)")
    module, batch = module.to(device), to_device(batch, device)
    done = checkpoint_user_model(module, ac, unit) if ac else None
    wrapped = done[0] if done is not None else None  # the blocks' names are the trace's concern
    params = list(module.parameters())
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise UserModelError("return", "the module has no parameter with requires_grad: nothing to train")
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    opt, opt_name = _optimizer(optimizer, trainable, device)
    autocast, precision_used, scaler = precision_context(precision, device)
    memory = _MemoryPhases(device)

    def step(hooks: bool = False, memory_phases: bool = False) -> tuple[TimedPass, float]:
        module.zero_grad(set_to_none=True)
        memory.begin(record=memory_phases)
        one = _timed_pass(module, batch, loss_fn, params, sync, autocast, scaler,
                          memory if memory_phases else None, hooks)
        sync()
        t0 = time.perf_counter()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sync()
        return one, time.perf_counter() - t0

    try:
        say(f"warm-up pass of {spec} on {device}")
        ready = _warm_up(step, cuda)
        say(f"timed passes of {spec} on {device}")
        passes, optimizer_s = _timed_passes(step, cuda, repeats, say)
    except UserModelError:
        raise
    except Exception as err:  # the user's forward or backward failed (shape, dtype, memory)
        raise UserModelError("run", f"training {spec} on {device} raised {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}", traceback.format_exc()) from None
    return UserModelRecord(spec, device, parameter_list(module), device_name=_device_name(device),
                           device_memory_bytes=_device_memory_bytes(device), samples=batch_samples(batch),
                           block_list=unit or find_block_list(module), ready=ready, passes=passes,
                           optimizer_s=optimizer_s, optimizer=opt_name, precision=precision_used,
                           memory=memory.parts(),
                           checkpointing=wrapped)


def _warm_up(step, cuda: bool) -> list:
    """Warm-up passes (one on a CPU; on a GPU at least two and GPU_WARMUP_S), the last with a
    hook per gradient: its ready order."""
    start = time.perf_counter()
    if cuda:
        step()
        while time.perf_counter() - start < GPU_WARMUP_S:
            step()
    return step(hooks=True)[0].ready


def _timed_passes(step, cuda: bool, repeats: int, say=lambda text: None) -> tuple[list[TimedPass], list[float]]:
    """At least `repeats` timed passes; on a GPU on until GPU_TIMED_S have passed, within
    MAX_PASSES_PER_REPEAT x repeats. The first also reads the memory by phase (the warm-up
    left the optimizer's state and the allocator's blocks in place)."""
    passes: list[TimedPass] = []
    optimizer_s: list[float] = []
    limit = repeats * (MAX_PASSES_PER_REPEAT if cuda else 1)
    start = time.perf_counter()
    while len(passes) < limit and (len(passes) < repeats or (cuda and time.perf_counter() - start < GPU_TIMED_S)):
        one, opt_s = step(memory_phases=not passes)
        passes.append(one)
        say(f"timed pass {len(passes)} done")
        optimizer_s.append(opt_s)
    return passes, optimizer_s


class _MemoryPhases:
    """One GPU's memory over the first timed step, split by phase (torch.cuda.memory_allocated
    before and after each, and the step's peak, torch.cuda.max_memory_allocated): before forward
    the weights and the optimizer's state (gradients set to None); forward adds the activations it
    saves; after backward those are freed and the gradients are there. Nothing on a CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.torch, self.device = torch, device
        self.at: dict[str, int] = {}
        self.weights = self._allocated() if self.cuda else 0  # the module and its example batch
        self.recording = False

    def _allocated(self) -> int:
        return self.torch.cuda.memory_allocated(self.device)

    def begin(self, record: bool) -> None:
        self.recording = record and self.cuda
        if self.recording:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
            self.at["start"] = self._allocated()

    def mark(self, phase: str) -> None:
        if self.recording:
            self.at[phase] = self._allocated()

    def parts(self) -> StepMemory | None:
        if not self.cuda or not {"start", "forward", "backward"} <= set(self.at):
            return None
        start = self.at["start"]
        return StepMemory(self.device, params_bytes=self.weights, optimizer_bytes=start - self.weights,
                          activations_bytes=self.at["forward"] - start, grads_bytes=self.at["backward"] - start,
                          peak_bytes=self.torch.cuda.max_memory_allocated(self.device))


def _device_memory_bytes(device: str) -> int | None:
    """The timed GPU's memory as CUDA sees it (the GPU CUDA_VISIBLE_DEVICES maps there, a MIG
    slice's own size); None on the CPU."""
    return torch.cuda.get_device_properties(torch.device(device)).total_memory if device.startswith("cuda") else None


def _device_name(device: str) -> str | None:
    """The timed GPU's name as CUDA gives it (e.g. 'NVIDIA H100 80GB HBM3'); None on the CPU."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None


def run_rank(ctx, job: UserModelJob) -> None:
    if ctx.rank != 0:
        return
    ctx.progress(f"timing {job.spec}")
    if job.cwd:
        os.chdir(job.cwd)
    try:
        record = measure(job.spec, job.device, job.repeats, job.precision, job.optimizer, job.kwargs,
                         ctx.progress, job.ac, job.unit, job.stated)
    except UserModelError as err:
        ctx.send(WorkerFailure(stage=err.kind, reason=str(err), trace=err.trace))
        return
    if job.trace is not None:  # the same model on meta: its ops and backward FLOPs per tensor

        ctx.progress(f"tracing {job.spec} on meta")
        traced = with_selective_cost([trace_user_model(job.spec, job.trace, job.kwargs, job.target, ctx.progress,
                                                       job.unit, job.ac)])[0]
        record = replace(record, op_trace=traced)
    ctx.send(UserModelResult(record=record))
