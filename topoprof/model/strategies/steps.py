"""Predicted time of one optimizer step for DataParallel, DDP and their accumulation variants.

Per micro-batch each GPU computes c = T_fwd + T_bwd; a step is k micro-batches then the
optimizer, T_opt. DDP overlaps all-reduce with backward through buckets (`topoprof.model.ddp.buckets`).
Build `ModelInputs` from `Workload`, `Compute` and `Cluster`, then call `predict`; `sweep`,
`hide_threshold` and `fixed_global_batch` answer "what would changing this gain me".
docs/model.md states each formula with its source.

Here: each strategy's step from resolved inputs (`step_times`) and its result (`strategy_results`:
samples per second, the speedup on ddp_synced, its memory), the formulas, the assumptions, DDP's
pieces per micro-batch (`ddp_pieces`) and its cost by part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from topoprof.errors import InputError
from topoprof.model.comm.collectives import CommModel, LinkUnknown
from topoprof.model.compute.timing import FSDP_OVERHEAD_KEYS, uses_modelled
from topoprof.model.ddp.buckets import Bucket
from topoprof.model.ddp.gpu_costs import ddp_kernels, straggler_wait_s
from topoprof.model.ddp.timeline import DdpSetting, copies_traffic_s, ddp_timeline, hiding_threshold
from topoprof.model.fsdp.gpu_costs import hidden_by_device_s
from topoprof.model.fsdp.plan import FsdpPlan, recompute_shares
from topoprof.model.fsdp.timeline import (
    Collectives,
    FsdpOverhead,
    FsdpSetting,
    FsdpStep,
    collective_times,
    fsdp_step,
    shard_degree,
)
from topoprof.model.strategies.dataparallel import dataparallel_comm_s
from topoprof.model.strategies.job import BLOCKING_BACKENDS, ModelInputs
from topoprof.model.strategies.memory import memory_by_strategy
from topoprof.model.strategies.resolve import Resolved, fsdp_own_work_measured, resolve
from topoprof.model.strategies.results import HideThreshold, PartCost, Range, StrategyResult, Unavailable, part_costs
from topoprof.specs.fsdp_modes import FSDP_STRATEGIES, HSDP_ONE_NODE_REASON, MODES, FsdpMode
from topoprof.workload.presets import PRESET_DEPTH

DDP_STRATEGIES = ("single", "dp", "ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only",
                  "ddp_fp16_compress")

STRATEGIES = DDP_STRATEGIES + FSDP_STRATEGIES

# Why DP and DDP have no prediction on one GPU. Not "DDP with 0 s of communication": torch
# would run it, but nobody chooses it, and it would only repeat `single` plus bucket copies.
ONE_GPU_REASON = "one GPU: nothing to all-reduce; see `single`"


def ddp_setting(res: Resolved, buckets: tuple[Bucket, ...] = ()) -> DdpSetting:
    work, compute = res.inputs.workload, res.inputs.compute
    kernels = ddp_kernels(len(work.layout.tensors), len(buckets), work.gradient_as_bucket_view)
    bandwidth = None if res.memory_bandwidth_gbps is None else res.memory_bandwidth_gbps * res.gpu.copy_share
    return DdpSetting(res.backward_s, work.layout.params, work.grad_bytes, bandwidth,
                      res.gpu.compute_slowdown, compute.comm_slowdown_during_compute,
                      compute.comm_slowdown_by_size, work.gradient_as_bucket_view,
                      compute.ddp_copy_bandwidth_gbps, kernels * res.gpu.kernel_s)


def ddp_pieces(res: Resolved, comm: CommModel,
               threshold: bool = False) -> tuple[float, float, HideThreshold | None]:
    """E and E_fp16 per synced micro-batch of the job `res` resolved over `comm`, from one DDP
    setting (`topoprof.model.ddp.timeline`); with `threshold`, also the compute per micro-batch at
    which DDP's all-reduces would hide behind backward, beside the compute and E now."""
    buckets = res.buckets
    setting = ddp_setting(res, buckets)
    exposed, fp16 = (ddp_timeline(setting, buckets, comm, fp16_compress).exposed_s
                     for fp16_compress in (False, True))
    if not threshold:
        return exposed, fp16, None
    backward_at_floor, floor = hiding_threshold(setting, buckets, comm)
    # copies do not depend on c; the pipeline part is scaled from backward to c
    at = backward_at_floor * res.micro_batch_s / res.backward_s
    return exposed, fp16, HideThreshold(res.micro_batch_s, exposed, floor, at, res.micro_batch_s >= at)


