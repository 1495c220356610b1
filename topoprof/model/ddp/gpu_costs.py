"""What DDP costs on a GPU node beyond the tail of its all-reduces, part by part.

Each part below is named with where it comes from, what it scales with when carried to another
model, how `topoprof validate` measures it, and what a what-if assumes where nothing measured it:
a range with its cited basis, never one number. `topoprof.model.strategies` adds them to DDP's
timeline; the report lists them per synced micro-batch so that a user sees which one to attack.

1. DDP's kernels (`ddp_kernels`). torch/csrc/distributed/c10d/reducer.cpp, per synced
   micro-batch: `mark_variable_ready_dense` writes each gradient into its bucket with one kernel
   (`at::mul_out(bucket_view, grad, 1/world_size)`: the divide and the copy in one pass),
   `finalize_backward` copies each bucket view back into its gradient (one kernel per gradient;
   none with gradient_as_bucket_view, where the gradient is the bucket), and every bucket launches
   one all-reduce. The memory traffic of those copies is priced apart (`ddp.ddp_copy_bytes`, at
   the memory bandwidth); what is left is a fixed cost per kernel, which dominates for models of
   many small tensors (a ResNet's BatchNorm weights). Scales with: tensors and buckets.
   Measured: `validate`'s synced pass through a hook that communicates nothing, less the same
   micro-batch inside no_sync() (its `ddp_copies_s`), less the traffic at the datasheet bandwidth,
   over the kernels its model launched. What-if: KERNEL_COST_RANGE_S.
2. NCCL's kernels beside backward (`nccl_sm_slowdown_range`). NCCL runs each collective as one
   thread block per channel (src/enqueue.cc), and doubles the channels its ring search found
   (src/graph/connect.cc `ncclTopoPostset`: "nChannels = min(MAXCHANNELS, nChannels*2)"), so while
   an all-reduce runs, 2 x rings of the GPU's SMs are NCCL's. Backward kernels that fill the GPU
   then run on the rest: at worst SMs / (SMs - channels) as long; at best not slowed (memory- or
   launch-bound kernels). Scales with: the time the all-reduces overlap backward. Measured:
   `validate`'s compute beside an all-reduce over compute alone (`compute_slowdown_during_comm`).
3. The slowest rank (`straggler_wait_s`). Every synced micro-batch waits for the slowest rank.
   GPUs of one SKU differ in speed (power management, manufacturing): Sinha et al., "Not All GPUs
   Are Created Equal", SC'22, measured a spread between the fastest and slowest GPU of a cluster of
   8 % on average and 22 % at most across four V100/MI60 clusters. A persistent difference is
   paid on every micro-batch, synced or not; random jitter per micro-batch is paid per sync, so
   syncing every micro-batch pays it k times and `no_sync` once, on the sum of k micro-batches
   (its spread grows as sqrt(k)). Both grow with the number of ranks as the expected maximum of
   that many draws. Measured: `validate` records every rank's time for every micro-batch
   (`rank_speed_spread`, `rank_jitter`). What-if: the persistent part only, GPU_SPEED_SPREAD_RANGE.
4. The all-reduces themselves, at the size of each bucket: the comm model's latency plus bytes
   over bus bandwidth (NCCL's latency model, src/graph/tuning.cc), or the curve `bench` measured.
"""
from __future__ import annotations

import math
from functools import lru_cache

# What DDP's reducer costs per kernel it launches, beyond the memory traffic of its copies, in
# seconds: the span of what was measured.
# - Low, 7.8 us: one op recorded by autograd, issued back to back from Python on an H200 machine
#   (measured on an NVIDIA H200 SXM, torch 2.11, 2026-11-26: shared/gpu-facts, "torch.mul recorded
#   by autograd"). The reducer does its work per gradient inside the autograd engine, from the hook
#   that fires as the gradient is accumulated; a plain op outside autograd costs 6.2 us there.
# - Measured: 11.3 us per kernel by `validate` on one H200 (reports/gpu-nvidia-h200-20261126,
#   `ddp_kernel_s`), on a model of 25M parameters.
# - High, 13.1 us: PyTorch's DDP benchmark on a V100 (shared/published/ddp-gpu-dev-set.json, entry
#   1): T(1 GPU under DDP) - T(1 GPU) less the copies' traffic at the datasheet's 900 GB/s, over
#   the kernels `ddp_kernels` counts: 12.9 us (resnet101, 9 ms over 636 kernels) and 13.1 us
#   (resnext101_32x8d, 10 ms over 641). Its smaller models differ by 2-3 ms, which its
#   millisecond rounding leaves at 4.8-7.8 us +- 3 us: read as inside this span, not as its end.
# The old figures of a kernel alone on the GPU (3.8 us back to back, CUDA Graphs blog, V100) fall
# below every measurement of DDP itself: the reducer's own host work per gradient is the cost.
KERNEL_COST_RANGE_S = (7.8e-6, 13.1e-6)

