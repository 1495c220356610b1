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

import dataclasses
import os
import platform
import time

from topoprof.probes.hardware.cuda_ids import device_identity
from topoprof.probes.ranks.dist import synchronize
from topoprof.specs.collective_spec import DTYPES, combine, get_collective, make_row
from topoprof.specs.messages import CollectiveRow, CollectivesJob, CollectivesMeta, CollectiveStopped

# The check works through the buffer in chunks of this many elements, so its int64 temporaries
# stay small next to the buffers themselves (a 1 GiB float32 buffer would otherwise need
# several GiB more for indices and expected values).
CHECK_CHUNK = 1 << 22


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

    def __init__(self, torch, dist, name, send_n, recv_n, dtype, device, rank, world, group=None):
        self.t, self.d, self.name, self.group = torch, dist, name, group
        self.rank, self.world, self.dtype, self.device = rank, world, dtype, device  # within the group
        self.send_n, self.recv_n = send_n, recv_n
        self.send = torch.zeros(send_n, dtype=dtype, device=device)
        self.recv = self.send if name in ("all_reduce", "broadcast", "reduce") else \
            torch.zeros(recv_n, dtype=dtype, device=device)

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else self.d.get_global_rank(self.group, group_rank)

    def run(self) -> None:
        d, name, g = self.d, self.name, self.group
        if name == "all_reduce":
            d.all_reduce(self.send, group=g)
        elif name == "reduce":
            d.reduce(self.send, dst=self._global(0), group=g)
        elif name == "broadcast":
            d.broadcast(self.send, src=self._global(0), group=g)
        elif name == "all_gather":
            d.all_gather_into_tensor(self.recv, self.send, group=g)
        elif name == "reduce_scatter":
            d.reduce_scatter_tensor(self.recv, self.send, group=g)
        elif name == "all_to_all":
            d.all_to_all_single(self.recv, self.send, group=g)
        elif name == "sendrecv":
            peer_to = self._global((self.rank + 1) % self.world)
            peer_from = self._global((self.rank - 1) % self.world)
            ops = [d.P2POp(d.isend, self.send, peer_to, group=g), d.P2POp(d.irecv, self.recv, peer_from, group=g)]
            for req in d.batch_isend_irecv(ops):
                req.wait()
        else:  # the CLI validates names against topoprof.specs.collective_spec.COLLECTIVES
            raise ValueError(f"unknown collective {name}")

    def fill_for_check(self) -> None:
        t, r = self.t, self.rank
        if self.recv is not self.send:
            self.recv.zero_()
        if self.name == "broadcast" and r != 0:
            self.send.zero_()
            return
        source = 0 if self.name == "broadcast" else r
        for start in range(0, self.send_n, CHECK_CHUNK):
            n = min(CHECK_CHUNK, self.send_n - start)
            self.send[start:start + n].copy_(_pattern(t, n, source, self.dtype, self.device, offset=start))

    def expected(self, start: int, n: int):
        """Expected recv[start:start+n], or None where the result is undefined."""
        t, w, r, dt, dev, name = self.t, self.world, self.rank, self.dtype, self.device, self.name
        if name == "all_reduce" or (name == "reduce" and r == 0):
            return _expected_sum(t, n, w, dt, dev, offset=start)
        if name == "reduce":
            return None  # non-root buffers are undefined after reduce (as in nccl-tests)
        if name == "broadcast":
            return _pattern(t, n, 0, dt, dev, offset=start)
        if name == "reduce_scatter":
            return _expected_sum(t, n, w, dt, dev, offset=r * self.recv_n + start)
        if name == "sendrecv":
            return _pattern(t, n, (r - 1) % w, dt, dev, offset=start)
        idx = t.arange(start, start + n, device=dev, dtype=t.int64)
        chunk = self.recv_n // w
        src, within = idx // chunk, idx % chunk
        if name == "all_gather":  # output chunk j = rank j's whole input
            return ((within + src) % 3).to(dt)
        if name == "all_to_all":  # output chunk j = rank j's input chunk r
            return ((r * chunk + within + src) % 3).to(dt)
        raise ValueError(name)

    def count_wrong(self) -> int:
        wrong = 0
        for start in range(0, self.recv_n, CHECK_CHUNK):
            n = min(CHECK_CHUNK, self.recv_n - start)
            want = self.expected(start, n)
            if want is None:
                return 0
            wrong += int((self.recv[start:start + n] != want).sum().item())
        return wrong


