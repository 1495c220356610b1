"""Rank worker for `validate`: real training steps of the synthetic model, timed per strategy.

Modes (the strategies of `topoprof.model.strategies`): single (one process, K micro-batches with
loss / K, and a calibration of the forward, backward and optimizer times the step-time model
takes as inputs); ddp_synced (all-reduce after every micro-batch); ddp_no_sync (forward and
backward of the first K-1 micro-batches inside `model.no_sync()`); ddp_no_sync_backward_only
(only `loss.backward()` inside it, the common mistake that still syncs, see `accumulate`); dp
(torch.nn.DataParallel over every visible GPU). The numerics of the same modes are
`probes/ranks/numerics.py`'s.

Data: every sample is a deterministic slice of one synthetic token stream (`first_sample`), so
one step's global batch is the union over ranks. Every rank builds the same initial model.

Timing: each step runs between device synchronisations (and a barrier, so ranks start
together). A step's time is the MAX over ranks: the optimizer step waits for the all-reduce the
slowest rank joins last, so the step ends when the slowest rank finishes. The reported step
time is the median over the timed steps.

Job (TrainingJob, checked by `topoprof.workload.synthetic.parse_config`): spec (asdict of SyntheticSpec), mode,
micro_batch (samples per rank per micro-batch), accum (K), steps (timed), warmup_steps,
bucket_cap_mb (null: torch's default), seed, optimizer (adamw|sgd), lr, amp (none|bf16, GPU
only), threads (null: torch's default), count_comm_hook_calls, numerics_dtype (float64|float32),
ac (the blocks' activation checkpointing: none, full, layer:N, op; `topoprof/zoo/checkpoint_wrap.py`).
Messages from rank 0 (topoprof.specs.messages): TrainingResult (every timed mode),
TrainingCalibration (single).
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from topoprof.probes.ranks.dist import synchronize, synchronize_compute
from topoprof.specs.messages import TrainingCalibration, TrainingJob, TrainingResult, training_config
from topoprof.workload.synthetic import (
    DDP_MODES,
    STREAM_SEED_BITS,
    SyntheticSpec,
    TrainConfig,
    check_supported,
    parse_config,
)
from topoprof.zoo.synthetic_lm import build_model

AMP_DTYPES = {"none": None, "bf16": torch.bfloat16}
COMBINE = "max over ranks, median over steps"


def first_sample(step: int, rank: int, micro: int, world: int, accum: int, micro_batch: int) -> int:
    """Step s covers samples [s W K B, (s+1) W K B); within it rank-major, then micro-batch."""
    return ((step * world + rank) * accum + micro) * micro_batch


def stream_samples(spec: SyntheticSpec, seed: int, start: int, count: int):
    """Samples start..start+count-1 of the token stream: (count, seq_len + 1) int64 on CPU."""
    rows = []
    for i in range(start, start + count):
        gen = torch.Generator().manual_seed((seed << STREAM_SEED_BITS) | i)
        rows.append(torch.randint(spec.vocab, (spec.seq_len + 1,), generator=gen))
    return torch.stack(rows)


def step_batches(cfg: TrainConfig, step: int, rank: int, world: int, device) -> list:
    return [stream_samples(cfg.spec, cfg.seed, first_sample(step, rank, j, world, cfg.accum,
                                                            cfg.micro_batch), cfg.micro_batch)
            .to(device) for j in range(cfg.accum)]


def accumulate(model, batches: list, mode: str, divide_by: int) -> None:
    """Forward and backward of every micro-batch with loss / divide_by, by the mode's rule.

    ddp_no_sync_backward_only still all-reduces each micro-batch (torch 2.13,
    torch/nn/parallel/distributed.py): `no_sync()` only flips `require_backward_grad_sync`;
    `DistributedDataParallel._post_forward` reads that flag and, when it is set (forward ran
    outside the context), calls `self.reducer.prepare_for_backward`, which arms the reducer's
    autograd hooks (`Reducer::autograd_hook` in reducer.cpp returns early only when not armed).
    Leaving the flag only around backward changes nothing: the hooks were armed in forward.
    """
    last = len(batches) - 1
    for j, tokens in enumerate(batches):
        if mode == "ddp_no_sync" and j < last:
            with model.no_sync():
                (model(tokens).mean() / divide_by).backward()
        elif mode == "ddp_no_sync_backward_only" and j < last:
            loss = model(tokens).mean() / divide_by
            with model.no_sync():
                loss.backward()
        else:  # mean(): one loss per replica, DataParallel's micro-batch shares are equal
            (model(tokens).mean() / divide_by).backward()


def train_step(model, optimizer, batches: list, mode: str) -> None:
    optimizer.zero_grad(set_to_none=True)
    accumulate(model, batches, mode, len(batches))
    optimizer.step()


def mean_loss(module, tokens):
    return module(tokens).mean()


def forward_backward(loss, sync, t0: float, backward_context=contextlib.nullcontext) -> dict:
    """One micro-batch: `loss()` (its forward), then its backward inside `backward_context()`;
    each phase's [start, end] in seconds from `t0`, every boundary synchronised."""
    start = time.perf_counter()
    value = loss()
    sync()
    mid = time.perf_counter()
    with backward_context():
        value.backward()
    sync()
    end = time.perf_counter()
    return {"forward": [start - t0, mid - t0], "backward": [mid - t0, end - t0]}