KERNEL_COST_BASIS = ("7.8-13.1 us per DDP kernel: an autograd-recorded op's host cost on an H200 machine "
                     "(shared/gpu-facts) .. PyTorch's DDP benchmark, 1 V100 with vs without DDP (resnet101, "
                     "resnext101); one H200 measured 11.3 us")

# Fastest-to-slowest spread of one GPU SKU over a whole cluster (Sinha et al., SC'22): 8 % on
# average, 22 % at most. As a per-GPU standard deviation: the spread over the expected range of
# the largest cluster measured (Summit, about 25,000 of its 27,648 V100s sampled).
_CLUSTER_SPREAD = (0.08, 0.22)

_CLUSTER_GPUS = 25_000

GPU_SPEED_SPREAD_BASIS = ("GPUs of one SKU differ by 8 % on average, 22 % at most, fastest to slowest over a cluster "
                          "(Sinha et al., 'Not All GPUs Are Created Equal', SC'22)")

# src/graph/connect.cc ncclTopoPostset: the channels the ring search found, doubled, up to
# MAXCHANNELS (32, src/include/device.h).
NCCL_CHANNELS_PER_RING = 2

NCCL_MAX_CHANNELS = 32


def geometric_middle(low: float, high: float) -> float:
    """The middle of a range of factors or costs that span a ratio, as the what-ifs use it."""
    return math.sqrt(low * high)


def ddp_kernels(tensors: int, buckets: int, gradient_as_bucket_view: bool) -> int:
    """Kernels DDP's reducer launches per synced micro-batch (reducer.cpp, module docstring)."""
    per_tensor = 1 if gradient_as_bucket_view else 2
    return per_tensor * tensors + buckets


def nccl_sm_slowdown_range(sm_count: int, rings: int) -> tuple[float, float]:
    """(best, worst) slowdown of backward while an all-reduce holds NCCL's channels' SMs."""
    channels = min(NCCL_MAX_CHANNELS, NCCL_CHANNELS_PER_RING * max(1, rings))
    if channels >= sm_count:
        raise ValueError(f"{channels} NCCL channels on {sm_count} SMs")
    return 1.0, sm_count / (sm_count - channels)


@lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """E[max of n standard normal draws]: 0 for one, 1/sqrt(pi) for two; by quadrature of
    x * n * phi(x) * Phi(x)^(n-1) (exact to well under 1e-6 for any n used here)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n == 1:
        return 0.0
    steps, low, high = 4000, -10.0, 10.0
    width = (high - low) / steps
    total = 0.0
    for i in range(steps + 1):
        x = low + i * width
        weight = 0.5 if i in (0, steps) else 1.0
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += weight * x * n * pdf * cdf ** (n - 1)
    return total * width


def expected_range_normal(n: int) -> float:
    """E[max - min] of n standard normal draws."""
    return 2 * expected_max_normal(n)


def gpu_speed_spread_range() -> tuple[float, float]:
    """Per-GPU speed standard deviation (share of compute) from the cited cluster spreads."""
    span = expected_range_normal(_CLUSTER_GPUS)
    return _CLUSTER_SPREAD[0] / span, _CLUSTER_SPREAD[1] / span


def straggler_wait_s(world_size: int, micro_batch_s: float, accumulation_steps: int, syncs: int,
                     speed_spread: float, jitter_s: float, basis_world_size: int = 1) -> float:
    """What an optimizer step waits for its slowest rank, beyond the mean rank's compute.

    Between two syncs each rank runs m = accumulation_steps / syncs micro-batches on its own. Its
    time then differs from the mean rank's by a persistent part, m * micro_batch_s * speed_spread
    (a slower GPU is slower on every micro-batch), and by random jitter whose spread grows as
    sqrt(m) * jitter_s. The slowest of `world_size` ranks is E[max of world_size normals] of that
    combined spread late, at every sync. `basis_world_size`: the ranks whose slowest the compute
    figure already is (a calibration takes each micro-batch at its slowest rank), so that their
    wait is not counted twice."""
    k = accumulation_steps
    if syncs < 1 or k % syncs:
        raise ValueError(f"{syncs} syncs in {k} micro-batches")

    def spread_s(m: int) -> float:
        return math.hypot(m * micro_batch_s * speed_spread, math.sqrt(m) * jitter_s)

    waits = syncs * expected_max_normal(world_size) * spread_s(k // syncs)
    already = k * expected_max_normal(basis_world_size) * spread_s(1)
    return waits - already
