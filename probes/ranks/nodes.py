"""Rank worker: every node probes its own topology; rank 0 receives them all.

The first rank on each host (LOCAL_RANK 0) runs the same probes as `topoprof topo`
(nvidia-smi, NVML, host); every rank reports its host and CPU binding, so the report can show
each node and flag nodes that differ.
"""
from __future__ import annotations

import os
import platform

from topoprof.jsonio import to_jsonable
from topoprof.probes.ranks.collective_timing import node_id
from topoprof.specs.messages import NodesJob, NodesResult
from topoprof.topology.collect import collect_topology


def run_rank(ctx, job: NodesJob) -> None:
    import torch.distributed as dist  # lazy: torch, loaded only inside the worker process that measures


    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))

    mine = {"rank": ctx.rank, "host": platform.node(), "node": node_id(), "local_rank": local_rank,
            "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "topology": to_jsonable(collect_topology()) if local_rank == 0 else None}
    ctx.progress("probing this node")
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    if ctx.rank == 0:
        ctx.send(NodesResult(every))