def hide_threshold(res: Resolved) -> HideThreshold | Unavailable:
    """DDP's hiding threshold (`ddp_pieces`); none on one GPU."""
    if res.inputs.cluster.gpus == 1:
        return Unavailable(ONE_GPU_REASON)
    hide = ddp_pieces(res, res.inputs.cluster.comm, threshold=True)[2]
    assert hide is not None  # asked for
    return hide


def straggler_s(res: Resolved, syncs: int) -> float:
    """What a step of `syncs` syncs waits for its slowest rank (`straggler_wait_s`)."""
    n, k = res.inputs.cluster.gpus, res.inputs.accumulation_steps
    g = res.gpu
    if n == 1 or (g.speed_spread == 0 and g.jitter == 0):
        return 0.0
    return straggler_wait_s(n, res.micro_batch_s, k, syncs, g.speed_spread, g.jitter * res.micro_batch_s,
                                    g.spread_basis)


# How many micro-batches of a step all-reduce, per DDP strategy (of k).
def _synced(mode: str, k: int) -> int:
    return 1 if mode == "ddp_no_sync" else k


def step_components(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel, mode: str) -> dict[str, float]:
    """A DDP strategy's step in the parts a timeline shows: compute (forward and backward, with
    DDP's hooks and what communication slows it), the communication left exposed after backward
    (the tail of the all-reduces and the bucket copies), the optimizer. They add up to the step."""
    k = res.inputs.accumulation_steps
    if mode in FSDP_STRATEGIES:
        step = fsdp_strategy_step(res, comm, mode)
        if isinstance(step, str):
            raise InputError(f"{mode}: {step}")
        return {"compute": step.compute_s + fsdp_wait_s(res, comm), "exposed_comm": step.exposed_comm_s,
                "optimizer": step.optimizer_s}
    timeline = ddp_timeline(ddp_setting(res, buckets), buckets, comm, fp16_compress=mode == "ddp_fp16_compress")
    overlap, n = timeline.overlap, _synced(mode, k)
    slowed = overlap.backward_end_s - res.backward_s  # what backward lost to the all-reduces
    # Half the copies' traffic runs inside backward (each gradient into its bucket as it is
    # ready), half after the last all-reduce (the buckets back into the gradients), where a
    # timeline shows them: in compute and in the exposed tail.
    tail = max(0.0, overlap.comm_end_s - overlap.backward_end_s) + timeline.copies_s / 2
    # waiting for the slowest rank counts as compute, as validate measures it (rotations.step_parts)
    return {"compute": k * (res.micro_batch_s + res.inputs.compute.ddp_overhead_s)
            + n * (slowed + timeline.copies_s / 2) + straggler_s(res, n),
            "exposed_comm": n * tail, "optimizer": res.optimizer_s}


def fsdp_setting(res: Resolved) -> FsdpSetting:
    """The FSDP timeline's inputs: compute split by the backward fraction, MixedPrecisionPolicy's
    bytes, the backend's blocking and reduce-scatter behaviour, FSDP's measured own work."""
    work, comp, cl = res.inputs.workload, res.inputs.compute, res.inputs.cluster
    param_bytes, reduce_bytes = work.fsdp_bytes
    overhead = FsdpOverhead(*(getattr(comp, key) or 0.0 for key in FSDP_OVERHEAD_KEYS)) \
        if fsdp_own_work_measured(comp) else None
    blocking = cl.backend in BLOCKING_BACKENDS
    bandwidth = None if res.memory_bandwidth_gbps is None else res.memory_bandwidth_gbps * res.gpu.copy_share
    return FsdpSetting(res.micro_batch_s - res.backward_s, res.backward_s, param_bytes, reduce_bytes,
                            bandwidth, blocking=blocking, reduce_scatter_as_allreduce=blocking,
                            overhead=overhead,
                            compute_slowdown=1.0 if blocking else res.gpu.compute_slowdown,
                            comm_slowdown=1.0 if blocking else comp.comm_slowdown_during_compute,
                            own_param_bytes=work.param_bytes, host_step_s=res.gpu.fsdp_host_step_s,
                            host_hidden_s=None if blocking else math.inf if res.gpu.fsdp_hooks_hidden
                            else host_hidden_s(res))


