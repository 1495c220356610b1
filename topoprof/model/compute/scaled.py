"""A model too large to train on one GPU, timed by its repeated blocks: the same architecture
built at two small depths, each timed, and every measured time extended linearly in the block
count. A step of a block stack is the embedding and head (the intercept) plus one block's time
per block (the slope); the optimizer's time is linear in the parameters the same way.
`tests/benchmarks/bench_scaled_timing.py` compares this with timing a whole model that fits.
"""
from __future__ import annotations

from topoprof.errors import InputError


def extend(depths: tuple[int, int], times: tuple[float, float], depth: int) -> float:
    """t(depth) from t at two depths: intercept + depth x slope."""
    (a, b), (ta, tb) = depths, times
    if not 0 < a < b:
        raise InputError(f"scaled timing needs two increasing depths, got {depths}")
    slope = (tb - ta) / (b - a)
    return ta + (depth - a) * slope


def scaled_compute(shallow: dict, deep: dict, depths: tuple[int, int], depth: int) -> dict:
    """The compute inputs (`user_model.user_compute` of each depth) extended to `depth` blocks."""
    def at(key_fn):
        return extend(depths, (key_fn(shallow), key_fn(deep)), depth)

    total = at(lambda c: c["micro_batch_time_s"])
    backward = at(lambda c: c["micro_batch_time_s"] * c["backward_fraction"])
    return {"micro_batch_time_s": total, "backward_fraction": backward / total,
            "optimizer_time_s": at(lambda c: c["optimizer_time_s"]),
            "source": f"timed at {depths[0]} and {depths[1]} blocks and extended linearly to {depth} "
                      f"(the whole model does not fit): {shallow['source'].split(': ', 1)[-1]}",
            "device_name": shallow.get("device_name"), "device_memory_bytes": shallow.get("device_memory_bytes")}
