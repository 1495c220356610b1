"""The records a device profile (`topoprof.model.compute.profile`) is made of: the machine, and
one measured point per GEMM shape, memory-bound op size and attention case. No torch here."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Machine:
    kind: str                         # "cuda" or "cpu"
    device: str                       # the GPU's name (torch.cuda.get_device_name) or the CPU's model
    sm_count: int | None = None
    memory_bytes: int | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    python: str | None = None
    cpu_model: str | None = None
    threads: int | None = None
    hostname: str | None = None
    created_utc: str | None = None
    missing: dict[str, str] = field(default_factory=dict)   # field -> why it is None


@dataclass(frozen=True)
class GemmPoint:
    m: int
    n: int
    k: int
    dtype: str
    seconds: float
    flops_per_s: float


@dataclass(frozen=True)
class MemoryPoint:
    kind: str
    dtype: str
    tensor_bytes: int                 # the input tensor's size
    bytes_moved: int                  # bytes read + written per call
    seconds: float
    bytes_per_s: float


@dataclass(frozen=True)
class SdpaPoint:
    seq: int
    head_dim: int
    causal: bool
    batch: int
    heads: int
    dtype: str
    seconds: float
    flops_per_s: float


@dataclass(frozen=True)
class OptimizerRate:
    name: str
    params: int
    bytes_per_step: int
    seconds: float
    bytes_per_s: float


@dataclass(frozen=True)
class FreshPages:
    fresh_page_s_per_byte: float
    fresh_page_min_bytes: int
    how: str


@dataclass(frozen=True)
class Skipped:
    section: str
    what: str
    reason: str
