"""Gradient buckets as PyTorch DDP forms them, in pure Python.

`compute_bucket_assignment_by_size` is a line-by-line port of the C++ function of that name in
`torch/csrc/distributed/c10d/reducer.cpp` (exposed as
`torch.distributed._compute_bucket_assignment_by_size`): walk the tensors in the given order,
keep one open bucket per (dtype, device), add each tensor, and close the bucket once its size
reaches the current limit (`>=`, so a bucket overshoots by up to one tensor); each key then
moves to the next limit in the list and stays at the last one.

What DDP (torch 2.13, `torch/nn/parallel/distributed.py`) actually reduces with:
- At construction, with the default `find_unused_parameters=False`,
  `_BucketCapacityConfig.compute_bucket_size_limits` passes `[sys.maxsize]`: the *first*
  iteration reduces all gradients in one bucket per dtype.
- During that first backward the reducer records the order in which gradients become ready
  (`Reducer::autograd_hook` -> `rebuilt_params_`), and `Reducer::rebuild_buckets` (run from
  the next `_pre_forward`) calls `compute_bucket_assignment_by_size` on the parameters *in
  gradient-ready order*, with `tensor_indices` (so no re-sorting) and limits
  `[first_bucket_bytes_cap, bucket_bytes_cap]`. These are the buckets of every later step,
  and the ones this model uses. For a model used front to back, ready order is roughly the
  reverse registration order.
- `first_bucket_bytes_cap` is `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB) only when
  `bucket_cap_mb` is left at its default (None -> 25 MiB); an explicit `bucket_cap_mb` sets
  both limits to it (`_BucketCapacityConfig.create`).
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from topoprof.comm import CommModel
from topoprof.errors import InputError
from topoprof.presets import Layout

MIB = 1024 * 1024  # torch/nn/parallel/distributed.py _MB_TO_BYTES
DEFAULT_BUCKET_CAP_MB = 25  # torch/nn/parallel/distributed.py _DEFAULT_BUCKET_CAP_MB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # dist._DEFAULT_FIRST_BUCKET_BYTES (reducer.hpp)
DATAPARALLEL_COALESCE_BYTES = 10485760  # torch/nn/parallel/comm.py buffer_size (10 MiB)
NO_SIZE_LIMIT = 0  # reducer.cpp kNoSizeLimit, recorded for sparse buckets


def compute_bucket_assignment_by_size(
    sizes_bytes: Sequence[int],
    bucket_size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] | None = None,
    tensor_indices: Sequence[int] | None = None,
    keys: Sequence[Hashable] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Port of reducer.cpp `compute_bucket_assignment_by_size`.

    sizes_bytes[i] is tensor i's numel * element_size; keys[i] its (dtype, device) (all equal
    when None). Returns (bucket indices, per-bucket size limit) like torch. One difference:
    the leftover open buckets are appended in the order their key was first seen, where C++
    walks an unordered_map; with one key (every layout here) the two agree, and without
    tensor_indices both are sorted anyway."""
    if not sizes_bytes:
        raise InputError("cannot bucket an empty list of tensors")
    if not bucket_size_limits:
        raise InputError("bucket_size_limits must not be empty")
    keys = keys if keys is not None else [None] * len(sizes_bytes)
    result: list[tuple[list[int], int]] = []
    open_buckets: dict[Hashable, tuple[list[int], int, int]] = {}  # key -> indices, size, limit
    limit_position: dict[Hashable, int] = {}
    for i, size in enumerate(sizes_bytes):
        index = tensor_indices[i] if tensor_indices is not None else i
        if expect_sparse_gradient is not None and expect_sparse_gradient[index]:
            result.append(([index], NO_SIZE_LIMIT))  # a sparse gradient gets its own bucket
            continue
        key = keys[i]
        indices, total, _ = open_buckets.get(key, ([], 0, 0))
        indices.append(index)
        total += size
        position = limit_position.setdefault(key, 0)
        limit = bucket_size_limits[position]
        if total >= limit:
            result.append((indices, limit))
            open_buckets[key] = ([], 0, 0)
            limit_position[key] = min(position + 1, len(bucket_size_limits) - 1)
        else:
            open_buckets[key] = (indices, total, limit)
    result.extend((indices, limit) for indices, _, limit in open_buckets.values() if indices)
    if tensor_indices is None:
        # Without tensor_indices torch assumes use order and sorts buckets by smallest index.
        result.sort(key=lambda bucket: min(bucket[0]))
    return [b[0] for b in result], [b[1] for b in result]


