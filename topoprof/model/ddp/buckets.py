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
  both limits to it (`_BucketCapacityConfig.create`; torch 2.5 to 2.11 apply the same rule in
  `DistributedDataParallel.__init__`, `bucket_bytes_cap_default`. torch 2.1 still gave the first
  bucket 1 MiB whatever the cap.)
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from topoprof.errors import InputError
from topoprof.workload.layout import Layout

MIB = 1024 * 1024  # torch/nn/parallel/distributed.py _MB_TO_BYTES
DEFAULT_BUCKET_CAP_MB = 25  # torch/nn/parallel/distributed.py _DEFAULT_BUCKET_CAP_MB
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # dist._DEFAULT_FIRST_BUCKET_BYTES (reducer.hpp)
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


