"""FSDP2's strategies as the tool names them, and what each sets in `fully_shard`: the CLI side
prices them (`topoprof.model.fsdp`), the rank side runs them (`topoprof.probes.ranks.fsdp`)."""
from __future__ import annotations

from dataclasses import dataclass

FSDP_STRATEGIES = ("fsdp_full_shard", "fsdp_full_shard_no_sync", "fsdp_shard_grad_op",
                   "fsdp_shard_grad_op_no_sync", "hsdp", "hsdp_no_sync")

# The ones one node can run (HSDP needs replicas across nodes).
FSDP_ONE_NODE = FSDP_STRATEGIES[:4]

HSDP_ONE_NODE_REASON = ("HSDP shards inside a node and replicates across nodes: one node has nothing to "
                        "replicate across (see fsdp_full_shard)")



@dataclass(frozen=True)
class FsdpMode:
    reshard_after_forward: bool
    no_sync: bool
    hsdp: bool


MODES = {
    "fsdp_full_shard": FsdpMode(True, False, False),
    "fsdp_full_shard_no_sync": FsdpMode(True, True, False),
    "fsdp_shard_grad_op": FsdpMode(False, False, False),
    "fsdp_shard_grad_op_no_sync": FsdpMode(False, True, False),
    "hsdp": FsdpMode(True, False, True),
    "hsdp_no_sync": FsdpMode(True, True, True),
}