def ddp_bucket_limits(bucket_cap_mb: float | None = None) -> tuple[int, int]:
    """(first_bucket_bytes_cap, bucket_bytes_cap) as `_BucketCapacityConfig.create` sets them."""
    if bucket_cap_mb is None:
        return DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB * MIB
    if not bucket_cap_mb > 0:
        raise InputError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
    cap = int(bucket_cap_mb * MIB)
    return cap, cap


@dataclass(frozen=True)
class Bucket:
    """One DDP bucket, in launch order: its tensors, bytes, and when its last gradient is ready
    as a share of backward compute."""

    tensor_indices: tuple[int, ...]
    size_bytes: int
    numel: int
    ready_fraction: float


def ddp_buckets(layout: Layout, grad_bytes: int, bucket_cap_mb: float | None = None
                ) -> tuple[Bucket, ...]:
    """The steady-state (rebuilt) buckets: layout tensors in gradient-ready order."""
    schedule = layout.ready_schedule()
    numel = [layout.tensors[r.index].numel for r in schedule]
    first, cap = ddp_bucket_limits(bucket_cap_mb)
    groups, _ = compute_bucket_assignment_by_size(
        [n * grad_bytes for n in numel], [first, cap],
        tensor_indices=[r.index for r in schedule])
    fraction = {r.index: r.ready_fraction for r in schedule}
    buckets = []
    for group in groups:
        count = sum(layout.tensors[i].numel for i in group)
        buckets.append(Bucket(tuple(group), count * grad_bytes, count,
                              max(fraction[i] for i in group)))
    return tuple(buckets)


def take_tensors(sizes_bytes: Sequence[int], size_limit: int = DATAPARALLEL_COALESCE_BYTES
                 ) -> list[int]:
    """Chunk sizes of torch `_take_tensors` (torch/_utils.py), which DataParallel's
    `broadcast_coalesced` and `reduce_add_coalesced` use: start a new chunk when the next
    tensor would push it past the limit; a tensor larger than the limit travels alone."""
    chunks: list[int] = []
    current = 0
    for size in sizes_bytes:
        if current + size > size_limit and current > 0:
            chunks.append(current)
            current = 0
        current += size
    if current > 0:
        chunks.append(current)
    return chunks


FP16_BYTES = 2  # torch.float16, what fp16_compress_hook sends per element


def ddp_copy_bytes(params: int, grad_bytes: int, gradient_as_bucket_view: bool) -> int:
    """Memory traffic of DDP's bucket copies per synced backward. reducer.cpp
    `mark_variable_ready_dense` copies each gradient into its bucket (dividing by world size)
    and `finalize_backward` copies the reduced bucket back: read + write G each way, 4G bytes.
    With gradient_as_bucket_view the gradients are the bucket; the in-place divide is left: 2G."""
    passes = 2 if gradient_as_bucket_view else 4
    return passes * grad_bytes * params


def fp16_cast_bytes(numel: int, grad_bytes: int) -> int:
    """Memory traffic fp16_compress_hook adds to one bucket (default_hooks.py `_compress_hook`):
    `buffer.to(float16)` reads grad_bytes and writes 2 per element, `div_` reads and writes 2,
    and `decompress` copies back (reads 2, writes grad_bytes): numel * (2*grad_bytes + 8)."""
    return numel * (2 * grad_bytes + 4 * FP16_BYTES)


def dataparallel_comm_s(comm: CommModel, numel: Sequence[int], param_bytes: int,
                        grad_bytes: int, output_bytes: int) -> float:
    """torch.nn.DataParallel per forward/backward, none of it overlapped with compute:
    `replicate` broadcasts every parameter from GPU 0 (`broadcast_coalesced`, 10 MiB chunks),
    `gather` copies each GPU's outputs to GPU 0, and after the whole backward
    `ReduceAddCoalesced` sums every gradient onto GPU 0 (10 MiB chunks, NCCL reduce).
    torch/nn/parallel/data_parallel.py, replicate.py, _functions.py, comm.py."""
    broadcast = sum(comm.broadcast_s(c) for c in take_tensors([n * param_bytes for n in numel]))
    reduce = sum(comm.reduce_s(c) for c in take_tensors([n * grad_bytes for n in numel]))
    return broadcast + reduce + (comm.gather_s(output_bytes) if output_bytes else 0.0)


