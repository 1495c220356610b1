"""Rank worker for `topoprof bench`: collectives timed the way nccl-tests times them.

Per collective and size (nccl-tests `src/common.cu`, BenchTime):
1. allocate the buffers (a rank that runs out of memory stops the sweep on every rank, with the
   reason, since the others would wait for it forever);
2. correctness: fill inputs with small integers whose reduction is exact in every dtype, run the
   collective once, count the elements that differ from the expected result (`#wrong`);
3. warm-up iterations, then a barrier and device synchronisation;
4. `iters` back-to-back timed iterations, synchronise the device, time = elapsed / iters on this
   rank (a host timer around the whole loop, as nccl-tests does without -G);
5. the per-rank times are gathered; rank 0 combines them by the stated rule (nccl-tests' default
   -a 1: the average over ranks) and reports the row with every rank's time.

Check by hand: nccl-tests `all_reduce_perf -b 8 -e 128M -f 2 -g <ngpus>` on the same GPUs.
"""
from __future__ import annotations

import os
import time

COMBINE_RULES = ("avg", "min", "max", "rank0")

DTYPES = {  # name -> (torch dtype attribute, element bytes)
    "float32": ("float32", 4), "float16": ("float16", 2), "bfloat16": ("bfloat16", 2),
    "float64": ("float64", 8), "int32": ("int32", 4), "int64": ("int64", 8),
    "int8": ("int8", 1), "uint8": ("uint8", 1),
}


def combine(times_us: list[float], rule: str) -> float:
    if rule == "avg":
        return sum(times_us) / len(times_us)
    if rule == "min":
        return min(times_us)
    if rule == "max":
        return max(times_us)
    return times_us[0]


def _pattern(torch, count: int, rank: int, dtype, device, offset: int = 0):
    """Values 0..2 from (rank + index) mod 3: sums over up to 63 ranks stay exact even in int8/bf16."""
    idx = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    return ((idx + rank) % 3).to(dtype)


def _expected_sum(torch, count: int, nranks: int, dtype, device, offset: int = 0):
    idx = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    total = torch.zeros(count, device=device, dtype=torch.int64)
    for r in range(nranks):
        total += (idx + r) % 3
    return total.to(dtype)


class _Op:
    """Buffers and the call for one collective at one size on this rank."""

    def __init__(self, torch, dist, name, send_n, recv_n, dtype, device, rank, world):
        self.t, self.d, self.name = torch, dist, name
        self.rank, self.world, self.dtype, self.device = rank, world, dtype, device
        self.send_n, self.recv_n = send_n, recv_n
        self.send = torch.zeros(send_n, dtype=dtype, device=device)
        self.recv = self.send if name in ("all_reduce", "broadcast", "reduce") else \
            torch.zeros(recv_n, dtype=dtype, device=device)

    def run(self) -> None:
        d, name = self.d, self.name
        if name == "all_reduce":
            d.all_reduce(self.send)
        elif name == "reduce":
            d.reduce(self.send, dst=0)
        elif name == "broadcast":
            d.broadcast(self.send, src=0)
        elif name == "all_gather":
            d.all_gather_into_tensor(self.recv, self.send)
        elif name == "reduce_scatter":
            d.reduce_scatter_tensor(self.recv, self.send)
        elif name == "all_to_all":
            d.all_to_all_single(self.recv, self.send)
        elif name == "sendrecv":
            peer_to, peer_from = (self.rank + 1) % self.world, (self.rank - 1) % self.world
            ops = [d.P2POp(d.isend, self.send, peer_to), d.P2POp(d.irecv, self.recv, peer_from)]
            for req in d.batch_isend_irecv(ops):
                req.wait()
        else:  # the CLI validates names against topoprof.collectives.COLLECTIVES
            raise ValueError(f"unknown collective {name}")

    def fill_for_check(self) -> None:
        t, n, r = self.t, self.world, self.rank
        if self.name == "broadcast":
            self.send.copy_(_pattern(t, self.send_n, 0, self.dtype, self.device) if r == 0 else
                            t.zeros_like(self.send))
        else:
            self.send.copy_(_pattern(t, self.send_n, r, self.dtype, self.device))
        if self.recv is not self.send:
            self.recv.zero_()

    def expected(self):
        t, n, r, dt, dev = self.t, self.world, self.rank, self.dtype, self.device
        name, count = self.name, self.recv_n
        if name == "all_reduce" or (name == "reduce" and r == 0):
            return _expected_sum(t, count, n, dt, dev)
        if name == "reduce":
            return None  # non-root buffers are undefined after reduce (as in nccl-tests)
        if name == "broadcast":
            return _pattern(t, count, 0, dt, dev)
        if name == "all_gather":
            chunk = count // n
            return t.cat([_pattern(t, chunk, src, dt, dev) for src in range(n)])
        if name == "reduce_scatter":
            return _expected_sum(t, count, n, dt, dev, offset=r * count)
        if name == "all_to_all":
            chunk = count // n  # chunk j of the output comes from rank j's chunk r
            return t.cat([_pattern(t, self.send_n, src, dt, dev)[r * chunk:(r + 1) * chunk] for src in range(n)])
        if name == "sendrecv":
            return _pattern(t, count, (r - 1) % n, dt, dev)
        raise ValueError(name)

    def count_wrong(self) -> int:
        want = self.expected()
        if want is None:
            return 0
        return int((self.recv != want).sum().item())


