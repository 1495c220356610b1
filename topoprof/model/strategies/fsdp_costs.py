"""What FSDP2 adds to a synced micro-batch of `fsdp_full_shard` over one GPU's compute, part by
part (`topoprof.model.fsdp.gpu_costs`), each with its what-if range as DDP's costs are
(`steps.ddp_costs_by_part`); and HSDP's two levels as its timeline prices them.
"""
from __future__ import annotations

from topoprof.model.comm.collectives import CommModel
from topoprof.model.fsdp.timeline import fsdp_micro_batch
from topoprof.model.strategies.resolve import Resolved
from topoprof.model.strategies.results import HsdpLevels, PartCost, part_costs
from topoprof.model.strategies.steps import fsdp_job, fsdp_wait_s

# What FSDP adds to one synced micro-batch, part by part: (what it scales with, where it comes from).
FSDP_COST_PARTS = {
    "exposed_comm": ("the collectives' bytes over the links, against the compute there is to hide them behind",
                     "all-gathers and reduce-scatters the compute stream waits for: the root's and the first block's "
                     "all-gather, the last reduce-scatter, any that compute could not hide "
                     "(topoprof.model.fsdp.timeline)"),
    "compute_slowed": ("the time collectives overlap compute",
                       "compute slowed while a collective runs: on GPUs NCCL's kernels hold 2 SMs per ring "
                       "(src/enqueue.cc, src/graph/connect.cc)"),
    "all_gather_copy_in": ("the shards' bytes over memory bandwidth",
                           "each shard cast and copied into the all-gather's input (foreach_all_gather, "
                           "_fsdp_collectives.py), on the all-gather's stream: inside exposed_comm where exposed"),
    "all_gather_copy_out": ("the gathered groups' bytes over memory bandwidth, per all-gather",
                            "split_with_sizes_copy into each unsharded parameter (foreach_all_gather_copy_out)"),
    "reduce_scatter_copy_in": ("the gradients' bytes over memory bandwidth",
                               "torch._chunk_cat of the gradients into the reduce-scatter's input (foreach_reduce)"),
    "fsdp_hooks": ("groups and parameters; none where the device's time hides the host's",
                   "host steps of each group's pre/post-forward and pre/post-backward (topoprof.model.fsdp.gpu_costs)"),
    "measured": ("groups", "FSDP's own work per group, copies and hooks, measured by validate"),
    "slowest_rank": ("ranks (the expected maximum of that many) and compute per micro-batch",
                     "every micro-batch meets the slowest rank at its all-gathers "
                     "(topoprof.model.ddp.gpu_costs.straggler_wait_s)"),
}

# Parts inside another: the copy-in lengthens the all-gather, whose exposed share is in exposed_comm.
INSIDE_ANOTHER = ("all_gather_copy_in",)

COST_STRATEGY = "fsdp_full_shard"


def fsdp_cost_parts(res: Resolved, comm: CommModel) -> dict[str, float] | None:
    """What FSDP adds to one synced micro-batch of `fsdp_full_shard`, in FSDP_COST_PARTS; None
    where it does not apply."""
    job = fsdp_job(res, comm, COST_STRATEGY)
    if isinstance(job, str):
        return None
    mb = fsdp_micro_batch(job.plan, job.setting, job.coll, job.mode, True)
    # the compute the timeline runs, the checkpointed groups' recompute with it (`steps.with_recompute`)
    model = job.setting.forward_s + job.setting.backward_s + sum(job.setting.recompute_s)
    copy_in = job.coll.copy_in_s
    parts = {"exposed_comm": mb.exposed_s,
             "compute_slowed": max(0.0, mb.compute_busy_s - model - mb.fsdp_work_s),
             "all_gather_copy_in": (sum(copy_in[op.group] for op in mb.ops if op.kind == "all_gather")
                                    if copy_in else 0.0)}
    own = ("measured",) if job.setting.overhead is not None else (
        "all_gather_copy_out", "reduce_scatter_copy_in", "fsdp_hooks")
    parts.update({name: mb.fsdp_parts.get(name, 0.0) for name in own})
    parts["slowest_rank"] = fsdp_wait_s(res, comm) / res.inputs.accumulation_steps
    return parts


def fsdp_costs_by_part(nominal: Resolved, ends: tuple[Resolved, Resolved],
                       comms: tuple[CommModel, CommModel, CommModel]) -> dict[str, PartCost]:
    """Each part at the what-if's middle, with its (fast, slow) range where the ends differ."""
    middle, slow, fast = (fsdp_cost_parts(res, comm) for res, comm in zip((nominal, *ends), comms))
    if middle is None:
        return {}
    assert slow is not None and fast is not None  # the ends are the middle's job at other rates
    return part_costs(middle, slow, fast, FSDP_COST_PARTS)


HSDP_FORMULA = ("per group: all-gather and reduce-scatter over the g GPUs of a node; then the reduced shard "
                "all-reduced across the m nodes by each of the node's g shard ranks at once, together 2(m-1)/m x the "
                "group's bytes through the node's NICs: priced as one all-reduce of the group's bytes at the NICs' "
                "total (B = the network bandwidth), 2(m-1) network hops of latency, on a stream of its own")


def hsdp_levels(res: Resolved, comm: CommModel) -> HsdpLevels | None:
    """HSDP's levels as its synced micro-batch prices them; None where HSDP does not apply."""
    job = fsdp_job(res, comm, "hsdp")
    if isinstance(job, str) or job.replicate is None:
        return None
    mb = fsdp_micro_batch(job.plan, job.setting, job.coll, job.mode, True)
    alone = {"all_gather": job.coll.all_gather_s, "reduce_scatter": job.coll.reduce_scatter_s,
             "all_reduce": job.coll.all_reduce_s}
    total = {kind: sum(times[op.group] for op in mb.ops if op.kind == kind) for kind, times in alone.items()}
    cl = res.inputs.cluster
    shard_bw = job.shard.bus_bandwidth_gbps if cl.gpus_per_node > 1 else None
    return HsdpLevels(cl.gpus_per_node, shard_bw, cl.nodes, job.replicate.bus_bandwidth_gbps,
                      total["all_gather"], total["reduce_scatter"], total["all_reduce"],
                      sum(1 for op in mb.ops if op.kind == "all_reduce"), mb.exposed_s, HSDP_FORMULA)
