"""Compute per micro-batch from the model's own operations: a roofline over its op trace.

The op trace (`probes/op_trace.py`: one forward and backward on the meta device, every aten op
with its FLOPs by `torch.utils.flop_counter`'s rules, the bytes it reads and writes, its phase,
a matmul's input shapes) is priced op by op on a device description (`DeviceModel`):

    device time of op i = max(F_i / (peak x e_i), B_i / BW)      (roofline: compute and memory overlap)
                     or   F_i / (peak x e_i) + B_i / BW           (no overlap)
                        + fresh_i x c_page                        (a CPU's first touch of new pages)

- F_i: its FLOPs; a causal fused attention computes about half of them (FlashAttention-2, Dao
  2023, §3.1 and §4.1: the blocks above the diagonal are skipped and its FLOPs are counted halved).
- e_i: the share of peak its kind reaches. A GEMM or convolution: the large-GEMM share, times, at
  the slow end, the tile and wave quantization of its shape (NVIDIA, "Matrix Multiplication
  Background User's Guide": ceil(M/T_m) x ceil(N/T_n) tiles of T_m x T_n, run in waves of one tile
  per SM); a fused attention kernel: its own share. Ops without FLOPs (norms, activations,
  softmax, casts, copies, the loss) are memory-bound: B_i / BW alone.
- B_i: bytes read and written, as the trace counts them at the target's precision.
- Views launch no kernel: no time, no host cost.

The host: every kernel-launching op pays a per-op host cost h (framework dispatch and the
launch). On a GPU the host queues kernels ahead of the device (PyTorch docs, "CUDA semantics:
asynchronous execution"): op i starts when the host has issued it and op i-1 has ended, so the
step takes at least max(sum h, sum device time) and at most their sum. On a CPU the op runs on
the calling thread: h and its device time add, op by op.

Every constant is a range with its source; the fast end takes each at the end that makes the
step fast (overlap, high bandwidth and efficiency, no quantization loss, low host cost), the
slow end the other, and the middle the geometric middle of each range (for overlap: of the max
and the sum), as the other what-ifs do (`geometric_middle`). Nothing here imports torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from topoprof.errors import InputError
from topoprof.model.compute.datasheet import SM_COUNT

ENDS = ("fast", "middle", "slow")


@dataclass(frozen=True)
class Span:
    """A cited range (low <= high); `basis` says where both ends come from."""

    low: float
    high: float
    basis: str

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise InputError(f"range {self.low}..{self.high} ({self.basis}): need 0 <= low <= high")

    def at(self, end: str, fast_is_high: bool) -> float:
        """The end of the range that makes a step `end` ("fast", "slow"), or its geometric middle."""
        if end == "middle":
            return math.sqrt(self.low * self.high)
        return self.high if (end == "fast") == fast_is_high else self.low

    def text(self, scale: float = 1.0, unit: str = "") -> str:
        lo, hi = self.low * scale, self.high * scale
        return f"{_num(lo)}{unit}" if lo == hi else f"{_num(lo)}-{_num(hi)}{unit}"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def measured(value: float, basis: str) -> Span:
    return Span(value, value, basis)


@dataclass(frozen=True)
class DeviceModel:
    """What the roofline needs of a device; each figure with its source."""

    name: str
    peak_flops: float                 # FLOP/s of a matmul at the precision traced
    peak_basis: str
    bandwidth: Span                   # bytes/s the memory-bound ops reach
    gemm_efficiency: Span             # share of peak a large GEMM reaches
    attention_efficiency: Span        # share of peak a fused attention kernel reaches
    host_cost: dict[str, Span]        # seconds per kernel-launching op, by phase ("forward", "backward")
    asynchronous: bool                # the host queues kernels ahead (a GPU stream) or runs them inline (a CPU)
    # a kind of op whose per-call cost differs, by op-name prefix, then phase (a CPU's convolutions)
    host_cost_by_kind: dict[str, dict[str, Span]] = field(default_factory=dict)
    sms: int | None = None            # tiles run in waves of this many (None: no quantization)
    tile: tuple[int, int] = (256, 128)
    fresh_page_s_per_byte: float = 0.0  # extra cost of writing pages the allocator just mapped
    fresh_page_min_bytes: int = 0       # outputs at least this large get fresh pages every time
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


# ---- GPUs: datasheet peak and bandwidth (topoprof.model.compute), cited shares ----------------

# A large GEMM's share of the datasheet peak: "optimized GEMM can reach up to 80-90% of the
# theoretical maximum device throughput" (Dao 2023, "FlashAttention-2: Faster Attention with Better
# Parallelism and Work Partitioning", §1).
GEMM_EFFICIENCY = Span(0.80, 0.90, "large GEMMs reach 80-90 % of peak (Dao 2023, FlashAttention-2, §1)")
# A fused attention kernel's share: FlashAttention-2 reaches "50-73% of the theoretical maximum
# FLOPs/s on A100" (Dao 2023, abstract; up to 73 % forward, 63 % backward, §1).
ATTENTION_EFFICIENCY = Span(0.50, 0.73, "fused attention reaches 50-73 % of peak (Dao 2023, FlashAttention-2)")
# Memory-bound kernels against the datasheet bandwidth: a memory-copy kernel reached 1536 of an
# A100 SXM4 80GB's 2039 GB/s and 785 of a V100 SXM2's 900 GB/s (github.com/AnjaliSandip/FastIceFlo,
# output/EffectiveMemoryThroughput.md: "peak memory throughput ... 785 GB/s and 1536 GB/s").
BANDWIDTH_SHARE = (1536 / 2039, 785 / 900)
BANDWIDTH_BASIS = ("75-87 % of the datasheet bandwidth (a copy kernel reached 1536 of an A100 80GB's 2039 GB/s "
                   "and 785 of a V100's 900 GB/s, AnjaliSandip/FastIceFlo EffectiveMemoryThroughput.md)")
# The thread-block tile of the quantization: the guide's wave example, 256 x 128 tiles, one per SM
# (NVIDIA, "Matrix Multiplication Background User's Guide", Wave Quantization).
GEMM_TILE = (256, 128)
# Host cost per kernel-launching op in eager PyTorch on a GPU (Python, autograd recording, the
# dispatcher, the launch):
#  - 7 us: the simplest autograd-recorded op from Python, 2*x with requires_grad, 1M ops in 6.8 s,
#    before any kernel launch (pytorch/pytorch#41383; "x*x ... approx 2 us" without autograd, half of
#    it Python, per a PyTorch maintainer there);
#  - 37 us: an eager bf16 model on an RTX A6000 with a Xeon E5-2630 v4 host, 52.6 ms per frame
#    against 8.9 ms for the same 1185 kernels replayed from a CUDA graph (facebookresearch/sam2#768).
EAGER_HOST_COST_S = Span(7e-6, 37e-6, "7-37 us per op (pytorch/pytorch#41383: an autograd-recorded op from "
                                      "Python before its launch; facebookresearch/sam2#768: eager vs CUDA graph, "
                                      "1185 kernels)")
# Under torch.compile with CUDA graphs ("reduce-overhead") the per-op host cost goes; what is left
# per kernel: 1.1-1.3 us for a small add replayed in a CUDA graph (pytorch/pytorch#161104), up to
# 3.8 us for kernels launched back to back with no framework in between (NVIDIA, A. Gray, "Getting
# Started with CUDA Graphs", V100).
COMPILED_HOST_COST_S = Span(1.1e-6, 3.8e-6, "1.1-3.8 us per kernel (pytorch/pytorch#161104: replayed in a CUDA "
                                            "graph; NVIDIA 'Getting Started with CUDA Graphs': launched back to back)")
COMPILED_NOTE = ("compiled: the per-op host cost is a CUDA graph's per-kernel cost; Inductor's fusion of pointwise "
                 "ops (fewer kernels, less memory traffic) is not modelled, so this is the eager op count's bound")


def gpu_device(spec, precision: str, compiled: bool = False) -> DeviceModel:
    """A datasheet GPU (`topoprof.model.compute.datasheet.GpuSpec`) at `precision`, eager or compiled."""

    peak = spec.peak_tflops(precision)
    if peak is None:
        raise InputError(f"{spec.name} has no {precision} tensor cores; choose another precision")
    bw = spec.memory_bandwidth_gbps * 1e9
    host = COMPILED_HOST_COST_S if compiled else EAGER_HOST_COST_S
    return DeviceModel(
        name=f"{spec.name} ({precision}, {'compiled' if compiled else 'eager'})",
        peak_flops=peak * 1e12, peak_basis=f"{spec.name} {precision} dense {peak:g} TFLOP/s: {spec.source}",
        bandwidth=Span(bw * BANDWIDTH_SHARE[0], bw * BANDWIDTH_SHARE[1],
                       f"{spec.memory_bandwidth_gbps:g} GB/s x {BANDWIDTH_BASIS}"),
        gemm_efficiency=GEMM_EFFICIENCY, attention_efficiency=ATTENTION_EFFICIENCY,
        host_cost={"forward": host, "backward": host}, asynchronous=True,
        sms=SM_COUNT.get(spec.name), tile=GEMM_TILE,
        notes=(COMPILED_NOTE,) if compiled else ())


def measured_device(costs: dict, name: str = "this CPU") -> DeviceModel:
    """A device whose figures were measured (`probes/device_costs.py`): every range is one number,
    and its ops run inline on the host (a CPU)."""
    how = costs.get("how", {})
    one = lambda key: measured(costs[key], how.get(key, "measured"))  # noqa: E731
    return DeviceModel(
        name=name, peak_flops=costs["peak_flops"], peak_basis=how.get("peak_flops", "measured"),
        bandwidth=one("bandwidth_bps"),
        gemm_efficiency=measured(1.0, "the peak is itself a large matmul's rate"),
        attention_efficiency=measured(1.0, "as a matmul: no figure for a CPU's fused attention"),
        host_cost={"forward": one("host_forward_s"), "backward": one("host_backward_s")},
        host_cost_by_kind={"aten.convolution": {"forward": one("host_conv_forward_s"),
                                                "backward": one("host_conv_backward_s")}}
        if "host_conv_forward_s" in costs else {},
        asynchronous=False, fresh_page_s_per_byte=costs.get("fresh_page_s_per_byte", 0.0),
        fresh_page_min_bytes=int(costs.get("fresh_page_min_bytes", 0)))


# ---- pricing the trace ------------------------------------------------------------------------

_ATTENTION_PREFIX = "aten._scaled_dot_product_"
_CONV = ("aten.convolution", "aten._convolution", "aten.convolution_backward", "aten.cudnn_convolution")


def gemm_dims(op: dict) -> tuple[int, int, int] | None:
    """(M, N, batch) of a GEMM-like op from its input shapes, or None. A convolution is its
    implicit GEMM per group: M = images x output pixels, N = output channels per group, batch =
    groups (forward: M from its FLOPs, 2 M N K per group with K = weight's C_in/groups x kernel)."""
    shapes, flops, name = op.get("shapes") or [], op["flops"], op["name"]
    mats = [s for s in shapes if len(s) >= 2]
    if name.startswith(("aten.mm.", "aten.addmm.")) and len(mats) >= 2:
        return mats[-2][-2], mats[-1][-1], 1
    if name.startswith(("aten.bmm.", "aten.baddbmm.")) and len(mats) >= 2:
        a, b = mats[-2], mats[-1]
        return a[-2], b[-1], math.prod(a[:-2]) or 1
    if name.startswith(_CONV) and len(shapes) >= 2:
        backward = name.startswith("aten.convolution_backward")
        if backward and len(shapes) < 3:
            return None
        data, weight = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])
        if len(weight) < 3 or len(data) < 3 or weight[1] <= 0:
            return None
        groups = max(1, data[1] // weight[1])
        n, k = weight[0] // groups, math.prod(weight[1:])
        m = math.prod(shapes[0]) // max(1, weight[0]) if backward else flops // max(1, 2 * weight[0] * k)
        return max(1, m), max(1, n), groups
    return None


def quantization(m: int, n: int, batch: int, sms: int | None, tile: tuple[int, int]) -> float:
    """Tile x wave quantization efficiency of an M x N output (NVIDIA's matmul guide); 1 without SMs."""
    if sms is None:
        return 1.0
    tm, tn = tile
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tile_eff = (m * n) / (tiles_m * tm * tiles_n * tn)
    waves = tiles_m * tiles_n * batch / sms
    return tile_eff * waves / math.ceil(waves)


def _device_s(op: dict, dev: DeviceModel, end: str) -> tuple[float, str]:
    """An op's device time at one end, and its kind ("matmul", "attention" or "memory")."""
    flops = op["flops"]
    moved = op["bytes_read"] + op["bytes_written"]
    memory = moved / dev.bandwidth.at(end, fast_is_high=True)
    kind = "memory"
    compute = 0.0
    if flops > 0:
        if op["name"].startswith(_ATTENTION_PREFIX):
            kind = "attention"
            eff = dev.attention_efficiency.at(end, fast_is_high=True)
            flops = flops / 2 if op.get("causal") else flops
        else:
            kind = "matmul"
            eff = dev.gemm_efficiency.at(end, fast_is_high=True)
            dims = gemm_dims(op)
            if dims is not None and end != "fast":
                q = quantization(*dims, dev.sms, dev.tile)
                eff *= q if end == "slow" else math.sqrt(q)
        compute = flops / (dev.peak_flops * eff)
    overlapped, serial = max(compute, memory), compute + memory
    t = overlapped if end == "fast" else serial if end == "slow" else math.sqrt(overlapped * serial)
    if dev.fresh_page_s_per_byte and not op.get("inplace"):
        t += sum(b for b in op.get("outputs", ()) if b >= dev.fresh_page_min_bytes) * dev.fresh_page_s_per_byte
    return t, kind


def _host_cost(op: dict, dev: DeviceModel) -> Span:
    for prefix, by_phase in dev.host_cost_by_kind.items():
        if op["name"].startswith(prefix):
            return by_phase[op["phase"]]
    return dev.host_cost[op["phase"]]


@dataclass(frozen=True)
class EndTimes:
    seconds: float
    forward_s: float
    host_s: float                     # host cost summed
    device_s: float                   # device time summed
    by_kind: dict[str, float]         # device time by kind


def price(trace: dict, dev: DeviceModel, end: str) -> EndTimes:
    """One end of the range: every op priced, composed as the device runs them."""
    host_clock = device_end = 0.0
    forward_end = 0.0
    host_sum = device_sum = 0.0
    by_kind = {"matmul": 0.0, "attention": 0.0, "memory": 0.0}
    for op in trace["ops"]:
        if op["view"]:
            continue
        t, kind = _device_s(op, dev, end)
        h = _host_cost(op, dev).at(end, fast_is_high=False)
        by_kind[kind] += t
        host_sum, device_sum = host_sum + h, device_sum + t
        if dev.asynchronous:  # the host issues op i, the device runs it after op i-1
            host_clock += h
            device_end = max(host_clock, device_end) + t
        else:                 # inline: the host's cost, then the op
            device_end += h + t
        if op["phase"] == "forward":
            forward_end = device_end
    return EndTimes(device_end, forward_end, host_sum, device_sum, by_kind)


@dataclass(frozen=True)
class Roofline:
    """The compute per micro-batch (forward + backward) at the fast end, middle and slow end."""

    seconds: tuple[float, float, float]   # (fast, middle, slow)
    backward_fraction: float              # at the middle
    kernels: int                          # ops that launch a kernel
    views: int
    flops: int
    bytes_moved: int
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


def roofline(trace: dict, dev: DeviceModel) -> Roofline:
    """The compute range of one traced forward + backward on `dev`."""
    if not trace.get("ops"):
        raise InputError("the op trace has no ops to price")
    ends = {end: price(trace, dev, end) for end in ENDS}
    mid = ends["middle"]
    kernels = sum(1 for op in trace["ops"] if not op["view"])
    basis = (f"peak {dev.peak_flops / 1e12:.4g} TFLOP/s: {dev.peak_basis}",
             f"memory {dev.bandwidth.text(1e-9, ' GB/s')}: {dev.bandwidth.basis}",
             f"GEMM {dev.gemm_efficiency.text(100, ' %')} of peak: {dev.gemm_efficiency.basis}"
             + (f"; at the slow end x tile and wave quantization ({dev.tile[0]}x{dev.tile[1]} tiles over "
                f"{dev.sms} SMs, NVIDIA's Matrix Multiplication Background guide)" if dev.sms else ""),
             f"attention {dev.attention_efficiency.text(100, ' %')} of peak: {dev.attention_efficiency.basis}; "
             "causal counts half (FlashAttention-2 §4.1)",
             f"host cost per op forward {dev.host_cost['forward'].text(1e6, ' us')}, backward "
             f"{dev.host_cost['backward'].text(1e6, ' us')}: {dev.host_cost['forward'].basis}",
             *(f"host cost per {prefix} op forward {by['forward'].text(1e6, ' us')}, backward "
               f"{by['backward'].text(1e6, ' us')}: {by['forward'].basis}" for prefix, by in dev.host_cost_by_kind.items()),
             "per op max(compute, memory) at the fast end, their sum at the slow end; "
             + ("kernels queue behind the host (a GPU stream)" if dev.asynchronous else "ops run inline on the host"))
    return Roofline((ends["fast"].seconds, mid.seconds, ends["slow"].seconds),
                    1 - mid.forward_s / mid.seconds if mid.seconds > 0 else 2 / 3,
                    kernels, len(trace["ops"]) - kernels, sum(op["flops"] for op in trace["ops"]),
                    sum(op["bytes_read"] + op["bytes_written"] for op in trace["ops"]), mid, dev.name,
                    basis, dev.notes)
