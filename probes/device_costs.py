"""This machine's CPU as the roofline needs it (`topoprof.model.compute.roofline.measured_device`), measured
with torch on the threads torch uses:

- peak_flops: a 2048 x 2048 x 2048 fp32 matmul, 2 x 2048^3 FLOPs over its time (the rate a large
  GEMM reaches here, so a GEMM's efficiency is 1 against it);
- bandwidth_bps: a copy between two 64 MiB buffers (twice the 32 MiB that L3 caches of this class
  hold, so it streams from memory), read + write bytes over its time, on `repeats` pairs of
  buffers allocated anew, their median: where the allocator's pages land (a virtual machine's
  memory on its host) moves this figure, as it moves the model's own tensors;
- fresh_page_s_per_byte: writing a new 64 MiB tensor less writing the same into one that exists,
  per byte. glibc's malloc maps an allocation of at least its mmap threshold with mmap(2) and
  unmaps it when freed; the threshold adjusts upward to freed sizes but never above
  DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit (mallopt(3), M_MMAP_THRESHOLD), so an output of at
  least 32 MiB is new pages on every step, and the kernel zero-fills each on its first touch.
  (PyTorch's CUDA caching allocator keeps freed blocks, PyTorch docs "CUDA semantics: memory
  management": a GPU pays nothing of the kind.) fresh_page_min_bytes is that 32 MiB. The figure
  is the steady state of a training loop: the allocation made, filled and freed back to back, so
  that the kernel hands back the pages the one before freed, as a step gets those of the step
  before (`tests/benchmarks/bench_whatif_compute.py` prints a step's minor faults beside the
  trace's fresh bytes), and the fastest of `repeats`. On a virtual machine a page the guest freed long enough ago may
  have gone back to the host (virtio-balloon free page reporting), and its next first touch
  costs the host's fault too: measured here, 1.25 ns/B against 0.12-0.18 for a page just freed.
  That is a start-up cost, not a step's;
- host_forward_s: one autograd-recorded op from Python on a one-element tensor (a forward op's
  dispatch, its autograd node, a kernel doing next to nothing), per op of a loop;
- host_backward_s: one backward node of a chain of such ops, per node of the autograd engine's
  walk (each node runs one op: a multiplication by a constant);
- host_conv_forward_s, host_conv_backward_s: the same for a convolution, whose every call also
  goes through the CPU's convolution library (oneDNN: its primitive and memory descriptors, the
  weight in its blocked layout): a 3x3 convolution of one 8-channel 8x8 image, in a loop and as
  a chain's backward (its input and weight gradients). Its FLOPs are about 0.1 M, so what it
  takes is the per-call cost.

Each other figure is the fastest of `repeats` timings (the one the machine's other work
disturbed least), after a warm-up; `how` says how each was measured.
"""
from __future__ import annotations

import statistics
import time

import torch

GEMM_N = 2048
STREAM_BYTES = 64 << 20
FRESH_PAGE_MIN_BYTES = 32 << 20  # glibc DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, mallopt(3)
HOST_OPS = 2000
CONV_OPS = 200


