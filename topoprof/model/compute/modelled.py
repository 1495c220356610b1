"""A micro-batch's compute priced from the model's own ops (`ModelledCompute`, a `Compute`'s
`modelled`), and what the pricing found beside its seconds (`ModelledDetail`): the range and where
it ran, what the whole pass came to where it was priced op by op
(`roofline.Roofline`), the recompute of activation checkpointing priced alone, the pass's memory,
and a device profile's optimizer figures. The JSON echoes it as `inputs.compute_model`
(`ModelledDetail.echoed`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from topoprof.specs.traced_pass import PassMemory


@dataclass(frozen=True)
class OptimizerRates:
    """The optimizer step's figures from a device profile (`profiled.ProfiledPricer.optimizer_rates`):
    the trainable tensors it steps, its rate over the optimizer's bytes and its host cost per
    tensor, each a (low, high) range, and where they come from."""

    tensors: int
    bytes_per_s: tuple[float, float]
    host_per_tensor_s: tuple[float, float]
    basis: str


@dataclass(frozen=True, kw_only=True)
class ModelledDetail:
    """The compute priced from a model's ops: `seconds` at the (fast, middle, slow) ends, on
    `device`, for a pass at `shape`, with its `summary`, `basis` and `notes`. A pass priced op by op
    also says what it came to at the middle (its kernels and views, FLOPs, bytes, the backward's
    share, host and device seconds, the device's by kind, whether the host bound it); a pass
    extended from passes at 1 and 2 blocks (`extended`) says none of that. `recompute_s`:
    checkpointing's recompute ops priced alone; `memory`: what the pass held; `optimizer`: a device
    profile's optimizer figures, where it has them. Fields in the order the JSON names them."""

    seconds: tuple[float, float, float]
    device: str
    shape: str
    recompute_s: tuple[float, float, float] | None = None
    kernels: int | None = None
    views: int | None = None
    flops: float | None = None
    bytes_moved: float | None = None
    backward_fraction: float | None = None
    host_s: float | None = None
    device_s: float | None = None
    device_s_by_kind: dict[str, float] | None = None
    host_bound: bool | None = None
    summary: str
    basis: tuple[str, ...]
    notes: tuple[str, ...] = ()
    memory: PassMemory | None = None
    optimizer: OptimizerRates | None = None

    def echoed(self) -> dict:
        """As `inputs.compute_model` shows it: every field known, in order."""
        return {f.name: value for f in dataclasses.fields(self) if (value := getattr(self, f.name)) is not None}

    @property
    def recomputed_middle_s(self) -> float:
        """The recompute's seconds at the middle of the range; 0 where nothing is recomputed."""
        return self.recompute_s[1] if self.recompute_s else 0.0


@dataclass(frozen=True)
class ModelledCompute:
    """A micro-batch's forward+backward priced from the model's own ops (`traced.modelled_compute`,
    or extended from passes at 1 and 2 blocks, `extended`): `seconds` at the (fast, middle, slow)
    ends of its cited ranges, with their `basis`, the backward's share of the middle, and what the
    pricing found (`detail`)."""

    seconds: tuple[float, float, float]
    basis: str
    backward_fraction: float | None
    detail: ModelledDetail

    @property
    def middle_s(self) -> float:
        return self.seconds[1]