@dataclass(frozen=True)
class Overlap:
    backward_end_s: float  # wall time backward ends (slowed while an all-reduce runs)
    comm_end_s: float  # when the last bucket's all-reduce ends
    exposed_s: float  # max(backward_end, comm_end) - T_bwd: time communication adds


def simulate_overlap(ready_s: Sequence[float], comm_s: Sequence[float], backward_s: float,
                     slowdown: float = 1.0, comm_slowdown: float = 1.0) -> Overlap:
    """DDP's bucket pipeline. Bucket j (launch order) starts once backward has produced its last
    gradient and bucket j-1 has finished: start_j = max(ready_j, end_{j-1}); reducer.cpp
    `mark_bucket_ready` launches buckets strictly in order, and one communication stream runs
    them one at a time. `ready_s` is in seconds of backward compute, `comm_s` in seconds of an
    all-reduce running alone.

    While both run they share the machine: backward advances at 1/slowdown of its own speed and
    the all-reduce at 1/comm_slowdown of its own (communication threads or kernels competing with
    compute for the same cores or SMs; 1.0 = no interference). Either runs at full speed alone."""
    if slowdown < 1 or comm_slowdown < 1:
        raise InputError(f"slowdowns must be >= 1, got compute {slowdown}, communication {comm_slowdown}")
    # Tracked as lag = wall clock - backward progress: it grows only while the two share the
    # machine (by what backward loses) or an all-reduce runs after backward; summing small lags
    # keeps precision when backward is long and communication short.
    lag = progress = 0.0
    backward_lag = None  # lag when backward finishes
    comm_end = 0.0
    for ready, duration in zip(ready_s, comm_s):
        progress = max(progress, ready)  # backward alone until this bucket is ready
        left = duration  # seconds of all-reduce-alone work still to do
        if progress < backward_s and left > 0:
            # Both run until the first of them finishes.
            both = min(left * comm_slowdown, (backward_s - progress) * slowdown)
            left = max(0.0, left - both / comm_slowdown)
            progress = min(backward_s, progress + both / slowdown)
            lag += both * (1 - 1 / slowdown)
        if progress >= backward_s and backward_lag is None:
            backward_lag = lag
        lag += left  # the rest of the all-reduce runs alone, after backward
        comm_end = progress + lag
    if backward_lag is None:
        backward_lag = lag  # backward finishes after the last all-reduce
    return Overlap(backward_s + backward_lag, comm_end, lag)


def overlap_floor_s(ready_fractions: Sequence[float], comm_s: Sequence[float],
                    slowdown: float = 1.0, comm_slowdown: float = 1.0) -> float:
    """The least exposed time however long backward is: buckets ready only when backward ends
    run after it in full; the others run beside backward for d * comm_slowdown of wall time, in
    which backward advances only 1/slowdown of that, so each adds d * comm_slowdown * (1 - 1/slowdown)."""
    return sum(d if f >= 1.0 else comm_slowdown * (1 - 1 / slowdown) * d
               for f, d in zip(ready_fractions, comm_s))


def hiding_backward_s(ready_fractions: Sequence[float], comm_s: Sequence[float],
                      slowdown: float = 1.0, comm_slowdown: float = 1.0) -> float:
    """The shortest backward for which the exposed time reaches `overlap_floor_s`. The exposed
    time never grows with backward time (more compute, more room to overlap) and reaches the
    floor at a finite time, so: bracket by doubling, then bisect."""
    floor = overlap_floor_s(ready_fractions, comm_s, slowdown, comm_slowdown)

    def at_floor(backward_s: float) -> bool:
        ready = [f * backward_s for f in ready_fractions]
        exposed = simulate_overlap(ready, comm_s, backward_s, slowdown, comm_slowdown).exposed_s
        return exposed <= floor * (1 + 1e-9) + 1e-15

    if at_floor(0.0):
        return 0.0
    low, high = 0.0, max(sum(comm_s), 1e-12)
    for _ in range(200):
        if at_floor(high):
            break
        low, high = high, high * 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (low, mid) if at_floor(mid) else (mid, high)
    return high
