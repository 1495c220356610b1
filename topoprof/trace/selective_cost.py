"""What selective op activation checkpointing adds to the host's cost of each op, measured on this
machine beside the meta-device trace (`topoprof/trace/op_trace.py`, its worker): `op` mode
(`topoprof/zoo/checkpoint_wrap.py`) runs every op of a checkpointed block's forward through a
TorchDispatchMode that asks the policy and stores or marks the op's output, and every op of its
recompute through another that looks it up (torch/utils/checkpoint.py,
`_CachingTorchDispatchMode` and `_CachedTorchDispatchMode`): Python per op, on top of the
dispatcher and autograd.

The ratio is the time per op under those modes over the time per plain autograd-recorded op: the
same op (`torch.mul` of 64 floats, one input a leaf that requires grad) the device profile's
`autograd_forward` host cost times (`probes/device_profile/sections.py`), issued back to back,
the plain and the checkpointed calls in alternating rounds; each side's time is its fastest round,
the one the machine's other work disturbed least (as the device profile picks a CPU's blocks). Check
it by hand with `python -m cProfile` around a block checkpointed by `op` mode.

Outputs that must not depend on the machine that prints them (the kept golden outputs, the
documented examples) state the ratio instead: `STATED_RATIO_ENV` set to a number replaces the
measurement, and the basis says it was stated.
"""
from __future__ import annotations

import os
import time

import torch

from topoprof.specs.traced_pass import SelectiveCheckpointCost
from topoprof.zoo.checkpoint_wrap import OPS_PER_BLOCK, run_under_selective_op

ROUNDS = 7
BLOCKS = 2          # blocks per round: 256 ops, a few ms; the whole measurement about 50 ms
KIND = "selective_checkpoint_op"
WHAT = (f"torch.mul of 64 floats recorded by autograd under op mode's forward and recompute modes, "
        f"{OPS_PER_BLOCK} ops per block, fresh contexts per block")


STATED_RATIO_ENV = "TOPOPROF_SELECTIVE_CHECKPOINT_RATIO"


def selective_checkpoint_cost() -> SelectiveCheckpointCost:
    """As `STATED_RATIO_ENV` states it, else measured here."""
    stated = os.environ.get(STATED_RATIO_ENV)
    if stated:
        return SelectiveCheckpointCost(float(stated), f"stated by {STATED_RATIO_ENV}={stated}, not measured")
    return selective_checkpoint_ratio()


def selective_checkpoint_ratio() -> SelectiveCheckpointCost:
    """The cost measured on this machine's CPU."""
    x, w = torch.randn(64), torch.randn(64, requires_grad=True)

    def op():
        return torch.mul(w, x)

    with torch.enable_grad():
        run_under_selective_op(op, 1)  # warm-up: the modes' first call imports and caches
        plain, under = [], []
        for _ in range(ROUNDS):
            calls = 2 * OPS_PER_BLOCK * BLOCKS
            t0 = time.perf_counter()
            for _ in range(calls):
                op()
            plain.append((time.perf_counter() - t0) / calls)
            t0 = time.perf_counter()
            ops = run_under_selective_op(op, BLOCKS)
            under.append((time.perf_counter() - t0) / ops)
    per_op, recorded = min(under), min(plain)
    how = (f"measured here: {WHAT}, {per_op * 1e6:.3g} us over {recorded * 1e6:.3g} us per plain recorded op "
           f"(torch {torch.__version__}, this machine's CPU)")
    return SelectiveCheckpointCost(per_op / recorded, how, per_op, recorded)
