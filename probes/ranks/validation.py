"""Rank worker for `validate`: every measurement the prediction needs and every DDP mode it
predicts, taken in turns, so that all of them see the same machine.

One rotation is: half a calibration (each rank trains its own copy alone, nothing communicated:
forward, backward and optimizer times, and DDP's own costs), one step of each DDP mode with its
timeline, the other half of the calibration, each bucket's all-reduce alone, and the interference
samples (compute beside an all-reduce, an all-reduce beside compute). A
run is `warmup_steps` rotations, then `steps` timed ones. A machine whose speed drifts (shared
cores, other tenants) moves a calibration and the steps it predicts together; phases run one
after the other would not.

The timeline of a DDP step (host clock, seconds from the step's start `t0`, on every rank; the
clock is the machine's monotonic one, so `t0` lines ranks up):
zero_grad; per micro-batch forward and backward, and for a synced one each bucket's all-reduce
(launched when DDP calls the comm hook, i.e. when the bucket is ready; ended when its future
completes); the optimizer. From it: forward, backward compute (to the last bucket's launch), the
exposed communication (the last launch to backward's return: the tail of the all-reduces and
the bucket copies), the optimizer, zero_grad, and what none of them covers.

On GPUs the hook's times are host times: an NCCL all-reduce's future completes on the host, not
when its kernel ends, so per-bucket ends there are approximate; the step's parts stay exact
because every boundary is synchronised.

FSDP2's modes (probes/ranks/fsdp.py) join a rotation when asked for: in each calibration half, each FSDP
copy through collectives that move one element (FSDP's own work, the optimizer on its shards);
before each FSDP step, its collectives between the plain model's compute (what they cost there);
then the step with its timeline (every collective FSDP issued, launched and returned). Without a
DDP mode, DDP's wrapper and its measurements are left out.

Job: ValidationJob, a training job (`topoprof.workload.synthetic.parse_config`) plus `modes` (the
DDP and FSDP modes to time) and `interference` (bool). Rank 0 sends one ValidationRotations
message with every rank's records per rotation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from topoprof.probes.ranks import training
from topoprof.probes.ranks.dist import synchronize, synchronize_compute
from topoprof.specs.fsdp_modes import FSDP_ONE_NODE
from topoprof.specs.messages import ValidationJob, ValidationRotations, training_config
from topoprof.workload.synthetic import DDP_MODES, check_supported, parse_config
from topoprof.zoo.synthetic_lm import build_model
from topoprof.zoo.user_callable import call_user_callable, to_device, user_loss

# Compute beside an all-reduce: one long enough to outlast a forward+backward, in multiples of
# the compute time at the all-reduce rate this rotation measured.
_OUTLAST_FACTOR = 1.5  # beside compute an all-reduce runs at least x1.5 slower here, so it outlasts
_MIN_INTERFERENCE_BYTES = 1 << 16
_MAX_INTERFERENCE_BYTES = 256 << 20
# An all-reduce beside compute runs beside as many forward+backward passes as it lasts, at most:
_MAX_PASSES_BESIDE = 200
# The interference is a statistic of the whole run too: it is sampled every other rotation.
_INTERFERENCE_EVERY = 2
# torch's default bucket_cap_mb (torch/nn/parallel/distributed.py): the size big models' buckets have.
_DEFAULT_BUCKET_BYTES = 25 * 2 ** 20


@dataclasses.dataclass
class _BucketClock:
    """When each bucket's all-reduce was launched and when it completed, and each bucket's size.
    With `local` set the hook communicates nothing (the calibration's synced pass)."""

    world_size: int
    events: list = dataclasses.field(default_factory=list)  # (index, numel, launched, done)
    numel: dict = dataclasses.field(default_factory=dict)
    local: bool = False


def _timed_allreduce(clock: _BucketClock, bucket):
    """A DDP comm hook doing what DDP does without one (divide by the world size, all-reduce:
    default_hooks.allreduce_hook), and noting when. Local, it returns the divided bucket as
    debugging_hooks.noop_hook does: DDP still copies every gradient into its bucket and back."""
    launched = time.perf_counter()
    index, tensor = bucket.index(), bucket.buffer()
    clock.numel[index] = tensor.numel()
    if clock.local:
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(tensor.div_(clock.world_size))
        return future
    future = dist.all_reduce(tensor.div_(clock.world_size), async_op=True).get_future()

    def done(fut):
        clock.events.append((index, tensor.numel(), launched, time.perf_counter()))
        return fut.value()[0]

    return future.then(done)


def _ddp_step(model, ddp, optimizer, batches, mode: str, clock: _BucketClock, sync, loss_of) -> dict:
    """One optimizer step of `mode` with its timeline."""
    accum = len(batches)
    clock.numel.clear()  # this step's buckets only (DDP rebuilds them after its first iteration)

    def micro_batch(j: int, tokens, t0: float) -> dict:
        clock.events.clear()
        skip = j < accum - 1  # every micro-batch but the last may skip the all-reduce
        # ddp_no_sync: no_sync() around forward and backward; the common mistake: backward only
        around = ddp.no_sync if mode == "ddp_no_sync" and skip else contextlib.nullcontext
        backward = ddp.no_sync if mode == "ddp_no_sync_backward_only" and skip else contextlib.nullcontext
        with around():
            spans = training.forward_backward(lambda: loss_of(ddp, tokens) / accum, sync, t0, backward)
        return {**spans, "buckets": sorted((i, n, a - t0, b - t0) for i, n, a, b in clock.events)}

    return training.timed_step(optimizer, batches, sync, micro_batch)


def _calibration_half(model, ddp, optimizer, batches, sync, clock: _BucketClock | None, ddp_first: bool,
                      loss_of) -> dict:
    """Each rank alone, nothing communicated: forward and backward of `batches` through its own
    copy, then the optimizer; and the first of them again through the DDP wrapper inside
    `no_sync()` (what DDP's forward and its hooks cost), and synced with a hook that does not
    communicate (what a synced micro-batch adds: every gradient copied into its bucket and back).
    The plain pass and the DDP passes take turns going first. Without `ddp` (no DDP mode to
    predict), the plain passes and the optimizer only."""
    def plain():
        optimizer.zero_grad(set_to_none=True)
        return training.timed_passes(model, batches, sync, loss_of)

    def wrapped():
        optimizer.zero_grad(set_to_none=True)
        with ddp.no_sync():
            no_sync = training.timed_passes(ddp, batches[:1], sync, loss_of)
        assert clock is not None  # DDP's wrapper comes with its clock
        clock.local = True
        try:
            local = training.timed_passes(ddp, batches[:1], sync, loss_of)
        finally:
            clock.local = False
        return no_sync, local

    if ddp is None:
        forward, backward = plain()
        extra = {}
    else:
        if ddp_first:
            ((ddp_forward, ddp_backward), (local_forward, local_backward)), (forward, backward) = wrapped(), plain()
        else:
            (forward, backward), ((ddp_forward, ddp_backward), (local_forward, local_backward)) = plain(), wrapped()
        extra = {"ddp_forward_s": ddp_forward, "ddp_backward_s": ddp_backward,
                 "local_forward_s": local_forward, "local_backward_s": local_backward}
    t0 = time.perf_counter()
    optimizer.step()
    sync()
    return {"forward_s": forward, "backward_s": backward, "optimizer_s": [time.perf_counter() - t0], **extra}


def _joined(before: dict, after: dict, plain_before: int) -> dict:
    """The two halves of a rotation's calibration as one record; `ddp_pairs` names, for each DDP
    sample, the plain micro-batch it repeats (the first of its half)."""
    out = {key: before[key] + after[key] for key in before}
    out["ddp_pairs"] = [0, plain_before]
    return out


def _allreduce_alone_s(buffers: list, device: str) -> list[float]:
    """Each bucket-sized buffer all-reduced alone, after a barrier."""
    out = []
    for buf in buffers:
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def _sized(numel: int, device: str):
    return torch.zeros(max(1, numel), dtype=torch.float32, device=device)


def _agreed_numel(numel: int, device: str) -> int:
    """Every rank must all-reduce the same size: the largest any rank asks for."""
    agreed = torch.tensor([numel], dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return int(agreed.item())


def _comm_beside_compute_s(buf, model, tokens, accum: int, device: str, sync, loss_of) -> float:
    """How long an all-reduce of `buf` takes while forward+backward passes run beside it, one
    after another until it has finished. Where it ends: on CPU ranks, when gloo completes its
    future (a chained callback notes the moment); on a GPU, an event that a side stream records
    once it has waited for the collective, timed from one recorded just before it on the compute
    stream (NCCL completes the future as soon as the work is queued, and runs it on a stream of
    its own)."""
    model.zero_grad(set_to_none=True)
    sync()
    dist.barrier()
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work = dist.all_reduce(buf, async_op=True)
        side = torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            work.wait()  # the side stream waits for NCCL's, the host does not
            end.record(side)
        finished, seconds = end.query, lambda: start.elapsed_time(end) / 1e3
    else:
        noted: list[float] = []
        t0 = time.perf_counter()
        # the chained future: it completes after the callback has noted the time
        work = dist.all_reduce(buf, async_op=True).get_future().then(lambda f: noted.append(time.perf_counter()))
        finished, seconds = (lambda: bool(noted)), (lambda: noted[0] - t0)
    for _ in range(_MAX_PASSES_BESIDE):
        (loss_of(model, tokens) / accum).backward()
        synchronize_compute(device)
        if finished():
            break
    work.wait()
    synchronize(device)
    return seconds()


def _interference(model, tokens, accum: int, compute_alone_s: float, rate_bps: float, buffers: list,
                  alone_s: list[float], anchor_numel: int, device: str, sync, loss_of) -> dict:
    """How much compute and communication slow each other when they run together, each a ratio
    of two durations measured alike (no difference of noisy times enters):
    - forward+backward beside an all-reduce that outlasts it, over forward+backward alone;
    - each bucket's all-reduce beside forward+backward passes that outlast it, over the same
      alone; and one of DDP's default bucket size, for the buckets of bigger models: beside
      compute a small all-reduce loses more than a large one (on CPU ranks its threads wait for
      a core on every message)."""
    size = min(max(_OUTLAST_FACTOR * compute_alone_s * rate_bps, _MIN_INTERFERENCE_BYTES), _MAX_INTERFERENCE_BYTES)
    long_buf, anchor = _sized(_agreed_numel(int(size // 4), device), device), _sized(anchor_numel, device)
    anchor_alone = _allreduce_alone_s([anchor], device)[0]
    model.zero_grad(set_to_none=True)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    work = dist.all_reduce(long_buf, async_op=True)
    (loss_of(model, tokens) / accum).backward()
    synchronize_compute(device)  # the compute alone: not the all-reduce still running
    compute_beside = time.perf_counter() - t0
    outlasted = not work.is_completed()  # the all-reduce ran beside all of it
    work.wait()
    synchronize(device)
    beside = [_comm_beside_compute_s(b, model, tokens, accum, device, sync, loss_of) for b in [*buffers, anchor]]
    return {"compute_beside_s": compute_beside, "compute_alone_s": compute_alone_s,
            "compute_slowdown": compute_beside / compute_alone_s if outlasted else None,
            "allreduce_beside_s": beside, "allreduce_alone_s": [*alone_s, anchor_alone],
            "bytes": [4 * b.numel() for b in [*buffers, anchor]]}


def _trainee(cfg, user_model: str | None, device: str):
    """(model, example batch or None, loss_of(module, batch)): the synthetic model with its token
    stream, or the user's model (`--model`) trained on its own example batch every micro-batch."""
    if user_model is None:
        model = build_model(cfg.spec, cfg.seed, autocast_dtype=training.AMP_DTYPES[cfg.amp], ac=cfg.ac)
        return model.to(device), None, training.mean_loss

    module, batch, loss_fn = call_user_callable(user_model)
    return module.to(device), to_device(batch, device), lambda m, b: user_loss(m, b, loss_fn)


def _going_on(loss_of, ctx):
    """`loss_of`, saying first that one more micro-batch began (`RankContext.going_on`): every
    micro-batch this worker runs, timed or not, computes its loss so. A rank whose micro-batches
    take long (a large model on a slow device) thus reports within every timeout while it goes
    on; inside a timed forward this is a clock read, and at most every few seconds one message."""
    def loss(module, batch):
        ctx.going_on("micro-batch")
        return loss_of(module, batch)
    return loss


def run_rank(ctx, job: ValidationJob) -> None:
    cfg = parse_config({**training_config(job), "mode": "ddp_synced"})
    requested = DDP_MODES if job.modes is None else job.modes
    modes = [m for m in requested if m in DDP_MODES]
    fsdp_modes = [m for m in requested if m in FSDP_ONE_NODE]  # probes/ranks/fsdp.py's SUPPORTED
    if fsdp_modes:  # FSDP2's torch API only where an FSDP mode is asked for: DDP runs on older torch
        from topoprof.probes.ranks import fsdp  # lazy: imports FSDP2's torch API, missing on older torch
    check_supported(cfg, ctx.device, ctx.world_size, torch.cuda.device_count())
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    sync = lambda: synchronize(ctx.device)  # noqa: E731
    model, example, loss_of = _trainee(cfg, job.user_model, ctx.device)
    loss_of = _going_on(loss_of, ctx)
    ddp = clock = None
    if modes:  # DDP's wrapper and its measurements only where a DDP mode is predicted
        ddp = training.wrap_ddp(model, ctx.device, cfg)
        clock = _BucketClock(ctx.world_size)
        ddp.register_comm_hook(clock, _timed_allreduce)
    optimizer = training.make_optimizer(cfg, model)
    copies, fsdp_clock = {}, None
    if fsdp_modes:
        fsdp.quiet()
        fsdp_clock = fsdp.CommClock(ctx.rank, ctx.world_size)
        amp = training.AMP_DTYPES[cfg.amp]  # the same precision as the DDP model beside them
        copies = fsdp.build_copies(lambda: build_model(cfg.spec, cfg.seed, autocast_dtype=amp,
                                                                ac=cfg.ac).to(ctx.device),
                                   fsdp_modes, fsdp.mesh_for(ctx.device, ctx.world_size), fsdp_clock,
                                   lambda m: training.make_optimizer(cfg, m))
    rotations = []
    buffers: list = []
    total = cfg.warmup_steps + cfg.steps
    for r in range(total):
        ctx.progress(f"rotation {r + 1}/{total}")
        batches = [example] * cfg.accum if example is not None else \
            training.step_batches(cfg, r, ctx.rank, ctx.world_size, ctx.device)
        dist.barrier()
        # the calibration in two halves around the steps: a machine whose speed differs between
        # the start and the end of a rotation is measured at both, as the steps run between them
        half = len(batches) // 2 or 1
        before = _calibration_half(model, ddp, optimizer, batches[:half], sync, clock, r % 2 == 0, loss_of)
        fsdp_before = (fsdp.calibration(copies, batches[0], cfg.accum, fsdp_clock, sync, loss_of)
                       if copies and fsdp_clock is not None else None)
        record: dict[str, Any] = {"modes": {}}
        for mode in modes:
            assert clock is not None  # a DDP mode comes with its clock
            dist.barrier()
            record["modes"][mode] = _ddp_step(model, ddp, optimizer, batches, mode, clock, sync, loss_of)
        replays = []
        for mode in fsdp_modes:
            wrapping = fsdp.wrapping_of(mode)
            # its collectives between the model's own compute first, in the state the step will meet
            assert fsdp_clock is not None and fsdp_before is not None  # an FSDP mode comes with its copies
            hold = fsdp.own_work(before["forward_s"][0], before["backward_s"][0], fsdp_before, wrapping)
            replays.append(fsdp.shadow_pass(model, batches[0], cfg.accum, loss_of, fsdp.WRAPPINGS[wrapping],
                                            ctx.world_size, ctx.device, synchronize, hold))
            dist.barrier()
            wrapped, fsdp_optimizer = copies[wrapping]
            record["modes"][mode] = fsdp.step(wrapped, fsdp_optimizer, batches, fsdp.MODES[mode].no_sync,
                                              fsdp_clock, sync, loss_of)
        dist.barrier()
        rest = batches[half:] or batches
        fsdp_after = (fsdp.calibration(copies, rest[0], cfg.accum, fsdp_clock, sync, loss_of)
                      if copies and fsdp_clock is not None else None)
        after = _calibration_half(model, ddp, optimizer, rest, sync, clock, r % 2 == 1, loss_of)
        record["calibration"] = _joined(before, after, half)
        if copies:
            # each half's FSDP passes repeat the first plain micro-batch of that half
            record["calibration"]["fsdp"] = [fsdp_before, fsdp_after]
            record["fsdp_replays"] = replays
        if modes:
            assert clock is not None
            if not buffers:  # DDP's buckets are rebuilt after its first step: their sizes are known now
                buffers = [_sized(clock.numel[i], ctx.device) for i in sorted(clock.numel)]
            record["bucket_numel"] = [b.numel() for b in buffers]
            record["allreduce_alone_s"] = _allreduce_alone_s(buffers, ctx.device)
        if modes and job.interference and ctx.world_size > 1 and r % _INTERFERENCE_EVERY == 0:
            cal = record["calibration"]
            compute = statistics.median(f + b for f, b in zip(cal["forward_s"], cal["backward_s"]))
            rate = 4 * sum(record["bucket_numel"]) / max(sum(record["allreduce_alone_s"]), 1e-9)
            anchor = int((cfg.bucket_cap_mb * 2 ** 20) if cfg.bucket_cap_mb else _DEFAULT_BUCKET_BYTES) // 4
            record["interference"] = _interference(model, batches[0], cfg.accum, compute, rate, buffers,
                                                   record["allreduce_alone_s"], anchor, ctx.device, sync, loss_of)
        if r >= cfg.warmup_steps:
            rotations.append(record)
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, rotations)
    if ctx.rank == 0:
        ctx.send(ValidationRotations(
            rotations=[[everyone[rank][i] for rank in range(ctx.world_size)] for i in range(len(rotations))],
            modes=modes + fsdp_modes, world_size=ctx.world_size, micro_batch=cfg.micro_batch, accum=cfg.accum,
            params=cfg.spec.params, tokens_per_micro_batch=cfg.micro_batch * cfg.spec.seq_len,
            spec=dataclasses.asdict(cfg.spec), threads=torch.get_num_threads(), device=ctx.device,
            optimizer=cfg.optimizer, amp=cfg.amp, bucket_cap_mb=cfg.bucket_cap_mb,
            memory_bandwidth_gbps=training.memory_bandwidth_gbps(ctx.device)))
