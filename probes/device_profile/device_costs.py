"""What a CPU's device profile (`probes/device_profile/profile_worker.py`, its `cpu` section and host costs) measures
beyond what it shares with a GPU's, with torch on the threads torch uses; and the fastest-of-n
timer the CPU benchmark uses (`tests/benchmarks/bench_whatif_compute.py`):

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
- host_conv_forward_s, host_conv_backward_s: a convolution's host cost per call, whose every
  call goes through the CPU's convolution library (oneDNN: its primitive and memory descriptors,
  the weight in its blocked layout): a 3x3 convolution of one 8-channel 8x8 image, in a loop and
  as a chain's backward (its input and weight gradients). Its FLOPs are about 0.1 M, so what it
  takes is the per-call cost.

Each figure is the fastest of `repeats` timings (the one the machine's other work disturbed
least), after a warm-up; `how` says how each was measured. (The CPU's GEMM rates, memory
bandwidth and per-op host costs are the profile's own sections, as on a GPU.)
"""
from __future__ import annotations

import time

import torch

STREAM_BYTES = 64 << 20
FRESH_PAGE_MIN_BYTES = 32 << 20  # glibc DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, mallopt(3)
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