def recompute_total_s(res: Resolved) -> float:
    """Activation checkpointing's recompute in a micro-batch's backward, where the compute is
    modelled from the model's ops (its recompute ops priced alone, `compute.traced`) at the end of
    the range `res` resolved; 0 where it is measured or given (the recompute is inside it)."""
    comp = res.inputs.compute
    modelled = comp.modelled
    if not uses_modelled(comp) or modelled is None or not modelled.detail.recompute_s:
        return 0.0
    return res.micro_batch_s * modelled.detail.recomputed_middle_s / modelled.middle_s


def with_recompute(setting: FsdpSetting, res: Resolved, plan) -> FsdpSetting:
    """The setting with the recompute taken out of backward and placed at each checkpointed
    group's backward start (`fsdp.timeline`), shared as `fsdp.plan.recompute_shares` says."""
    total = recompute_total_s(res)
    work = res.inputs.workload
    shares = recompute_shares(plan, work.checkpointing, PRESET_DEPTH.get(work.layout.name))
    if total <= 0 or not shares:
        return setting
    return replace(setting, backward_s=setting.backward_s - total, recompute_s=tuple(total * s for s in shares))


def host_hidden_s(res: Resolved) -> float | None:
    """Host time per micro-batch the device hides, where the compute is priced from the model's
    own ops (their device time beyond their host time); None where the compute is measured or
    given (nothing says how far the host runs ahead)."""
    comp = res.inputs.compute
    detail = comp.modelled.detail if comp.modelled is not None else None
    if not uses_modelled(comp) or detail is None or detail.host_s is None or detail.device_s is None:
        return None
    return hidden_by_device_s(res.micro_batch_s, detail.host_s, detail.device_s)


@dataclass(frozen=True)
class FsdpJob:
    """What an FSDP strategy's timeline takes: its groups, setting, mode and collectives, and the
    comm models of its levels (HSDP: the shard ring inside a node, the replicas across nodes)."""

    plan: FsdpPlan
    setting: FsdpSetting
    mode: FsdpMode
    coll: Collectives
    shard: CommModel
    replicate: CommModel | None


def fsdp_job(res: Resolved, comm: CommModel, name: str) -> FsdpJob | str:
    """An FSDP strategy's timeline inputs (`topoprof.model.fsdp`), or why it does not apply here."""
    mode, cl, work = MODES[name], res.inputs.cluster, res.inputs.workload
    if cl.gpus == 1:
        return ONE_GPU_REASON
    if mode.hsdp and cl.nodes == 1:
        return HSDP_ONE_NODE_REASON
    plan = work.fsdp
    if isinstance(plan, str):
        return plan
    setting = with_recompute(fsdp_setting(res), res, plan)
    try:
        if mode.hsdp:
            shard, replicate = comm.at_shape(1, cl.gpus_per_node), comm.at_shape(cl.nodes, 1)
        else:
            shard, replicate = comm, None
    except LinkUnknown as err:
        return str(err)
    return FsdpJob(plan, setting, mode, collective_times(plan, setting, shard, replicate), shard, replicate)


def fsdp_strategy_step(res: Resolved, comm: CommModel, name: str) -> FsdpStep | str:
    """One FSDP strategy's step (`topoprof.model.fsdp`), or why it does not apply here."""
    job = fsdp_job(res, comm, name)
    if isinstance(job, str):
        return job
    cl = res.inputs.cluster
    shards = shard_degree(job.mode, cl.gpus, cl.gpus_per_node)
    comp = res.inputs.compute
    t_opt = comp.fsdp_optimizer_time_s if comp.fsdp_optimizer_time_s is not None else res.optimizer_s / shards
    return fsdp_step(job.plan, job.setting, job.coll, job.mode, res.inputs.accumulation_steps, t_opt)


def fsdp_wait_s(res: Resolved, comm: CommModel) -> float:
    """What an FSDP step waits for its slowest rank beyond its collectives' own: every micro-batch
    meets the others at its all-gathers, synced or not (W_k). On a blocking backend whose FSDP
    collectives validate measured between stretches of compute, the wait is in them already."""
    measured = bool(getattr(comm, "curve", lambda _: ())("all_gather"))
    if res.inputs.cluster.backend in BLOCKING_BACKENDS and measured:
        return 0.0
    return straggler_s(res, res.inputs.accumulation_steps)