def timed_step(optimizer, batches, sync, micro_batch) -> dict:
    """One optimizer step with its timeline, in seconds from its start `t0`: zero_grad, then
    `micro_batch(j, tokens, t0)` for each micro-batch (its record: `forward_backward`'s spans and
    whatever it adds), then the optimizer."""
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    sync()
    zero_end = time.perf_counter()
    micro = [micro_batch(j, tokens, t0) for j, tokens in enumerate(batches)]
    opt_start = time.perf_counter()
    optimizer.step()
    sync()
    stop = time.perf_counter()
    return {"t0": t0, "step_s": stop - t0, "zero_grad": [0.0, zero_end - t0], "micro": micro,
            "optimizer": [opt_start - t0, stop - t0]}


def timed_passes(module, batches, sync, loss_of=mean_loss) -> tuple[list[float], list[float]]:
    """Forward and backward times of every micro-batch through `module`, loss / len(batches)
    (no optimizer)."""
    accum = len(batches)
    forward, backward = [], []
    for tokens in batches:
        sync()
        t0 = time.perf_counter()
        loss = loss_of(module, tokens) / accum
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        forward.append(t1 - t0)
        backward.append(time.perf_counter() - t1)
    return forward, backward


def make_optimizer(cfg: TrainConfig, model):
    if cfg.optimizer == "sgd" or cfg.mode == "numerics":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr)


@dataclass
class _HookCounter:
    """DDP comm-hook calls (one per bucket all-reduce) and each bucket's elements by index (the
    latest, rebuilt buckets)."""

    calls: int = 0
    bucket_numel: dict = field(default_factory=dict)


def _counting_allreduce(counter: _HookCounter, bucket):
    counter.calls += 1
    counter.bucket_numel[bucket.index()] = bucket.buffer().numel()
    # what DDP does without a hook: its state None is the default process group, which torch's hints leave out
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


def wrap_ddp(model, device: str, cfg: TrainConfig, counter: _HookCounter | None = None):
    ids = [torch.device(device).index] if device.startswith("cuda") else None
    kwargs: dict[str, Any] = {} if cfg.bucket_cap_mb is None else {"bucket_cap_mb": cfg.bucket_cap_mb}
    ddp = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=False, **kwargs)
    if counter is not None:
        ddp.register_comm_hook(counter, _counting_allreduce)
    return ddp


