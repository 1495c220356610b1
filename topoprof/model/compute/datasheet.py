"""GPUs by their datasheets: peak arithmetic, memory bandwidth and size, compute capability and
streaming multiprocessors, keyed by a normalized name.

One table keyed by a normalized name; `lookup_gpu` maps what `nvidia-smi --query-gpu=name`
prints (or a short name a user types) to a row. An unknown or ambiguous name gives `None` and a
warning, never a borrowed number.

Figures are *dense* (no structured sparsity): where a datasheet prints only the "with sparsity"
tensor figure (marked * on the sheet), the dense figure is half of it, as the sheet's footnote
says. GeForce cards are listed with FP32 accumulate, which mixed-precision training uses
(torch.autocast matmuls accumulate in FP32); their FP16-accumulate figure is twice as high.
TFLOP/s = 1e12 FLOP/s; GB/s = 1e9 B/s.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. `None` where the hardware has no such unit (V100/T4 have no BF16)."""

    name: str
    bf16_tensor_tflops: float | None
    fp16_tensor_tflops: float | None
    fp32_tflops: float
    memory_bandwidth_gbps: float
    source: str
    compute_capability: tuple[int, int] | None = None  # (major, minor), `_COMPUTE_CAPABILITY`
    pcie: tuple[int, int] | None = None                # (generation, lanes) of its host link, `_PCIE`

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak for the training precision: bf16/fp16 tensor cores, or plain FP32."""
        return {
            "bf16": self.bf16_tensor_tflops,
            "fp16": self.fp16_tensor_tflops,
            "fp32": self.fp32_tflops,
        }[precision]


_V100_SHEET = ("NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/"
               "volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")

_A100_SHEET = ("NVIDIA A100 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
               "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")

_H100_SHEET = ("NVIDIA H100 datasheet (BF16/FP16 printed with sparsity; dense = half), "
               "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")

_H200_PAGE = ("NVIDIA H200 product page/datasheet (BF16/FP16 printed with sparsity; dense = half), "
              "https://www.nvidia.com/en-us/data-center/h200/")

# name: (bf16 dense TFLOP/s, fp16 dense TFLOP/s, fp32 TFLOP/s, memory GB/s, source)
_TABLE: dict[str, tuple[float | None, float | None, float, float, str]] = {
    # V100: "Tensor Performance" 125 (SXM2) / 112 (PCIe) TFLOPS fp16; no bf16; HBM2 900 GB/s.
    "v100-sxm2": (None, 125.0, 15.7, 900.0, _V100_SHEET),
    "v100-pcie": (None, 112.0, 14.0, 900.0, _V100_SHEET),
    # A100: BF16/FP16 tensor 312 dense; FP32 19.5; 40GB 1,555 GB/s, 80GB SXM 2,039, 80GB PCIe 1,935.
    "a100-sxm4-40gb": (312.0, 312.0, 19.5, 1555.0, _A100_SHEET),
    "a100-sxm4-80gb": (312.0, 312.0, 19.5, 2039.0, _A100_SHEET),
    "a100-pcie-40gb": (312.0, 312.0, 19.5, 1555.0, _A100_SHEET),
    "a100-pcie-80gb": (312.0, 312.0, 19.5, 1935.0, _A100_SHEET),
    # H100 SXM: BF16 1,979* -> 989.5 dense; FP32 67; 3.35 TB/s. PCIe: 1,513* -> 756.5; 51; 2 TB/s.
    "h100-sxm": (989.5, 989.5, 67.0, 3350.0, _H100_SHEET),
    "h100-pcie": (756.5, 756.5, 51.0, 2000.0, _H100_SHEET),
    # H100 NVL: BF16 1,671* -> 835.5 dense; FP32 60; 3.9 TB/s.
    "h100-nvl": (835.5, 835.5, 60.0, 3900.0, _H100_SHEET),
    # H200 SXM: BF16 1,979* -> 989.5 dense; FP32 67; 4.8 TB/s.
    "h200-sxm": (989.5, 989.5, 67.0, 4800.0, _H200_PAGE),
    # H200 NVL: BF16 1,671* -> 835.5 dense; FP32 60; 4.8 TB/s.
    "h200-nvl": (835.5, 835.5, 60.0, 4800.0, _H200_PAGE),
    # L40S: BF16/FP16 tensor 362.05 dense (733* sparse); FP32 91.6; GDDR6 864 GB/s.
    "l40s": (362.05, 362.05, 91.6, 864.0,
             "NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    # A10: BF16/FP16 tensor 125 dense (250*); FP32 31.2; 600 GB/s.
    "a10": (125.0, 125.0, 31.2, 600.0,
            "NVIDIA A10 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
            "Data-Center/a10/pdf/a10-datasheet.pdf"),
    # L4: BF16/FP16 tensor 242* -> 121 dense; FP32 30.3; 300 GB/s.
    "l4": (121.0, 121.0, 30.3, 300.0,
           "NVIDIA L4 datasheet, https://resources.nvidia.com/en-us-data-center-overview/"
           "l4-gpu-datasheet"),
    # T4: "Mixed Precision (FP16/FP32) 65 TFLOPS"; FP32 8.1; "320+ GB/s"; no bf16.
    "t4": (None, 65.0, 8.1, 320.0,
           "NVIDIA T4 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/"
           "Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    # RTX 4090: FP16/BF16 tensor with FP32 accumulate 165.2 dense; FP32 82.6; 1,008 GB/s.
    "rtx-4090": (165.2, 165.2, 82.6, 1008.0,
                 "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A, Table 2 "
                 "(GeForce RTX 4090)"),
    # RTX 3090: FP16/BF16 tensor with FP32 accumulate 71 dense; FP32 35.6; 936 GB/s.
    "rtx-3090": (71.0, 71.0, 35.6, 936.0,
                 "NVIDIA Ampere GA102 GPU Architecture whitepaper v2.0, Table 9 "
                 "(GeForce RTX 3090)"),
}

# CUDA compute capability of each row (NVIDIA, "CUDA GPUs - Compute Capability",
# https://developer.nvidia.com/cuda-gpus): V100 7.0, T4 7.5, A100 8.0, A10 and RTX 30xx 8.6,
# L4, L40S and RTX 40xx 8.9, H100 and H200 9.0. It names the NVLink generation, whose per-link
# rate NCCL keys by it (`topoprof.topology.constants.NVLINK_GBPS_BY_SM`).
_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "v100-sxm2": (7, 0), "v100-pcie": (7, 0),
    "a100-sxm4-40gb": (8, 0), "a100-sxm4-80gb": (8, 0), "a100-pcie-40gb": (8, 0), "a100-pcie-80gb": (8, 0),
    "h100-sxm": (9, 0), "h100-pcie": (9, 0), "h100-nvl": (9, 0),
    "h200-sxm": (9, 0), "h200-nvl": (9, 0),
    "l40s": (8, 9), "a10": (8, 6), "l4": (8, 9), "t4": (7, 5),
    "rtx-4090": (8, 9), "rtx-3090": (8, 6),
}

# The host link of each row, (PCIe generation, lanes), from the same datasheets' "Interconnect" rows:
# V100 and T4 PCIe Gen3 x16 (32 GB/s both directions), A100, A10, L4 and L40S Gen4 x16 (64 GB/s),
# H100 and H200 (SXM, PCIe and NVL) Gen5 x16 (128 GB/s); RTX 4090 and RTX 3090 PCIe 4.0 x16
# (NVIDIA's GeForce specifications pages). An SXM part's host link is PCIe too (the CPU's).
_PCIE: dict[str, tuple[int, int]] = {
    "v100-sxm2": (3, 16), "v100-pcie": (3, 16), "t4": (3, 16),
    "a100-sxm4-40gb": (4, 16), "a100-sxm4-80gb": (4, 16), "a100-pcie-40gb": (4, 16), "a100-pcie-80gb": (4, 16),
    "a10": (4, 16), "l4": (4, 16), "l40s": (4, 16), "rtx-4090": (4, 16), "rtx-3090": (4, 16),
    "h100-sxm": (5, 16), "h100-pcie": (5, 16), "h100-nvl": (5, 16), "h200-sxm": (5, 16), "h200-nvl": (5, 16),
}

# GPU memory per row as the datasheets print it: V100 16 or 32 (the name printed by the driver
# says which; a bare "v100-sxm2" is taken as the smaller), A100 40/80, H100 SXM and PCIe 80, H100
# NVL 94, H200 141, L40S 48, A10 24, L4 24, T4 16, RTX 4090 24, RTX 3090 24. These "GB" are binary
# (GiB): the H200 of reports/gpu-nvidia-h200-20261126, sold as 141 GB, showed 143771 MiB in nvidia-smi
# (140.4 GiB, 150.8e9 B; machine.txt), not 141e9 B. `gpu_memory_gb` gives 1e9 B.
BINARY_GB = 2 ** 30 / 1e9
BINARY_BASIS = "read as GiB, as NVIDIA states memory (an H200's 141 GB showed 143771 MiB)"
_MEMORY_GB: dict[str, float] = {
    "v100-sxm2": 16, "v100-pcie": 16, "a100-sxm4-40gb": 40, "a100-sxm4-80gb": 80, "a100-pcie-40gb": 40,
    "a100-pcie-80gb": 80, "h100-sxm": 80, "h100-pcie": 80, "h100-nvl": 94, "h200-sxm": 141, "h200-nvl": 141,
    "l40s": 48, "a10": 24, "l4": 24, "t4": 16, "rtx-4090": 24, "rtx-3090": 24,
}


# Normalized `nvidia-smi --query-gpu=name` strings (and common short names) -> table key.
# The names are the ones the driver prints, e.g. "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB".
_ALIASES: dict[str, str] = {
    "v100-sxm2-16gb": "v100-sxm2", "v100-sxm2-32gb": "v100-sxm2",
    "v100-pcie-16gb": "v100-pcie", "v100-pcie-32gb": "v100-pcie",
    "a100-pcie-80gb": "a100-pcie-80gb", "a100-80gb-pcie": "a100-pcie-80gb",
    "h100-80gb-hbm3": "h100-sxm", "h100-sxm5-80gb": "h100-sxm",
    "h200": "h200-sxm", "h200-141gb-hbm3e": "h200-sxm",
    "l40-s": "l40s",
}


def normalize_gpu_name(name: str) -> str:
    """'NVIDIA GeForce RTX 4090' -> 'rtx-4090'; 'Tesla V100-SXM2-32GB' -> 'v100-sxm2-32gb'."""
    text = name.strip().lower()
    text = re.sub(r"^(nvidia\s+)?(tesla\s+|geforce\s+)?", "", text)
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def known_gpus() -> tuple[str, ...]:
    return tuple(sorted(_TABLE))


def lookup_gpu(name: str) -> GpuSpec | None:
    """The table row for `name`, or None with a warning (unknown or ambiguous name)."""
    key = normalize_gpu_name(name)
    key = _ALIASES.get(key, key)
    if key in _TABLE:
        return GpuSpec(key, *_TABLE[key], compute_capability=_COMPUTE_CAPABILITY[key], pcie=_PCIE[key])
    candidates = [k for k in _TABLE if k.startswith(key + "-")] if key else []
    if candidates:
        warnings.warn(f"GPU name {name!r} is ambiguous: one of {', '.join(candidates)}",
                      stacklevel=2)
    else:
        warnings.warn(f"GPU {name!r} is not in the datasheet table (known: "
                      f"{', '.join(known_gpus())}); give the figures explicitly", stacklevel=2)
    return None


def lookup_gpu_quietly(name: str | None) -> GpuSpec | None:
    """`lookup_gpu` without its warning: for callers to whom an unknown name is an answer (None),
    not a mistake to report."""
    if not name:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lookup_gpu(name)



@dataclass(frozen=True)
class NamedGpu:
    """A GPU as it was named (by --gpu, a device profile's machine, or CUDA where a model was timed)
    with its datasheet row, looked up once where the name enters; `row` is None where the table
    does not know the name, and `why` then says so as `lookup_gpu` warns. Everything after prices,
    scales, sizes or targets by the row, and writes the name where it speaks of the GPU as the user
    or the driver named it."""

    name: str
    row: GpuSpec | None
    why: str | None = None

    @property
    def capability(self) -> tuple[int, int] | None:
        return self.row.compute_capability if self.row is not None else None

    def same_row(self, other: NamedGpu | None) -> bool:
        """Both names are one datasheet row (an unknown name is no row)."""
        return other is not None and self.row is not None and other.row is not None and self.row.name == other.row.name

    @property
    def memory_gb(self) -> tuple[float, str] | None:
        """(GB, basis): the size in the name when it has one ("Tesla V100-SXM2-32GB"), else the
        datasheet row's; None for an unknown name."""
        if self.row is None:
            return None
        sized = re.search(r"(\d+)gb", normalize_gpu_name(self.name))
        if sized:
            return float(sized.group(1)) * BINARY_GB, f"{sized.group(1)} GB in the name {self.name!r}, {BINARY_BASIS}"
        note = (" (the smaller of its sizes: give the full name, e.g. V100-SXM2-32GB)"
                if self.row.name.startswith("v100") else "")
        size = _MEMORY_GB[self.row.name]
        return size * BINARY_GB, f"{self.row.name} datasheet {size:g} GB{note}, {BINARY_BASIS}"


def named_gpu(name: str | None) -> NamedGpu | None:
    """`name` with its datasheet row (`lookup_gpu`), and its warning kept as `why` where it has
    none; None for no name."""
    if not name:
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        row = lookup_gpu(name)
    return NamedGpu(name, row, None if row is not None else "; ".join(str(w.message) for w in caught) or None)


# Streaming multiprocessors per GPU (NVIDIA architecture whitepapers and datasheets: V100 80,
# A100 108, H100 SXM5 132 / PCIe 114, H100 NVL and H200 132, L40S 142, A10 72, L4 58, T4 40,
# RTX 4090 128, RTX 3090 82), keyed as topoprof.model.compute's datasheet table.
SM_COUNT = {
    "v100-sxm2": 80, "v100-pcie": 80, "a100-sxm4-40gb": 108, "a100-sxm4-80gb": 108,
    "a100-pcie-40gb": 108, "a100-pcie-80gb": 108, "h100-sxm": 132, "h100-pcie": 114,
    "h100-nvl": 132, "h200-sxm": 132, "h200-nvl": 132, "l40s": 142, "a10": 72, "l4": 58,
    "t4": 40, "rtx-4090": 128, "rtx-3090": 82,
}
