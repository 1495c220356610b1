"""A measured device profile read for another GPU, as a range: each rate times the datasheet
ratios (target / profiled GPU) that could bound it.

Why a range and which ratios: a kernel's rate on the profiled GPU is bound by one of three
things, and the profile does not say which, so each rate is scaled by every ratio that could
apply and the range spans them:
- a shape that fills the GPU with work is bound by its arithmetic (GEMM, attention) or its memory
  traffic (memory-bound ops, the optimizer): it scales by the peak ratio or the bandwidth ratio;
- a shape with fewer thread blocks (tiles) than the GPU has SMs runs on part of the GPU, at the
  speed of one SM: it scales by the per-SM ratio, peak ratio / SM ratio (bandwidth ratio / SM
  ratio for a memory-bound op) - the tile and wave quantization of NVIDIA's "Matrix
  Multiplication Background User's Guide" (§3), seen from the other side;
- a GEMM whose operands are read more often than its arithmetic takes (small k) is memory-bound:
  its range includes the bandwidth ratio too.
Host costs (Python, dispatch, autograd, launch) are the host CPU's, not the GPU's: unchanged
under the assumption of the same class of host CPU, or scaled by a host ratio the caller states;
eager host costs per op spanned 7-37 us across machines (`topoprof.model.roofline`,
EAGER_HOST_COST_S), so a different host is an uncertainty of that size, which this does not guess.
Clock boosts, power limits, L2 size and cuBLAS's choice of kernels per GPU are not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.errors import InputError
from topoprof.model.compute.datasheet import SM_COUNT, NamedGpu
from topoprof.model.compute.profile import PRECISION_OF_DTYPE, DeviceProfile
from topoprof.model.compute.profile_interp import Read


@dataclass(frozen=True)
class Ratios:
    """Target / profiled GPU: datasheet peak at the profile's dtype, memory bandwidth, SM count;
    and the host's cost per op (target / profiled, as a range: (1, 1) for the same host class)."""

    peak: float
    bandwidth: float
    sms: float
    host: tuple[float, float] = (1.0, 1.0)
    basis: str = "ratios given"

    def __post_init__(self) -> None:
        for name, value in (("peak", self.peak), ("bandwidth", self.bandwidth), ("sms", self.sms), *(
                ("host", h) for h in self.host)):
            if not value > 0:
                raise InputError(f"scaling a profile: the {name} ratio must be > 0, got {value}")
        if self.host[0] > self.host[1]:
            raise InputError(f"scaling a profile: host ratio {self.host[0]}..{self.host[1]} needs low <= high")


@dataclass(frozen=True)
class RateRange:
    low: float
    high: float
    basis: str


def _span(value: float, ratios: dict[str, float], source: str) -> RateRange:
    lo, hi = min(ratios.values()), max(ratios.values())
    which = ", ".join(f"{name} x{r:.3g}" for name, r in ratios.items())
    return RateRange(value * lo, value * hi, f"{source}; scaled by {which}")


@dataclass(frozen=True)
class ScaledProfile:
    """Every lookup of `profile` as a range on the target GPU (the module's docstring says why)."""

    profile: DeviceProfile
    ratios: Ratios

    def _compute(self, read: Read) -> RateRange:
        r = self.ratios
        return _span(read.value, {"peak": r.peak, "peak per SM": r.peak / r.sms}, read.basis)

    def _memory(self, read: Read) -> RateRange:
        r = self.ratios
        return _span(read.value, {"bandwidth": r.bandwidth, "bandwidth per SM": r.bandwidth / r.sms}, read.basis)

    def gemm_flops_per_s(self, m: int, n: int, k: int, dtype: str | None = None) -> RateRange:
        r, read = self.ratios, self.profile.gemm_flops_per_s(m, n, k, dtype)
        return _span(read.value, {"peak": r.peak, "peak per SM": r.peak / r.sms, "bandwidth": r.bandwidth}, read.basis)

    def memory_bytes_per_s(self, kind: str, nbytes: int, dtype: str | None = None) -> RateRange:
        return self._memory(self.profile.memory_bytes_per_s(kind, nbytes, dtype))

    def sdpa_flops_per_s(self, seq: int, head_dim: int, causal: bool) -> RateRange:
        return self._compute(self.profile.sdpa_flops_per_s(seq, head_dim, causal))

    def optimizer_bytes_per_s(self) -> RateRange | None:
        read = self.profile.optimizer_bytes_per_s()
        return None if read is None else _span(read.value, {"bandwidth": self.ratios.bandwidth}, read.basis)

    def host_seconds(self, kind: str) -> RateRange | None:
        read = self.profile.host_seconds(kind)
        if read is None:
            return None
        lo, hi = self.ratios.host
        how = ("unchanged: the same class of host CPU assumed (another host moves it by its single-thread "
               "speed, not modelled)") if (lo, hi) == (1.0, 1.0) else f"times the stated host ratio {lo:g}..{hi:g}"
        return RateRange(read.value * lo, read.value * hi, f"{read.basis}; {how}")


def scale_to(profile: DeviceProfile, peak_ratio: float, bandwidth_ratio: float, sm_ratio: float,
             host_ratio: tuple[float, float] = (1.0, 1.0), basis: str = "ratios given") -> ScaledProfile:
    return ScaledProfile(profile, Ratios(peak_ratio, bandwidth_ratio, sm_ratio, host_ratio, basis))


def datasheet_ratios(profile: DeviceProfile, target: NamedGpu) -> Ratios:
    """Target / profiled GPU from the datasheet rows (`topoprof.model.compute.datasheet`) and the SM counts
    (`topoprof.model.compute.datasheet.SM_COUNT`), at the profile's dtype; InputError where either GPU or a
    figure is not in the tables (never a borrowed number)."""
    precision = PRECISION_OF_DTYPE.get(profile.dtype)
    specs, peaks = [], []
    for gpu in (profile.gpu, target):
        spec = gpu.row
        peak = spec.peak_tflops(precision) if spec is not None and precision is not None else None
        if spec is None or peak is None or spec.name not in SM_COUNT:
            raise InputError(f"GPU {gpu.name!r}: no datasheet peak at {profile.dtype}, bandwidth and SM count to scale "
                             "a profile by")
        specs.append(spec)
        peaks.append(peak)
    src, dst = specs
    return Ratios(peak=peaks[1] / peaks[0],
                  bandwidth=dst.memory_bandwidth_gbps / src.memory_bandwidth_gbps,
                  sms=SM_COUNT[dst.name] / SM_COUNT[src.name],
                  basis=f"{dst.name} / {src.name}: datasheet {precision} peak, memory bandwidth and SM count")
