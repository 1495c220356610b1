"""Compute per micro-batch from the model's own operations: its op trace priced op by op, and the
ops composed as the device runs them.

The op trace (`topoprof/trace/op_trace.py`: one forward and backward on the meta device, every aten op
with its FLOPs by `torch.utils.flop_counter`'s rules, the bytes it reads and writes, its phase,
a matmul's input shapes) is priced by a device description that gives each op's device time and
host time at the fast end, the middle and the slow end of its ranges:

- `profiled.ProfiledDevice`: the rates a device profile measured (GEMM by shape, memory-bound
  ops by kind and size, attention by sequence), used as measured on the profiled GPU or scaled
  to another by datasheet ratios (`profile_scale`), and the host's cost per op by kind
  (`host_costs`). This is how a what-if is priced wherever a profile can be had;
- `DeviceModel` (here): where none can (a precision or GPU no profile can be scaled to, e.g. a
  V100, which has no bf16 to scale a bf16 profile by), the datasheet's peak and bandwidth with
  cited shares:

      device time of op i = max(F_i / (peak x e_i), B_i / BW)   at the fast end (compute and memory overlap)
                       or   F_i / (peak x e_i) + B_i / BW        at the slow end (no overlap)

  F_i its FLOPs (a causal fused attention about half of them: FlashAttention-2, Dao 2023, §3.1
  and §4.1); e_i the share of peak its kind reaches (a GEMM or convolution the large-GEMM share,
  at the slow end times its tile and wave quantization, NVIDIA's "Matrix Multiplication
  Background User's Guide"; fused attention its own share); B_i the bytes it reads and writes;
  every kernel-launching op one cited host cost.

The composition: on a GPU the host queues kernels ahead of the device (PyTorch docs, "CUDA
semantics: asynchronous execution"): op i starts when the host has issued it and op i-1 has
ended, so the step is bound by the slower of the two and takes at most their sum. On a CPU the op
runs on the calling thread: host and device time add, op by op. Views launch no kernel. Under
torch.compile the trace is first fused (`fusion.fuse`) and the host pays per graph and per
kernel. The fast end takes every range at the end that makes the step fast, the slow end the
other, the middle each range's geometric middle. Nothing here imports torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from topoprof.errors import InputError
from topoprof.model.compute import op_kinds
from topoprof.model.compute.datasheet import SM_COUNT
from topoprof.model.compute.fusion import fuse
from topoprof.model.compute.host_costs import compiled_host_seconds, datasheet_host_costs, selective_cost
from topoprof.model.compute.roofline_terms import (
    COMPILED_HOST_COST_S,
    COPY_BANDWIDTH_BASIS,
    COPY_BANDWIDTH_SHARE,
    EAGER_HOST_COST_S,
    ENDS,
    GEMM_TILE,
    Span,
    quantization,
)
from topoprof.specs.traced_pass import TracedOp, TracedPass


class Pricer(Protocol):
    """What the composition needs of a device: each op's device time and each op's host time."""

    name: str
    asynchronous: bool
    compiled: bool
    notes: tuple[str, ...]

    # (seconds, "matmul"|"attention"|"memory")
    def device_seconds(self, op: TracedOp, end: str) -> tuple[float, str]: ...

    def host_seconds(self, trace: TracedPass, end: str) -> list[float]: ...       # one per op of the trace

    def basis_lines(self) -> tuple[str, ...]: ...

    def trace_lines(self, trace: TracedPass) -> tuple[str, ...]: ...             # what this trace adds to the basis


# ---- the datasheet path: peak and bandwidth with cited shares --------------------------------

# A large GEMM's share of the datasheet peak: "optimized GEMM can reach up to 80-90% of the
# theoretical maximum device throughput" (Dao 2023, "FlashAttention-2: Faster Attention with Better
# Parallelism and Work Partitioning", §1).
GEMM_EFFICIENCY = Span(0.80, 0.90, "large GEMMs reach 80-90 % of peak (Dao 2023, FlashAttention-2, §1)")
# A fused attention kernel's share: FlashAttention-2 reaches "50-73% of the theoretical maximum
# FLOPs/s on A100" (Dao 2023, abstract; up to 73 % forward, 63 % backward, §1).
ATTENTION_EFFICIENCY = Span(0.50, 0.73, "fused attention reaches 50-73 % of peak (Dao 2023, FlashAttention-2)")

@dataclass(frozen=True)
class DeviceModel:
    """A device by its datasheet figures and cited shares; each figure with its source."""

    name: str
    peak_flops: float                 # FLOP/s of a matmul at the precision traced
    peak_basis: str
    bandwidth: Span                   # bytes/s the memory-bound ops reach
    gemm_efficiency: Span             # share of peak a large GEMM reaches
    attention_efficiency: Span        # share of peak a fused attention kernel reaches
    host_cost: dict[str, Span]        # seconds per kernel-launching op, by phase ("forward", "backward")
    asynchronous: bool                # the host queues kernels ahead (a GPU stream) or runs them inline (a CPU)
    sms: int | None = None            # tiles run in waves of this many (None: no quantization)
    tile: tuple[int, int] = GEMM_TILE
    compiled: bool = False            # under torch.compile: fused, a launch per kernel, a call per graph
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.peak_flops > 0:
            raise InputError(f"{self.name}: peak FLOP/s must be > 0, got {self.peak_flops}")
        if not self.bandwidth.low > 0:
            raise InputError(f"{self.name}: memory bandwidth must be > 0, got {self.bandwidth.low}")
        for span in (self.gemm_efficiency, self.attention_efficiency):
            if not 0 < span.low <= span.high <= 1:
                raise InputError(f"{self.name}: an efficiency must be in (0, 1], got {span.low}..{span.high}")
        if set(self.host_cost) != {"forward", "backward"}:
            raise InputError(f"{self.name}: host cost needs a forward and a backward range")

    def device_seconds(self, op: TracedOp, end: str) -> tuple[float, str]:
        flops: float = op.flops
        memory = (op.bytes_read + op.bytes_written) / self.bandwidth.at(end, fast_is_high=True)
        kind, compute = "memory", 0.0
        if flops > 0:
            if op.name.startswith(op_kinds.ATTENTION_PREFIX):
                kind = "attention"
                eff = self.attention_efficiency.at(end, fast_is_high=True)
                flops = flops / 2 if op.causal else flops
            else:
                kind = "matmul"
                eff = self.gemm_efficiency.at(end, fast_is_high=True)
                shape = op_kinds.gemm_shape(op)
                if shape is not None and end != "fast":
                    q = quantization(shape.m, shape.n, shape.batch, self.sms, self.tile)
                    eff *= q if end == "slow" else math.sqrt(q)
            compute = flops / (self.peak_flops * eff)
        overlapped, serial = max(compute, memory), compute + memory
        return (overlapped if end == "fast" else serial if end == "slow" else math.sqrt(overlapped * serial)), kind

    def host_seconds(self, trace: TracedPass, end: str) -> list[float]:
        if self.compiled:
            return compiled_host_seconds(trace, datasheet_host_costs(EAGER_HOST_COST_S), end)
        selective = selective_cost(trace, None)
        extra = selective.extra_s(self.host_cost["forward"].at(end, fast_is_high=False)) if selective else 0.0
        return [0.0 if op.view else self.host_cost[op.phase].at(end, fast_is_high=False)
                + (extra if op.selective else 0.0) for op in trace.ops]

    def trace_lines(self, trace: TracedPass) -> tuple[str, ...]:
        selective = None if self.compiled else selective_cost(trace, None)
        return () if selective is None else (selective.line(),)

    def basis_lines(self) -> tuple[str, ...]:
        quant = (f"; at the slow end x tile and wave quantization ({self.tile[0]}x{self.tile[1]} tiles over "
                 f"{self.sms} SMs, NVIDIA's Matrix Multiplication Background guide)" if self.sms else "")
        host = (f"host per kernel {COMPILED_HOST_COST_S.text(1e6, ' us')} ({COMPILED_HOST_COST_S.basis}), per graph "
                f"{EAGER_HOST_COST_S.text(1e6, ' us')} ({EAGER_HOST_COST_S.basis}); a parameter's gradient node "
                "nothing apart (the cited range is an op's whole cost: no node's own share is cited)"
                if self.compiled else
                f"host cost per op forward {self.host_cost['forward'].text(1e6, ' us')}, backward "
                f"{self.host_cost['backward'].text(1e6, ' us')}: {self.host_cost['forward'].basis}")
        return (f"peak {self.peak_flops / 1e12:.4g} TFLOP/s: {self.peak_basis}",
                f"memory {self.bandwidth.text(1e-9, ' GB/s')}: {self.bandwidth.basis}",
                f"GEMM {self.gemm_efficiency.text(100, ' %')} of peak: {self.gemm_efficiency.basis}{quant}",
                f"attention {self.attention_efficiency.text(100, ' %')} of peak: {self.attention_efficiency.basis}; "
                "causal counts half (FlashAttention-2 §4.1)", host,
                "per op max(compute, memory) at the fast end, their sum at the slow end")


def gpu_device(spec, precision: str, compiled: bool = False) -> DeviceModel:
    """A datasheet GPU (`topoprof.model.compute.datasheet.GpuSpec`) at `precision`, eager or compiled."""
    peak = spec.peak_tflops(precision)
    if peak is None:
        raise InputError(f"{spec.name} has no {precision} tensor cores; choose another precision")
    bw = spec.memory_bandwidth_gbps * 1e9
    return DeviceModel(
        name=f"{spec.name} ({precision}, {'compiled' if compiled else 'eager'}, datasheet)",
        peak_flops=peak * 1e12, peak_basis=f"{spec.name} {precision} dense {peak:g} TFLOP/s: {spec.source}",
        bandwidth=Span(bw * COPY_BANDWIDTH_SHARE[0], bw * COPY_BANDWIDTH_SHARE[1],
                       f"{spec.memory_bandwidth_gbps:g} GB/s x {COPY_BANDWIDTH_BASIS}"),
        gemm_efficiency=GEMM_EFFICIENCY, attention_efficiency=ATTENTION_EFFICIENCY,
        host_cost={"forward": EAGER_HOST_COST_S, "backward": EAGER_HOST_COST_S}, asynchronous=True,
        sms=SM_COUNT.get(spec.name), tile=GEMM_TILE, compiled=compiled)


# ---- the composition -----------------------------------------------------------------------

@dataclass(frozen=True)
class EndTimes:
    seconds: float
    forward_s: float
    host_s: float                     # host cost summed
    device_s: float                   # device time summed
    by_kind: dict[str, float]         # device time by kind
    kernels: int = 0                  # ops that launch a kernel (after fusion, under torch.compile)


def price(trace: TracedPass, dev: Pricer, end: str) -> EndTimes:
    """One end of the range: every op priced, composed as the device runs them."""
    host_clock = device_end = forward_end = host_sum = device_sum = 0.0
    by_kind = {"matmul": 0.0, "attention": 0.0, "memory": 0.0}
    kernels = 0
    for op, h in zip(trace.ops, dev.host_seconds(trace, end)):
        if op.view:
            continue
        t, kind = dev.device_seconds(op, end)
        by_kind[kind] += t
        kernels += 1
        host_sum, device_sum = host_sum + h, device_sum + t
        if dev.asynchronous:  # the host issues op i, the device runs it after op i-1
            host_clock += h
            device_end = max(host_clock, device_end) + t
        else:                 # inline: the host's cost, then the op
            device_end += h + t
        if op.phase == "forward":
            forward_end = device_end
    return EndTimes(device_end, forward_end, host_sum, device_sum, by_kind, kernels)


@dataclass(frozen=True)
class Roofline:
    """The compute per micro-batch (forward + backward) at the fast end, middle and slow end."""

    seconds: tuple[float, float, float]   # (fast, middle, slow)
    backward_fraction: float              # at the middle
    kernels: int                          # ops that launch a kernel (at the middle)
    views: int
    flops: int
    bytes_moved: int                      # as the trace counts them (before any fusion)
    middle: EndTimes
    device: str
    basis: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def host_bound(self) -> bool:
        return self.middle.host_s > self.middle.device_s

    def summary(self) -> str:
        m = self.middle
        bound = (f"host-bound: {self.kernels} kernels x host cost = {m.host_s * 1e3:.3g} ms > device "
                 f"{m.device_s * 1e3:.3g} ms" if self.host_bound else
                 f"device {m.device_s * 1e3:.3g} ms (matmul {m.by_kind['matmul'] * 1e3:.3g}, attention "
                 f"{m.by_kind['attention'] * 1e3:.3g}, memory-bound {m.by_kind['memory'] * 1e3:.3g}) + host "
                 f"{m.host_s * 1e3:.3g} ms over {self.kernels} kernels")
        return f"{self.device}: {self.flops:.4g} FLOPs, {self.bytes_moved / 1e9:.3g} GB moved; {bound} (middle)"


def roofline(trace: TracedPass, dev: Pricer) -> Roofline:
    """The compute range of one traced forward + backward on `dev`."""
    if not trace.ops:
        raise InputError("the op trace has no ops to price")
    ends = {end: price(fuse(trace, end) if dev.compiled else trace, dev, end) for end in ENDS}
    mid = ends["middle"]
    views = sum(1 for op in trace.ops if op.view)
    composition = ("kernels queue behind the host (a GPU stream)" if dev.asynchronous else
                   "ops run inline on the host")
    return Roofline((ends["fast"].seconds, mid.seconds, ends["slow"].seconds),
                    1 - mid.forward_s / mid.seconds if mid.seconds > 0 else 2 / 3,
                    mid.kernels, views, sum(op.flops for op in trace.ops),
                    sum(op.bytes_read + op.bytes_written for op in trace.ops), mid, dev.name,
                    (*dev.basis_lines(), *dev.trace_lines(trace), composition), dev.notes)
