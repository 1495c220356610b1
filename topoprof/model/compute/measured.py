"""A model's compute as timed on a GPU (`MeasuredCompute`): the medians of its repeats, or, for a
model too large to train on one GPU, its repeated blocks timed: the same architecture
built at two small depths, each timed, and every measured time extended linearly in the block
count. A step of a block stack is the embedding and head (the intercept) plus one block's time
per block (the slope); the optimizer's time is linear in the parameters the same way.
`tests/benchmarks/bench_scaled_timing.py` compares this with timing a whole model that fits.
"""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.errors import InputError
from topoprof.specs.messages import StepMemory


@dataclass(frozen=True)
class MeasuredCompute:
    """One model's forward+backward per micro-batch, the backward's share of it and the optimizer
    step, seconds, as timed on `device_name` (whose memory CUDA reported as `device_memory_bytes`);
    `source` says how. `memory`: one GPU's memory over the step, where the whole model was timed;
    `scaled`: the two depths timed where it was extended from its blocks instead."""

    micro_batch_time_s: float
    backward_fraction: float
    optimizer_time_s: float
    source: str
    device_name: str | None = None
    device_memory_bytes: int | None = None
    memory: StepMemory | None = None
    scaled: tuple[int, int] | None = None


def extend(depths: tuple[int, int], times: tuple[float, float], depth: int) -> float:
    """t(depth) from t at two depths: intercept + depth x slope."""
    (a, b), (ta, tb) = depths, times
    if not 0 < a < b:
        raise InputError(f"scaled timing needs two increasing depths, got {depths}")
    slope = (tb - ta) / (b - a)
    return ta + (depth - a) * slope


def scaled_compute(shallow: MeasuredCompute, deep: MeasuredCompute, depths: tuple[int, int],
                   depth: int) -> MeasuredCompute:
    """The compute timed at each of `depths` blocks extended to `depth` blocks; no memory (the
    whole model was not run)."""
    def at(value):
        return extend(depths, (value(shallow), value(deep)), depth)

    total = at(lambda c: c.micro_batch_time_s)
    backward = at(lambda c: c.micro_batch_time_s * c.backward_fraction)
    return MeasuredCompute(total, backward / total, at(lambda c: c.optimizer_time_s),
                           f"timed at {depths[0]} and {depths[1]} blocks and extended linearly to {depth} "
                           f"(the whole model does not fit): {shallow.source.split(': ', 1)[-1]}",
                           shallow.device_name, shallow.device_memory_bytes, scaled=depths)
