"""What FSDP2 costs on a GPU beside its collectives, per group, part by part: its buffer copies,
its hooks' host work, and (priced in the timeline itself) compute slowed by NCCL's kernels.

Each part is named with where it comes from in torch 2.13's `torch/distributed/fsdp/_fully_shard/`
(`file.py:line`), what it scales with, and what a what-if assumes where `validate` measured
nothing: memory traffic at the GPU's bandwidth, or a cited range. Where `validate` measured FSDP's
own work per group (`FsdpOverhead`, the calibration's fsdp_*_overhead_s), that replaces the copies
and the hooks priced here. `topoprof.model.fsdp.timeline` places each part where FSDP does it;
`topoprof.model.strategies` lists them per synced micro-batch (`fsdp_costs`).

1. The all-gather's copy-in (`all_gather_copy_in`). `foreach_all_gather`
   (`_fsdp_collectives.py:325-379`) copies each parameter's local shard into the all-gather's
   input: with a `param_dtype` other than the parameter's own, first a cast of every shard into one
   flat buffer (`_get_param_all_gather_inputs`, 416-423: `torch._foreach_copy_`), then a copy of
   that into the all-gather buffer (`all_gather_copy_in`, 263-276: `torch._foreach_copy_` again);
   without one, only the second. It runs on the all-gather copy-in stream, and the all-gather
   stream waits for it (362; `_fsdp_param_group.py:116-125`, in forward and pre-backward): it
   lengthens the all-gather it precedes, and the step only where that is exposed. Scales with the
   shard's bytes: padded numel / shards x (own + 3 x param_dtype) bytes, or 2 x param_dtype.
2. The all-gather's copy-out (`all_gather_copy_out`). `foreach_all_gather_copy_out` (431-518)
   splits the gathered buffer into each unsharded parameter (`split_with_sizes_copy`, 485-491), on
   the compute stream, which waits for the all-gather first (448): read and write of the padded
   group in param_dtype. Every all-gather has one, in backward too.
3. The reduce-scatter's copy-in (`reduce_scatter_copy_in`). `foreach_reduce` (521-775) copies the
   gradients into the reduce-scatter input with `torch._chunk_cat` (`foreach_reduce_scatter_copy_in`,
   778-785) on the compute stream, casting them to reduce_dtype: the gradients read in
   param_dtype, the padded buffer written in reduce_dtype. The division by the world size runs on
   the reduce-scatter's stream, on the shard, and is left out.
4. Its hooks (`fsdp_hooks`). Per group, pre-forward (unshard: the all-gather's buffers and launch,
   then the copy-out, the parameters swapped to unsharded and the post-backward function
   registered, `_fsdp_param_group.py:540-555`), post-forward (reshard: each parameter swapped back
   and its storage freed, 557-567, `_fsdp_param.py:704-707`), pre-backward (the unshard again for
   a resharded group, 576-586) and post-backward (the gradients taken, the reshard, the
   reduce-scatter's buffers and launch, each sharded gradient viewed and wrapped as a DTensor,
   587-761; `_fsdp_collectives.py:686-757`). `HOST_STEPS` counts the steps each does (an op it
   dispatches, a stream or event call, or a parameter it swaps), a fixed part and one per
   parameter; each costs HOST_STEP_COST_RANGE_S. That is host time: on a GPU the host runs ahead
   of the device, so it reaches the step only where the host is the bound. Where the compute is
   priced from the model's own ops, the device's time beyond the host's hides as much of it; where
   it is not (measured, given, or the datasheet's), nothing says how far the host runs ahead, so
   all of it counts (as DDP's kernels do, `topoprof.model.ddp.gpu_costs`), and none at the fast
   end of the what-if's range (the host ahead throughout). Scales with groups and parameters.
5. NCCL's kernels beside compute (`compute_slowed`). An all-gather or reduce-scatter holds NCCL's
   channels' SMs as an all-reduce does (one thread block per channel, src/enqueue.cc; channels
   doubled, src/graph/connect.cc `ncclTopoPostset`): compute beside it runs at worst
   SMs / (SMs - channels) as long (`topoprof.model.ddp.gpu_costs.nccl_sm_slowdown_range`, the
   same range DDP's backward takes). The timeline applies it while any collective runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from topoprof.model.comm.collectives import GB

if TYPE_CHECKING:  # annotations only
    from topoprof.model.fsdp.plan import FsdpPlan

# The host cost of one step of FSDP's hooks, in seconds: the span of what was measured.
# - Low, 6.2 us: one op issued from Python outside autograd, back to back, on an H200 machine
#   (measured on an NVIDIA H200 SXM, torch 2.11, 2026-11-26: shared/gpu-facts, "torch.add of 64
#   floats, no grad"); FSDP's hooks run under no_grad (`_fsdp_collectives.py:324, 381, 430`).
# - High, 10.7 us: FSDP's per-parameter swap to the unsharded views, measured by PyTorch's FSDP
#   authors, 4.268 ms over 400 parameters (200 nn.Linear with bias, one FSDP unit, world size 2:
#   pytorch/pytorch#96958, `_use_unsharded_views` after its unsafe setattr); its reshard swap took
#   2.7-2.8 ms over the same 400 (6.9 us), inside this span.
HOST_STEP_COST_RANGE_S = (6.2e-6, 10.7e-6)

HOST_STEP_COST_BASIS = ("6.2-10.7 us per step of FSDP's hooks: one op outside autograd on an H200 machine "
                        "(shared/gpu-facts) .. FSDP's per-parameter swap to unsharded views, 4.27 ms over 400 "
                        "parameters (pytorch/pytorch#96958)")


@dataclass(frozen=True)
class HostSteps:
    """The steps of one hook of one group: `fixed` plus `per_param` for each of its parameters."""

    fixed: int
    per_param: int

    def count(self, params: int) -> int:
        return self.fixed + self.per_param * params


# Steps per group, after the first iteration, with a MixedPrecisionPolicy param_dtype and plain
# (not DTensor) parameters, counted in torch 2.13's _fully_shard/:
HOST_STEPS = {
    # unshard, `foreach_all_gather`: the flat cast buffer, its split and foreach copy (416-423),
    # the all-gather buffer (allocate), `all_gather_copy_in` and the narrow, split and foreach copy
    # inside it (263-276), the stream wait, the all-gather, its event (11); `wait_for_unshard`: the
    # event wait, `split_with_sizes_copy` and the op inside it, the copy-out event made and
    # recorded (5); per parameter its all-gather output's storage allocated (`alloc_storage`), its
    # view for the copy-out (474-478) and its swap to the unsharded parameter (`to_unsharded`);
    # then `RegisterPostBackwardFunction.apply` on the inputs (1)
    "pre_forward": HostSteps(17, 3),
    # `reshard` -> `to_sharded` per parameter: the swap back and the storage freed
    "reshard": HostSteps(0, 2),
    # pre-backward of a resharded group: the unshard again, without the hook registration
    "unshard": HostSteps(16, 3),
    # post-backward, reducing: per parameter its gradient taken, the reshard (2), the sharded
    # gradient's `as_strided` view and its DTensor (`to_sharded_dtensor`); fixed: the reduce-scatter
    # input allocated, `chunk_cat` and the op inside it, the stream wait, the output allocated,
    # the reduce-scatter, its event, the post-reduce event
    "post_backward": HostSteps(8, 5),
    # post-backward under no_sync: the reshard (2) and the gradient cast to reduce_dtype or added to
    # the one kept (`to_accumulated_grad_if_needed`, `accumulate_unsharded_grad_if_needed`)
    "post_backward_no_sync": HostSteps(0, 3),
}


def copy_in_bytes(padded_numel: int, shards: int, param_bytes: int, own_bytes: int) -> float:
    """The all-gather's copy-in (part 1): the shard cast into a flat buffer, then copied into
    the all-gather's input; without a cast, only the copy."""
    shard = padded_numel / shards
    if param_bytes == own_bytes:
        return 2 * shard * param_bytes
    return shard * (own_bytes + param_bytes) + 2 * shard * param_bytes


