"""What `topoprof.model.strategies.predict.predict` and its what-if helpers return: plain frozen dataclasses,
so `dataclasses.asdict` (or `topoprof.jsonio.to_jsonable`) of any of them is the JSON."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """Values at the two ends of a communication input's range (slow link -> high time)."""

    step_time_s: tuple[float, float]
    comm_exposed_s: tuple[float, float]
    samples_per_s: tuple[float, float]


@dataclass(frozen=True)
class StrategyResult:
    step_time_s: float
    comm_exposed_s: float  # communication not hidden behind compute, per optimizer step
    samples_per_step: int  # micro_batch_size x k x world_size (single: x k only)
    samples_per_s: float
    # samples_per_s / ddp_synced's samples_per_s (per sample); None where ddp_synced does
    # not apply (one GPU)
    speedup_vs_ddp_synced: float | None
    range: Range | None
    formula: str
    memory: Memory | None = None


@dataclass(frozen=True)
class Memory:
    """One GPU's memory under a strategy, in GB (1e9 B), part by part (topoprof.model.memory.holding)."""

    parts_gb: dict[str, float | None]  # every part by name (topoprof.model.memory.holding.parts)
    total_gb: float                    # the top of range_gb; without activations when they are unknown
    basis: str                         # "counted" or where it was measured
    gpu_memory_gb: float | None
    fits: bool | None                  # None: the GPU's memory is unknown, or only the range's top does not fit
    reason: str | None                 # why not, with the arithmetic (or what is unknown)
    range_gb: tuple[float, float] | None = None  # the environment's parts at the ends of their ranges
    sources: dict[str, str] = field(default_factory=dict)  # where each part beyond the states comes from
    peak_gb: float | None = None       # the allocated peak the step reaches (topoprof.model.memory.holding.Peak)
    peak_at: str = ""                  # where it falls: phase, micro-batch, block, op
    reserved_gb: tuple[float, float] | None = None  # the peak and the caching allocator's reserve above it
    peak_parts_gb: dict[str, float] = field(default_factory=dict)  # what the step holds at its peak, by part


@dataclass(frozen=True)
class Unavailable:
    reason: str


@dataclass(frozen=True)
class BucketSummary:
    count: int
    sizes_bytes: tuple[int, ...]  # in launch (gradient-ready) order
    ready_fractions: tuple[float, ...]  # share of backward done when each is ready
    first_bucket_cap_bytes: int
    bucket_cap_bytes: int


@dataclass(frozen=True)
class InputValue:
    value: Any
    source: str


@dataclass(frozen=True)
class Prediction:
    strategies: dict[str, StrategyResult | Unavailable]
    per_micro_batch: dict[str, float]  # c, T_bwd, T_opt; E, E_fp16 and DP comm where they apply
    inputs: dict[str, InputValue]
    buckets: BucketSummary
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    # what DDP adds per synced micro-batch, part by part (`strategies.DDP_COST_PARTS`); empty on one GPU
    ddp_costs: dict[str, PartCost] = field(default_factory=dict)
    # what FSDP adds per synced micro-batch of fsdp_full_shard (`fsdp_costs.FSDP_COST_PARTS`); empty
    # where it does not apply
    fsdp_costs: dict[str, PartCost] = field(default_factory=dict)
    hsdp: HsdpLevels | None = None  # HSDP's levels, where it applies (several nodes)
    hide_threshold: HideThreshold | Unavailable | None = None  # None: not asked for (no parts)


@dataclass(frozen=True)
class PartCost:
    """One part of what DDP or FSDP adds to a synced micro-batch, with its what-if range when it
    has one."""

    seconds: float
    range_s: tuple[float, float] | None  # (fast end, slow end)
    scales_with: str
    source: str


def part_costs(middle: dict[str, float], slow: dict[str, float], fast: dict[str, float],
               described: dict[str, tuple[str, str]]) -> dict[str, PartCost]:
    """Each part at the what-if's middle, with its (fast, slow) range where the ends differ;
    `described`: each part's (scales_with, source)."""
    out = {}
    for name, value in middle.items():
        lo, hi = sorted((fast[name], slow[name]))
        out[name] = PartCost(value, None if hi - lo <= 1e-12 * max(1.0, hi) else (lo, hi), *described[name])
    return out


@dataclass(frozen=True)
class HsdpLevels:
    """HSDP's collectives per synced micro-batch at each level, alone, and what stays exposed."""

    shard_gpus: int                       # the shard group: the GPUs of a node
    shard_bus_bandwidth_gbps: float | None  # None: one GPU per node, no link inside it
    replicas: int                         # the replicate group: one rank per node
    replicate_bus_bandwidth_gbps: float   # the node's NICs together, which its shard ranks' all-reduces share
    all_gather_s: float
    reduce_scatter_s: float
    all_reduce_s: float
    all_reduces: int
    exposed_s: float                      # the compute stream waiting for any of them
    formula: str


@dataclass(frozen=True)
class SweepPoint:
    nodes: int
    gpus_per_node: int
    world_size: int
    accumulation_steps: int
    strategies: dict[str, StrategyResult | Unavailable]


@dataclass(frozen=True)
class HideThreshold:
    """DDP's exposed communication E falls as compute per micro-batch c grows, down to a floor:
    the buckets ready only at the end of backward, the slowdown on the rest, and the copies.
    `threshold_micro_batch_time_s` is the smallest c at which E reaches that floor."""

    micro_batch_time_s: float
    exposed_s: float
    exposed_floor_s: float
    threshold_micro_batch_time_s: float
    hidden: bool  # the current c is at or above the threshold


@dataclass(frozen=True)
class GlobalBatchOption:
    nodes: int
    gpus_per_node: int
    world_size: int
    accumulation_steps: int | None
    step_time_s: float | None
    samples_per_s: float | None
    samples_per_s_per_gpu: float | None
    reason: str | None = None
    strategy: str | None = None  # the one predicted: `single` on one GPU, where DDP does not apply
