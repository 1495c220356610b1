"""A hand-made layout for FSDP's timeline tests: an embedding (root), two blocks of one tensor
each and a head (root), so forward runs root, block 0, block 1, root; over a ring of 2 ranks at
1 GB/s and no latency an all-gather of S bytes takes S / 2e9 seconds."""
from __future__ import annotations

from topoprof.model.comm.collectives import RingComm
from topoprof.model.fsdp.plan import fsdp_plan
from topoprof.workload.layout import Layout, TensorSpec, Use

HAND = Layout("hand", (TensorSpec("emb", (1000,)), TensorSpec("blocks.0.w", (4000,)),
                       TensorSpec("blocks.1.w", (4000,)), TensorSpec("head", (2000,))),
              (Use((0,), 0.0), Use((1,), 4 * 4000.0), Use((2,), 4 * 4000.0), Use((3,), 4 * 2000.0)), "test")
PLAN = fsdp_plan(HAND)
ROOT, B0, B1 = PLAN.root, 0, 1
COMM = RingComm(1.0, 0.0, 2)