def _gather(values: list[float], device: str) -> list[list[float]]:
    """[rank][i] of every rank's list (all ranks call this)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.get_world_size() == 1:
        return [values]
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [[float(v) for v in t.cpu()] for t in every]


def run_steps(ctx, cfg, model, optimizer, batches_for, sync, counter=None):
    """Warm-up then timed steps; returns (this rank's step times, hook calls per timed step)."""
    times, calls = [], []
    total = cfg.warmup_steps + cfg.steps
    for step in range(total):
        ctx.progress(f"{cfg.mode} step {step + 1}/{total}")
        batches = batches_for(step)  # built before the clock starts
        before = counter.calls if counter else 0
        sync()
        if ctx.world_size > 1:
            dist.barrier()
        sync()
        start = time.perf_counter()
        train_step(model, optimizer, batches, cfg.mode)
        sync()
        elapsed = time.perf_counter() - start
        if step >= cfg.warmup_steps:
            times.append(elapsed)
            calls.append(counter.calls - before if counter else None)
    return times, calls


def calibrate(ctx, cfg, model, optimizer, batches_for, sync) -> dict:
    """Forward, backward (per micro-batch) and optimizer times, each between synchronisations."""
    forward, backward, opt = [], [], []
    for step in range(cfg.steps):
        ctx.progress(f"calibration step {step + 1}/{cfg.steps}")
        batches = batches_for(cfg.warmup_steps + cfg.steps + step)
        optimizer.zero_grad(set_to_none=True)
        f, b = timed_passes(model, batches, sync)
        forward += f
        backward += b
        t2 = time.perf_counter()
        optimizer.step()
        sync()
        opt.append(time.perf_counter() - t2)
    fwd, bwd = statistics.median(forward), statistics.median(backward)
    slowdown = _slowdown_during_comm(ctx, cfg, model, batches_for, sync, fwd + bwd)
    memory = memory_bandwidth_gbps(ctx.device)
    return {"memory_bandwidth_gbps": memory, "forward_s": fwd, "backward_s": bwd, "micro_batch_time_s": fwd + bwd,
            "backward_fraction": bwd / (fwd + bwd), "optimizer_time_s": statistics.median(opt),
            "threads": torch.get_num_threads(), "combine": "median over timed micro-batches/steps",
            "samples": len(forward), **slowdown}


def _allreduce_rate_bps(device: str) -> float:
    """Bytes/s of one all-reduce of a 4 MiB buffer on this group (a quick, local estimate)."""
    buf = torch.zeros(1 << 20, dtype=torch.float32, device=device)
    dist.all_reduce(buf)
    synchronize(device)  # the warm-up's tail outside the timing
    t0 = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(buf)
    synchronize(device)
    return 3 * buf.numel() * 4 / (time.perf_counter() - t0)


def _timed_allreduce_s(buf, device: str) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    synchronize(device)
    return time.perf_counter() - t0


def _slowdown_during_comm(ctx, cfg, model, batches_for, sync, alone_s: float) -> dict:
    """How much compute and communication slow each other down when they overlap.

    On CPU ranks gloo's threads compete with compute for the cores (on GPUs NCCL kernels take
    SMs). Each rank starts asynchronous all-reduces sized to outlast one forward+backward (twice
    its time at the measured rate), runs forward+backward beside them, then waits for them.
    compute slowdown = forward+backward beside it / alone. The all-reduce, T_a alone, did
    t_c / s_m of its work beside compute and the rest, t_total - t_c, alone afterwards:
    s_m = t_c / (T_a - (t_total - t_c)). Both are medians of 3 tries, at least 1."""
    if ctx.world_size < 2:
        return {}
    numel = int(2 * alone_s * _allreduce_rate_bps(ctx.device) / 4)
    agreed = torch.tensor([max(numel, 1 << 16)], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank must reduce the same size
    buf = torch.zeros(int(agreed.item()), dtype=torch.float32, device=ctx.device)
    comm_alone = statistics.median(_timed_allreduce_s(buf, ctx.device) for _ in range(2))
    compute, comm = [], []
    for step in range(3):
        tokens = batches_for(cfg.warmup_steps + 2 * cfg.steps + step)[0]
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        # Two halves at once, as DDP issues buckets: gloo runs them on its two worker threads
        # side by side (ProcessGroupGloo's default), NCCL one after the other on its stream.
        works = [dist.all_reduce(half, async_op=True) for half in buf.chunk(2)]
        (model(tokens).mean() / cfg.accum).backward()
        synchronize_compute(ctx.device)  # the compute alone: not the all-reduce still running
        t_c = time.perf_counter() - t0
        for work in works:
            work.wait()
        sync()
        t_total = time.perf_counter() - t0
        compute.append(t_c / alone_s)
        beside = comm_alone - (t_total - t_c)  # all-reduce-alone seconds done beside compute
        comm.append(t_c / beside if beside > 0.05 * comm_alone else float("nan"))
    comm_ok = [c for c in comm if c == c]
    return {"compute_slowdown_during_comm": max(1.0, statistics.median(compute)),
            "comm_slowdown_during_compute": max(1.0, statistics.median(comm_ok)) if comm_ok else 1.0,
            "slowdown_samples": {"compute": compute, "comm": comm, "comm_alone_s": comm_alone}}


def memory_bandwidth_gbps(device: str) -> float:
    """Copy bandwidth as memory traffic (read + write) per second: what DDP's bucket copies use.
    Every rank measures at the same time, so each sees its share of a shared memory bus."""
    src = torch.ones(16 << 20, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    # A GPU copies 64 MiB in tens of microseconds, as long as the launch and the wait: timed over
    # 20 copies, those add a twentieth of it. A CPU's copy takes milliseconds: one per timing.
    copies = 20 if str(device).startswith("cuda") else 1
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(copies):
            dst.copy_(src)
        synchronize(device)
        times.append((time.perf_counter() - t0) / copies)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def _dp_batches(cfg: TrainConfig, gpus: int, step: int) -> list:
    # GPU g gets the samples DDP rank g would: DataParallel scatters dim 0 in equal chunks.
    return [torch.cat([stream_samples(cfg.spec, cfg.seed,
                                      first_sample(step, g, j, gpus, cfg.accum, cfg.micro_batch),
                                      cfg.micro_batch) for g in range(gpus)]).to("cuda:0")
            for j in range(cfg.accum)]


def _setup(ctx, cfg: TrainConfig):
    """(model to step, optimizer, batches_for(step), devices to synchronise, replicas, counter)."""
    autocast = AMP_DTYPES[cfg.amp]
    if cfg.mode == "dp":
        gpus = torch.cuda.device_count()
        model = build_model(cfg.spec, cfg.seed, autocast_dtype=autocast, ac=cfg.ac).to("cuda:0")
        wrapped = nn.DataParallel(model, device_ids=list(range(gpus)))
        return (wrapped, make_optimizer(cfg, model), lambda s: _dp_batches(cfg, gpus, s),
                [f"cuda:{g}" for g in range(gpus)], gpus, None)
    model = build_model(cfg.spec, cfg.seed, autocast_dtype=autocast, ac=cfg.ac).to(ctx.device)
    counter = _HookCounter() if cfg.count_comm_hook_calls and cfg.mode in DDP_MODES else None
    wrapped = wrap_ddp(model, ctx.device, cfg, counter) if cfg.mode in DDP_MODES else model
    world = ctx.world_size
    replicas = world if cfg.mode in DDP_MODES else 1  # `single` ranks each train alone
    return (wrapped, make_optimizer(cfg, model),
            lambda s: step_batches(cfg, s, ctx.rank, world, ctx.device), [ctx.device], replicas,
            counter)


def run_timed(ctx, cfg: TrainConfig) -> None:
    model, optimizer, batches_for, devices, replicas, counter = _setup(ctx, cfg)

    def sync() -> None:
        for d in devices:
            synchronize(d)

    times, calls = run_steps(ctx, cfg, model, optimizer, batches_for, sync, counter)
    per_rank = _gather(times, ctx.device)  # [rank][step]
    if cfg.mode == "single":
        calibration = calibrate(ctx, cfg, model, optimizer, batches_for, sync)
    if ctx.rank != 0:
        return
    rank_step_times = [[per_rank[r][s] for r in range(len(per_rank))] for s in range(cfg.steps)]
    step_times = [max(row) for row in rank_step_times]
    if cfg.mode == "single":
        ctx.send(TrainingCalibration(calibration, micro_batch=cfg.micro_batch, accum=cfg.accum,
                                     params=cfg.spec.params, tokens_per_micro_batch=cfg.micro_batch * cfg.spec.seq_len))
    result = {
        "mode": cfg.mode, "step_time_s": statistics.median(step_times), "step_times_s": step_times,
        "rank_step_times_s": rank_step_times, "combine": COMBINE, "world_size": replicas,
        "processes": ctx.world_size, "micro_batch": cfg.micro_batch, "accum": cfg.accum,
        "params": cfg.spec.params, "global_batch_samples": replicas * cfg.accum * cfg.micro_batch,
        "tokens_per_micro_batch": cfg.micro_batch * cfg.spec.seq_len,
        "spec": dataclasses.asdict(cfg.spec), "warmup_steps": cfg.warmup_steps,
        "bucket_cap_mb": cfg.bucket_cap_mb, "optimizer": cfg.optimizer, "lr": cfg.lr,
        "amp": cfg.amp, "threads": torch.get_num_threads(), "device": devices[0]}
    if counter is not None:
        result["comm_hook_calls_per_step"] = calls
        numel = counter.bucket_numel
        result["ddp_bucket_numels"] = [numel[i] for i in sorted(numel)]
    ctx.send(TrainingResult(**result))


def run_rank(ctx, job: TrainingJob) -> None:
    cfg = parse_config(training_config(job))
    check_supported(cfg, ctx.device, ctx.world_size, torch.cuda.device_count())
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    run_timed(ctx, cfg)
