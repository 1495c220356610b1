"""The terms every pricing of an op trace shares (`topoprof.model.compute.roofline`, `profiled`,
`host_costs`, `fusion`): a cited range (`Span`) and its ends, the host costs per op cited for
eager PyTorch and for CUDA graphs, and a GEMM's dimensions and quantization by NVIDIA's matmul
guide. No torch here."""
from __future__ import annotations

import math
from dataclasses import dataclass

from topoprof.errors import InputError

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
        return f"{num(lo)}{unit}" if lo == hi else f"{num(lo)}-{num(hi)}{unit}"


def num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def measured(value: float, basis: str) -> Span:
    return Span(value, value, basis)



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
# What a copy kernel reaches of the datasheet's memory bandwidth, wherever a copy or a
# memory-bound kernel is priced from the datasheet (the roofline's memory-bound ops, DDP's bucket
# copies, FSDP's all-gather and reduce-scatter copies): 1536 of an A100 SXM4 80GB's 2039 GB/s and
# 785 of a V100 SXM2's 900 (github.com/AnjaliSandip/FastIceFlo, output/EffectiveMemoryThroughput.md),
# 3,521 GB/s at 32 MB and 4,126 at 256 MB of an H200's 4,800 (measured on an NVIDIA H200 SXM, torch
# 2.11, 2026-11-26: shared/gpu-facts, "copy"). A copy of a few MB reaches far less (532 GB/s at 2 MB
# there): for the small buffers of a small model the low end is still optimistic.
COPY_BANDWIDTH_SHARE = (3521 / 4800, 785 / 900)
COPY_BANDWIDTH_BASIS = ("73-87 % of the datasheet bandwidth (a copy kernel: 1536 of an A100 80GB's 2039 GB/s and 785 "
                        "of a V100's 900, AnjaliSandip/FastIceFlo EffectiveMemoryThroughput.md; 3521 and 4126 of an "
                        "H200's 4800 at 32 and 256 MB, shared/gpu-facts)")
# The thread-block tile of the quantization: the guide's wave example, 256 x 128 tiles, one per SM
# (NVIDIA, "Matrix Multiplication Background User's Guide", Wave Quantization).
GEMM_TILE = (256, 128)
# The convolutions an op trace holds, by their aten names (op_kinds reads them by these too)
CONV_FORWARD = ("convolution", "_convolution", "cudnn_convolution")
CONV_BACKWARD = ("convolution_backward",)
_CONV = tuple(f"aten.{name}" for name in CONV_FORWARD + CONV_BACKWARD)


def quantization(m: int, n: int, batch: int, sms: int | None, tile: tuple[int, int]) -> float:
    """Tile x wave quantization efficiency of an M x N output (NVIDIA's matmul guide); 1 without SMs."""
    if sms is None:
        return 1.0
    tm, tn = tile
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tile_eff = (m * n) / (tiles_m * tm * tiles_n * tn)
    waves = tiles_m * tiles_n * batch / sms
    return tile_eff * waves / math.ceil(waves)