def fsdp_step_times(res: Resolved, comm: CommModel) -> dict[str, tuple[float, float] | str]:
    """(step_time_s, comm_exposed_s) per FSDP strategy, with the slowest rank's wait (fsdp_wait_s)."""
    out: dict[str, tuple[float, float] | str] = {}
    wait = fsdp_wait_s(res, comm)
    for name in FSDP_STRATEGIES:
        step = fsdp_strategy_step(res, comm, name)
        out[name] = step if isinstance(step, str) else (step.step_s + wait, step.exposed_comm_s)
    return out


def dp_comm_s(res: Resolved, comm: CommModel) -> float:
    work = res.inputs.workload
    return dataparallel_comm_s(comm, [t.numel for t in work.layout.tensors], work.param_bytes,
                               work.grad_bytes, work.dp_output_bytes)


def step_times(res: Resolved, comm: CommModel, exposed: tuple[float, float] | None = None
               ) -> dict[str, tuple[float, float] | str]:
    """(step_time_s, comm_exposed_s) per strategy, or why it does not apply; `exposed`: DDP's E and
    E_fp16 over `comm` (`ddp_pieces`), where they were found already."""
    k, c, t_opt = res.inputs.accumulation_steps, res.micro_batch_s, res.optimizer_s
    if res.inputs.cluster.gpus == 1:
        return {name: (k * c + t_opt, 0.0) if name == "single" else ONE_GPU_REASON
                for name in STRATEGIES}
    e, e16 = exposed or ddp_pieces(res, comm)[:2]
    cd = c + res.inputs.compute.ddp_overhead_s  # a micro-batch through DDP's hooks
    # the slowest rank: waited for at every sync, k per step synced, once with no_sync
    w_synced, w_once = straggler_s(res, k), straggler_s(res, 1)
    out: dict[str, tuple[float, float] | str] = {
        "single": (k * c + t_opt, 0.0),
        "ddp_synced": (k * (cd + e) + w_synced + t_opt, k * e),
        "ddp_no_sync": (k * cd + e + w_once + t_opt, e),
        # _post_forward calls reducer.prepare_for_backward whenever require_backward_grad_sync
        # is True during forward; no_sync() around backward alone then changes nothing.
        "ddp_no_sync_backward_only": (k * (cd + e) + w_synced + t_opt, k * e),
        "ddp_fp16_compress": (k * (cd + e16) + w_synced + t_opt, k * e16),
    }
    if res.inputs.cluster.nodes > 1:
        out["dp"] = "DataParallel is single-process, single-node"
    else:  # DataParallel's reduce onto GPU 0 waits for every GPU's backward, every micro-batch
        d = dp_comm_s(res, comm)
        out["dp"] = (k * (c + d + res.inputs.compute.dp_thread_overhead_s) + w_synced + t_opt, k * d)
    out.update(fsdp_step_times(res, comm))
    return out


def _samples(res: Resolved, name: str) -> int:
    gpus = 1 if name == "single" else res.inputs.cluster.gpus
    return res.inputs.workload.micro_batch_size * res.inputs.accumulation_steps * gpus


def strategy_results(res: Resolved, nominal: dict, bounds: tuple[dict, dict] | None
                     ) -> dict[str, StrategyResult | Unavailable]:
    """Each strategy's result from its step (`step_times`: `nominal`, and the range's slow and fast
    ends in `bounds`): samples per second, the speedup on ddp_synced, its memory; or why it does
    not apply."""
    synced = nominal["ddp_synced"]
    synced_rate = None if isinstance(synced, str) else _samples(res, "ddp_synced") / synced[0]
    out: dict[str, StrategyResult | Unavailable] = {}
    for name in STRATEGIES:
        if isinstance(nominal[name], str):
            out[name] = Unavailable(nominal[name])
            continue
        step, exposed = nominal[name]
        samples = _samples(res, name)
        rng = None
        if bounds is not None:
            (hi, e_hi), (lo, e_lo) = bounds[0][name], bounds[1][name]
            rng = Range((lo, hi), (e_lo, e_hi), (samples / hi, samples / lo))
        speedup = None if synced_rate is None else samples / step / synced_rate
        out[name] = StrategyResult(step, exposed, samples, samples / step, speedup, rng,
                                   FORMULAS[name])
    memory = memory_by_strategy(res.memory, [n for n, r in out.items() if isinstance(r, StrategyResult)])
    # nothing is ranked against a strategy that does not fit
    unranked = getattr(memory.get("ddp_synced"), "fits", None) is False
    return {n: replace(r, memory=memory.get(n),
                       speedup_vs_ddp_synced=None if unranked else r.speedup_vs_ddp_synced)
            if isinstance(r, StrategyResult) else r for n, r in out.items()}