def _agree(torch, dist, device, ok: bool) -> bool:
    """True when every rank succeeded (a MIN all-reduce of a flag)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _allocate(torch, dist, ctx, name, send_n, recv_n, dtype):
    try:
        op, error = _Op(torch, dist, name, send_n, recv_n, dtype, ctx.device, ctx.rank, ctx.world_size), None
    except (RuntimeError, MemoryError) as err:  # torch.OutOfMemoryError is a RuntimeError
        op, error = None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not _agree(torch, dist, ctx.device, op is not None):
        return None, error or "another rank could not allocate its buffers"
    return op, None


def _time_op(op: _Op, iters: int, warmup: int, sync) -> float:
    op.send.zero_()  # zeros keep repeated in-place reductions finite during timing
    for _ in range(warmup):
        op.run()
    sync()
    op.d.barrier()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        op.run()
    sync()
    return (time.perf_counter() - start) / iters * 1e6


def _gather_times(torch, dist, device, time_us: float, wrong: int) -> tuple[list[float], int]:
    mine = torch.tensor([time_us, float(wrong)], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [float(t[0]) for t in every], int(sum(float(t[1]) for t in every))


def run_size(torch, dist, ctx, spec, size: int, config: dict, sync):
    """One row: returns (row dict or None, stop reason or None)."""
    from topoprof.collectives import make_row

    dtype_attr, elem = DTYPES[config["dtype"]]
    dtype = getattr(torch, dtype_attr)
    n = ctx.world_size
    size = spec.aligned_size(size, n, elem)
    if size == 0:
        return None, None
    send_n, recv_n = spec.counts(size, n, elem)
    op, error = _allocate(torch, dist, ctx, spec.name, send_n, recv_n, dtype)
    if op is None:
        return None, f"stopped at {size} B: {error}"
    wrong = None
    if config.get("check", True):
        op.fill_for_check()
        op.run()
        sync()
        if config.get("corrupt_rank") == ctx.rank:  # test hook: a flipped result must be counted
            op.recv[0] = op.recv[0] + 1
        wrong = op.count_wrong()
    time_us = _time_op(op, int(config["iters"]), int(config["warmup"]), sync)
    rank_times, total_wrong = _gather_times(torch, dist, ctx.device, time_us, wrong or 0)
    del op
    row = make_row(spec, size, n, config["dtype"], elem, combine(rank_times, config["combine"]),
                   total_wrong if wrong is not None else None, tuple(rank_times))
    return row, None


def describe_ranks(torch, dist, ctx) -> dict:
    """Every rank's host and device, gathered to all ranks, plus library versions."""
    import platform

    mine = {"rank": ctx.rank, "host": platform.node(), "pid": os.getpid(), "device": ctx.device,
            "device_name": "CPU"}
    if ctx.device.startswith("cuda"):
        mine["device_name"] = torch.cuda.get_device_name(ctx.device)
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    nccl = None
    if ctx.device.startswith("cuda"):
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    return {"ranks": every, "torch_version": torch.__version__, "nccl_version": nccl,
            "cuda_version": torch.version.cuda, "backend": dist.get_backend()}


def run_rank(ctx, config: dict) -> None:
    """Sweep every requested collective over every size; rank 0 reports rows as they finish."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from probes.dist import synchronize
    from topoprof.collectives import get_collective

    sync = lambda: synchronize(ctx.device)  # noqa: E731
    meta = describe_ranks(torch, dist, ctx)
    if ctx.rank == 0:
        ctx.emit("meta", **meta)
    for name in config["collectives"]:
        spec = get_collective(name)
        for size in config["sizes"]:
            ctx.progress(f"{name} {size} B")
            row, stop = run_size(torch, dist, ctx, spec, size, config, sync)
            if stop is not None:
                if ctx.rank == 0:
                    ctx.emit("stopped", collective=name, reason=stop)
                break
            if row is not None and ctx.rank == 0:
                ctx.emit("row", row=dataclasses.asdict(row))