def fastest(fn, repeats: int) -> float:
    """The fastest of `repeats` calls of `fn`, after one to warm up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _copy_s(src, dst) -> float:
    return fastest(lambda: dst.copy_(src), 2)


def fresh_page_cost(repeats: int) -> dict:
    """fresh_page_s_per_byte and fresh_page_min_bytes (see the module's docstring), with how."""
    n = STREAM_BYTES // 4
    existing = torch.ones(n)
    fresh_s = fastest(lambda: torch.empty(n).fill_(1.0), repeats) - fastest(lambda: existing.fill_(1.0), repeats)
    return {"fresh_page_s_per_byte": max(0.0, fresh_s / STREAM_BYTES), "fresh_page_min_bytes": FRESH_PAGE_MIN_BYTES,
            "how": {"fresh_page_s_per_byte": f"measured: filling a new {STREAM_BYTES >> 20} MiB tensor (the pages the "
                                             f"one before freed) less an existing one, fastest of {repeats}"}}


def conv_host_costs(repeats: int) -> dict:
    """host_conv_forward_s and host_conv_backward_s (see the module's docstring), with how."""
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
    image = torch.randn(1, 8, 8, 8, requires_grad=True)

    def conv_forward():
        for _ in range(CONV_OPS):
            conv(image)

    def conv_chain_backward():
        z = image
        for _ in range(CONV_OPS):
            z = conv(z)
        t0 = time.perf_counter()
        z.sum().backward()
        return time.perf_counter() - t0

    conv_forward_s = fastest(conv_forward, repeats) / CONV_OPS
    conv_chain_backward()
    conv_backward_s = min(conv_chain_backward() for _ in range(repeats)) / CONV_OPS
    return {"host_conv_forward_s": conv_forward_s, "host_conv_backward_s": conv_backward_s,
            "how": {"host_conv_forward_s": f"measured: a 3x3 convolution of one 8x8x8 image, {CONV_OPS} in a loop",
                    "host_conv_backward_s": f"measured: a node of a {CONV_OPS}-convolution chain's backward"}}


def measure_cpu_costs(repeats: int = 5) -> dict:
    a, b = torch.randn(GEMM_N, GEMM_N), torch.randn(GEMM_N, GEMM_N)
    out = torch.empty(GEMM_N, GEMM_N)
    gemm_s = fastest(lambda: torch.mm(a, b, out=out), repeats)
    n = STREAM_BYTES // 4
    # each pair of buffers where the allocator places it, freed before the next pair
    copy_s = statistics.median(_copy_s(torch.ones(n), torch.empty(n)) for _ in range(repeats))
    pages = fresh_page_cost(repeats)
    x = torch.ones(1, requires_grad=True)

    def forward_ops():
        for _ in range(HOST_OPS):
            torch.mul(x, 1.0001)

    leaf = torch.ones(1, requires_grad=True)

    def chain_backward():
        z = leaf
        for _ in range(HOST_OPS):
            z = z * 1.0001
        t0 = time.perf_counter()
        z.backward()
        return time.perf_counter() - t0

    forward_s = fastest(forward_ops, repeats) / HOST_OPS
    chain_backward()
    backward_s = min(chain_backward() for _ in range(repeats)) / HOST_OPS
    convs = conv_host_costs(repeats)
    threads = torch.get_num_threads()
    return {
        "peak_flops": 2 * GEMM_N ** 3 / gemm_s,
        "bandwidth_bps": 2 * STREAM_BYTES / copy_s,
        "fresh_page_s_per_byte": pages["fresh_page_s_per_byte"],
        "fresh_page_min_bytes": pages["fresh_page_min_bytes"],
        "host_forward_s": forward_s, "host_backward_s": backward_s, "threads": threads,
        "host_conv_forward_s": convs["host_conv_forward_s"], "host_conv_backward_s": convs["host_conv_backward_s"],
        "how": {
            "peak_flops": f"measured: {GEMM_N}^3 fp32 matmul on {threads} thread(s), fastest of {repeats}",
            "bandwidth_bps": f"measured: copy of {STREAM_BYTES >> 20} MiB, read + write, median of {repeats} "
                             "buffer pairs",
            "host_forward_s": f"measured: an autograd-recorded op from Python, {HOST_OPS} in a loop",
            "host_backward_s": f"measured: a node of a {HOST_OPS}-op autograd chain's backward",
            **pages["how"], **convs["how"],
        },
    }


def best_of(*measurements: dict) -> dict:
    """Several measurements as one: the compute, host and fresh-page figures, which only other work
    on the machine (or pages the host took back) worsens, at their best (the highest rate, the
    lowest cost); the memory bandwidth, which moves with where pages land, at its median."""
    first = measurements[0]
    out = dict(first)
    out["peak_flops"] = max(m["peak_flops"] for m in measurements)
    for key in ("host_forward_s", "host_backward_s", "host_conv_forward_s", "host_conv_backward_s",
                "fresh_page_s_per_byte"):
        out[key] = min(m[key] for m in measurements)
    out["bandwidth_bps"] = statistics.median(m["bandwidth_bps"] for m in measurements)
    return out