# DataParallel's thread and replicate() costs are priced only where given (`dp_thread_overhead_s`);
# otherwise its step is a lower bound, shown but never ranked against the others nor recommended.
DP_UNPRICED = ("its replicas' Python in one process's threads (the GIL) and its replicate() every step are "
               "not priced, so its row is a lower bound")


def lower_bounds(dp_thread_overhead_s: float | None) -> dict[str, str]:
    """The strategies whose step here is a lower bound, each with why."""
    return {} if (dp_thread_overhead_s or 0) > 0 else {"dp": DP_UNPRICED}


FORMULAS = {
    "single": "k*c + T_opt (one GPU)",
    "dp": "k*(c + broadcast(params) + gather(outputs) + reduce(grads) + thread_overhead) + W_k + T_opt",
    "ddp_synced": "k*(c + o + E) + W_k + T_opt",
    "ddp_no_sync": "k*(c + o) + E + W_1 + T_opt",
    "ddp_no_sync_backward_only": "k*(c + o + E) + W_k + T_opt, the same as ddp_synced",
    "ddp_fp16_compress": "k*(c + o + E_fp16) + W_k + T_opt",
    # FSDP: F = one micro-batch's timeline (topoprof.model.fsdp): forward and backward compute,
    # FSDP's own work per group, the collectives it leaves exposed
    "fsdp_full_shard": ("k*F_sync(all-gather in forward and again in backward, reduce-scatter per group) "
                        "+ W_k + T_opt/n"),
    "fsdp_full_shard_no_sync": "(k-1)*F_nosync + F_sync: no reduce-scatter until the last micro-batch; + W_k + T_opt/n",
    "fsdp_shard_grad_op": "k*F_sync(all-gather in forward only, reduce-scatter per group) + W_k + T_opt/n",
    "fsdp_shard_grad_op_no_sync": "(k-1)*F_nosync + F_sync, no backward all-gather; + W_k + T_opt/n",
    "hsdp": "k*F_sync(all-gather, reduce-scatter over a node's g GPUs; + per group an all-reduce of its shard across "
            "the m nodes, the node's NICs shared by its g ranks) + W_k + T_opt/g",
    "hsdp_no_sync": "(k-1)*F_nosync + F_sync, HSDP; + W_k + T_opt/gpus_per_node",
}

ASSUMPTIONS = (
    "gradients become ready in reverse forward order; a tensor's share of backward is its "
    "matmul FLOPs (embedding lookups, norms, biases ~0; attention score FLOPs left out)",
    "DDP buckets are the ones rebuilt after the first iteration (gradient-ready order); the "
    "first iteration (one bucket per dtype) and buffer broadcasts are not modelled",
    "bucket all-reduces run one at a time in bucket order: start_j = max(ready_j, end_{j-1})",
    "bucket copy traffic (4G bytes, 2G with gradient_as_bucket_view) and DDP's kernels (2 per gradient, 1 with "
    "gradient_as_bucket_view, 1 per bucket) are fully exposed",
    "W_s: a step with s syncs waits for its slowest rank at each (topoprof.model.ddp.gpu_costs.straggler_wait_s)",
    "DDP's optimizer step on each GPU takes T_opt, as on one GPU",
    "DataParallel: input scatter and the flatten/unflatten copies of broadcast_coalesced and "
    "reduce_add_coalesced not modelled; output gather = dp_output_bytes per GPU; "
    "Python-thread/GIL cost = dp_thread_overhead_s (both 0 unless given)",
    "FSDP: one group per block and the root with the rest (topoprof.model.fsdp); all-gathers and "
    "reduce-scatters one at a time in issue order on one process group, all-gathers prefetched one group "
    "ahead, HSDP's all-reduce on a stream of its own; the root not resharded after forward (torch's default)",
    "FSDP's own work per group (topoprof.model.fsdp.gpu_costs), unless validate measured it: its buffer copies "
    "(the all-gather's copy-in on its own stream, its copy-out and the reduce-scatter's chunk-cat on the compute "
    "stream) at the memory bandwidth, 73-86 % of a datasheet's; its hooks' host steps at 6.2-10.7 us each on a GPU, "
    "counted where the device's time (from the model's ops) does not hide them; where the compute is not priced "
    "from its ops, all of them, and none at the range's fast end (the host ahead throughout); compute slowed by NCCL's "
    "SMs while any collective runs; each parameter padded to a multiple "
    "of the shard count; the no_sync gradient accumulation in reduce_dtype and the optimizer's DTensor cost not "
    "modelled",
    "HSDP: per group an all-gather and a reduce-scatter over the GPUs of a node, then its reduced shard all-reduced "
    "across the nodes by every shard rank at once through the node's NICs: priced as one all-reduce of the group's "
    "bytes at the NICs' total bandwidth, 2(m-1) network hops of latency, on a stream of its own",
    "FSDP on gloo: every collective blocks the host thread and a reduce-scatter is an all-reduce of the "
    "whole buffer (ProcessGroupGloo.cpp reduce_scatter_tensor_coalesced)",
)