def _agree(torch, dist, device, ok: bool, group=None) -> bool:
    """True when every rank of the group succeeded (a MIN all-reduce of a flag)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _raise_if_backend(dist, err: BaseException) -> None:
    """A size that cannot be allocated stops the sweep with its reason; a communicator's own error
    (NCCL's `DistBackendError`, a RuntimeError too) is no such stop: it ends the rank, which
    the launcher reports as a failure, with the rows measured before it kept."""
    backend_error = getattr(dist, "DistBackendError", None)
    if backend_error is not None and isinstance(err, backend_error):
        raise err


def _allocate(torch, dist, ctx, name, send_n, recv_n, dtype, where):
    try:
        op, error = _Op(torch, dist, name, send_n, recv_n, dtype, ctx.device, where.rank, where.size, where.group), None
    except (RuntimeError, MemoryError) as err:  # torch.OutOfMemoryError is a RuntimeError
        _raise_if_backend(dist, err)
        op, error = None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not _agree(torch, dist, ctx.device, op is not None):  # the whole job agrees: all stop together
        return None, error or "another rank could not allocate its buffers"
    return op, None


def _time_op(op: _Op, iters: int, warmup: int, sync) -> float:
    op.send.zero_()  # zeros keep repeated in-place reductions finite during timing
    for _ in range(warmup):
        op.run()
    sync()
    op.d.barrier(group=op.group)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        op.run()
    sync()
    return (time.perf_counter() - start) / iters * 1e6


def _gather_all(torch, dist, ctx, time_us: float, wrong: int, group: tuple):
    """Every rank's (time, wrong, (group label, size, ranks in group)) over the whole job."""
    mine = torch.tensor([time_us, float(wrong)], dtype=torch.float64, device=ctx.device)
    every = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(every, mine)
    groups: list = [None] * ctx.world_size
    dist.all_gather_object(groups, group)
    return [(float(t[0]), int(float(t[1])), tuple(g)) for t, g in zip(every, groups)]


class Where:
    """This rank's place in the group being measured: the group (None = every rank), its size,
    this rank's position in it (None when this rank sits this level out), its label."""

    def __init__(self, level: str, group, size: int, rank: int | None, label: str, members: list[int]):
        self.level, self.group, self.size, self.rank = level, group, size, rank
        self.label, self.members = label, members


def _check(op: "_Op", ctx, job: CollectivesJob, sync) -> int | None:
    """The correctness run: fill, one collective, count wrong elements (None when not checked)."""
    if not job.check:
        return None
    op.fill_for_check()
    op.run()
    sync()
    if job.corrupt_rank == ctx.rank:  # test hook: a flipped result must be counted
        op.recv[0] = op.recv[0] + 1
    return op.count_wrong()


def _measure(torch, dist, ctx, spec, size, n, elem, dtype, job: CollectivesJob, sync, where):
    """(time_us, wrong) on this rank, or (nan, 0) for a rank that sits the level out.

    Every step that can fail on one rank (allocation, the check's temporaries) is followed by an
    agreement over the whole job, so all ranks stop the sweep together instead of some waiting in
    the next collective for a rank that left."""
    send_n, recv_n = spec.counts(size, n, elem)
    op, error = _allocate(torch, dist, ctx, spec.name, send_n, recv_n, dtype, where)
    if op is None:
        return None, error
    sits_out = where.rank is None or spec.name == "sendrecv" and n < 2  # sendrecv needs a peer
    wrong, error = None, None
    if not sits_out:
        try:
            wrong = _check(op, ctx, job, sync)
        except (RuntimeError, MemoryError) as err:  # torch.OutOfMemoryError is a RuntimeError
            _raise_if_backend(dist, err)
            error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not _agree(torch, dist, ctx.device, error is None):
        return None, error or "another rank failed its correctness check (out of memory?)"
    if sits_out:
        return (float("nan"), 0), None
    return (_time_op(op, int(job.iters), int(job.warmup), sync), wrong), None


def run_size(torch, dist, ctx, spec, size: int, job: CollectivesJob, sync, where: Where | None = None):
    """Rows for one size (one per group measured): returns (rows, stop reason or None)."""
    where = where or Where("job", None, ctx.world_size, ctx.rank, "", list(range(ctx.world_size)))
    dtype_attr, elem = DTYPES[job.dtype]
    dtype = getattr(torch, dtype_attr)
    n = where.size
    size = spec.aligned_size(size, n, elem)
    # Groups of different sizes may round a size differently: skip it everywhere or nowhere.
    if not _agree(torch, dist, ctx.device, size > 0):
        return [], None
    measured, error = _measure(torch, dist, ctx, spec, size, n, elem, dtype, job, sync, where)
    if measured is None:
        return [], f"stopped at {size} B: {error}"
    time_us, wrong = measured
    checked = wrong is not None or where.rank is None
    every = _gather_all(torch, dist, ctx, time_us, wrong or 0, (where.label, size, n))
    rows = []
    measured_ranks = [r for r in range(ctx.world_size) if every[r][0] == every[r][0]]  # not NaN
    for label, g_size, g_n in sorted({every[r][2] for r in measured_ranks}):
        members = [r for r in measured_ranks if every[r][2] == (label, g_size, g_n)]
        times = [every[r][0] for r in members]
        # each group's row from its own size and rank count: nodes may differ
        rows.append(make_row(spec, g_size, g_n, job.dtype, elem, combine(times, job.combine),
                             sum(every[r][1] for r in members) if checked else None, tuple(times),
                             level=where.level, group=label, ranks=tuple(members)))
    return rows, None


def node_id() -> str:
    """Which node this rank runs on: the launcher's node index (torchrun GROUP_RANK, SLURM
    SLURM_NODEID) with the host name; two nodes may share a host name (containers, namespaces)."""
    index = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", "0"))
    return f"node{index} ({platform.node()})"


def describe_ranks(torch, dist, ctx) -> dict:
    """Every rank's host and device, gathered to all ranks, plus library versions."""
    mine = {"rank": ctx.rank, "host": platform.node(), "node": node_id(), "pid": os.getpid(),
            "device": ctx.device, "device_name": "CPU"}
    if ctx.device.startswith("cuda"):
        mine["device_name"] = torch.cuda.get_device_name(ctx.device)
        # which of the node's GPUs this rank's device is, whatever CUDA_VISIBLE_DEVICES chose
        mine["device_uuid"], mine["device_bus_id"] = device_identity(torch, ctx.device)
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    nccl = None
    if ctx.device.startswith("cuda"):
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    return {"ranks": every, "torch_version": torch.__version__, "nccl_version": nccl,
            "cuda_version": torch.version.cuda, "backend": dist.get_backend()}


def run_rank(ctx, job: CollectivesJob) -> None:
    """Sweep every requested collective over every size; rank 0 reports rows as they finish."""
    import torch  # lazy: torch, loaded only inside the worker process that measures
    import torch.distributed as dist  # lazy: torch, loaded only inside the worker process that measures


    sync = lambda: synchronize(ctx.device)  # noqa: E731
    meta = describe_ranks(torch, dist, ctx)
    if ctx.rank == 0:
        ctx.send(CollectivesMeta(**meta))
    for where in level_groups(dist, ctx, meta["ranks"], job.levels):
        for name in job.collectives:
            spec = get_collective(name)
            for size in job.sizes:
                ctx.progress(f"{where.level} {name} {size} B")
                rows, stop = run_size(torch, dist, ctx, spec, size, job, sync, where)
                if stop is not None:
                    if ctx.rank == 0:
                        ctx.send(CollectiveStopped(name, where.level, stop))
                    break
                if ctx.rank == 0:
                    for row in rows:
                        ctx.send(CollectiveRow(dataclasses.asdict(row)))


def level_groups(dist, ctx, ranks_info: list[dict], levels: list[str]) -> list[Where]:
    """This rank's group for each level. Every rank creates every group, in the same order, as
    torch.distributed.new_group requires; a rank outside a group gets rank None there."""
    hosts = []
    for info in sorted(ranks_info, key=lambda r: r["rank"]):
        if info["node"] not in hosts:
            hosts.append(info["node"])
    by_host = {h: [r["rank"] for r in ranks_info if r["node"] == h] for h in hosts}
    mine = next(r["node"] for r in ranks_info if r["rank"] == ctx.rank)
    out = []
    for level in levels:
        # Decided from the gathered rank list, so every rank skips the same levels.
        if level == "intra" and max(len(m) for m in by_host.values()) < 2 or level == "inter" and len(hosts) < 2:
            continue
        if level == "job":
            out.append(Where("job", None, ctx.world_size, ctx.rank, "", list(range(ctx.world_size))))
        elif level == "intra":
            groups = {h: dist.new_group(members) for h, members in by_host.items()}
            members = by_host[mine]
            out.append(Where("intra", groups[mine], len(members), members.index(ctx.rank), mine, members))
        elif level == "inter":
            leaders = [members[0] for members in by_host.values()]  # the lowest rank of each node
            group = dist.new_group(leaders)
            inside = ctx.rank in leaders
            out.append(Where("inter", group, len(leaders), leaders.index(ctx.rank) if inside else None,
                             "network" if inside else "", leaders))
        else:
            raise ValueError(f"unknown level {level!r}")
    return out