def copy_out_bytes(padded_numel: int, param_bytes: int) -> float:
    """The all-gather's copy-out (part 2): the gathered buffer read, each parameter written."""
    return 2 * padded_numel * param_bytes


def chunk_cat_bytes(numel: int, padded_numel: int, param_bytes: int, reduce_bytes: int) -> float:
    """The reduce-scatter's copy-in (part 3): gradients read in param_dtype, the padded input
    written in reduce_dtype."""
    return numel * param_bytes + padded_numel * reduce_bytes


def hook_steps(hook: str, params: int) -> int:
    """Host steps of `hook` (a key of HOST_STEPS) for a group of `params` parameters."""
    return HOST_STEPS[hook].count(params)


def hidden_by_device_s(micro_batch_s: float, host_s: float, device_s: float) -> float:
    """Host time the device hides per micro-batch: the device's time beyond the host's, as a
    share of the micro-batch (the compute model's host and device sums; module docstring, 4)."""
    if device_s <= host_s or device_s <= 0:
        return 0.0
    return micro_batch_s * (device_s - host_s) / device_s


def group_copies_s(plan: FsdpPlan, shards: int, param_bytes: int, reduce_bytes: int, own_bytes: int | None,
                   bandwidth_gbps: float | None) -> tuple[tuple[float, ...], ...]:
    """Each group's copy-in, copy-out and chunk-cat (parts 1-3) in seconds at `bandwidth_gbps`,
    at the padded sizes FSDP allocates over `shards`; all 0 where the bandwidth is unknown."""
    def seconds(traffic: float) -> float:
        return 0.0 if bandwidth_gbps is None else traffic / (bandwidth_gbps * GB)

    own = own_bytes or param_bytes
    padded = [g.padded_numel(shards) for g in plan.groups]
    return (tuple(seconds(copy_in_bytes(p, shards, param_bytes, own)) for p in padded),
            tuple(seconds(copy_out_bytes(p, param_bytes)) for p in padded),
            tuple(seconds(chunk_cat_bytes(g.numel, p, param_bytes, reduce_bytes)) for g, p in zip(plan.groups, padded)))


def hook_seconds(plan: FsdpPlan, resharded: list[bool], synced: bool, live: list[bool], step_s: float,
                 hidden_s: float | None) -> list[dict[str, float]]:
    """Each group's hooks (part 4) in one micro-batch, in seconds that reach the step: in forward
    (pre-forward, with its post-forward's reshard where it reshards), at its unshard in backward
    (a resharded group) and at its post-backward (reducing if `synced`), less the share of the
    micro-batch's hooks that `hidden_s` of device time hides (None: none hidden)."""
    steps = []
    for g, group in enumerate(plan.groups):
        params = len(group.shapes)
        if not live[g]:  # no parameters: fully_shard makes no group of it
            steps.append({"forward": 0, "unshard": 0, "backward": 0})
            continue
        steps.append({"forward": (hook_steps("pre_forward", params)
                                  + (hook_steps("reshard", params) if resharded[g] else 0)),
                      "unshard": hook_steps("unshard", params) if resharded[g] else 0,
                      "backward": hook_steps("post_backward" if synced else "post_backward_no_sync", params)})
    total = step_s * sum(sum(s.values()) for s in steps)
    share = 0.0 if total <= 0 else max(0.0, total - (hidden_s or 0.0)) / total
    return [{k: v * step_s * share for k, v in s.items()} for s in steps]