# What DDP adds to one synced micro-batch, part by part: (what it scales with, where it comes from).
DDP_COST_PARTS = {
    "allreduce_tail": ("bytes of the buckets ready last, over the link's bus bandwidth",
                       "the bucket all-reduces not hidden behind backward (reducer.cpp launches buckets in order)"),
    "backward_slowed": ("the time the all-reduces overlap backward",
                        "compute slowed while an all-reduce runs: on GPUs NCCL's kernels hold 2 SMs per ring "
                        "(src/enqueue.cc, src/graph/connect.cc), on CPU ranks gloo's threads share the cores"),
    "ddp_kernels": ("gradient tensors and buckets",
                    "a copy into and out of its bucket per gradient, an all-reduce launch per bucket (reducer.cpp)"),
    "copy_traffic": ("gradient bytes over memory bandwidth",
                     "4G bytes of bucket copies, 2G with gradient_as_bucket_view"),
    "ddp_hooks": ("micro-batches", "DDP's forward and autograd hooks, measured by validate (0 unless measured)"),
    "slowest_rank": ("ranks (the expected maximum of that many) and compute per micro-batch",
                     "every sync waits for the slowest rank (topoprof.model.ddp.gpu_costs.straggler_wait_s)"),
}


def ddp_cost_parts(res: Resolved, buckets: tuple[Bucket, ...], comm: CommModel) -> dict[str, float]:
    """What DDP adds to one synced micro-batch over one GPU's compute, in DDP_COST_PARTS."""
    setting = ddp_setting(res, buckets)
    overlap = ddp_timeline(setting, buckets, comm).overlap
    return {"allreduce_tail": max(0.0, overlap.comm_end_s - overlap.backward_end_s),
            "backward_slowed": overlap.backward_end_s - res.backward_s,
            "ddp_kernels": setting.kernels_s, "copy_traffic": copies_traffic_s(setting),
            "ddp_hooks": res.inputs.compute.ddp_overhead_s,
            "slowest_rank": straggler_s(res, res.inputs.accumulation_steps) / res.inputs.accumulation_steps}


def ddp_one_gpu_s(inputs: ModelInputs, end: str | None = None) -> float:
    """A micro-batch through DDP on one rank (torch runs its reducer and a one-rank all-reduce
    there too): compute plus DDP's hooks, kernels and copy traffic, no link and no other rank.
    `end` as for `resolve`: the what-if's middle, or its slow or fast end."""
    res = resolve(inputs, end)
    setting = ddp_setting(res, res.buckets)
    return res.micro_batch_s + inputs.compute.ddp_overhead_s + setting.kernels_s + copies_traffic_s(setting)


def ddp_costs_by_part(nominal: Resolved, ends: tuple[Resolved, Resolved], buckets: tuple[Bucket, ...],
               comms: tuple[CommModel, CommModel, CommModel]) -> dict[str, PartCost]:
    middle = ddp_cost_parts(nominal, buckets, comms[0])
    slow = ddp_cost_parts(ends[0], buckets, comms[1])
    fast = ddp_cost_parts(ends[1], buckets, comms[2])
    return part_costs(middle, slow, fast, DDP_COST_PARTS)
