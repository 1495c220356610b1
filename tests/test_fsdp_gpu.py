"""FSDP2's own work on a GPU (topoprof.model.fsdp.gpu_costs): its buffer copies, its hooks' host
steps and NCCL's SMs, priced per group in the timeline and listed as `fsdp_costs`; HSDP's levels."""
from __future__ import annotations

import pytest
from helpers.fsdp_layouts import B0, B1, COMM, HAND, PLAN
from helpers.model_reports import model_report
from helpers.profiles import modelled

from topoprof.model.comm.collectives import HierarchicalComm, RingComm
from topoprof.model.compute.timing import Compute
from topoprof.model.fsdp.gpu_costs import (
    HOST_STEP_COST_RANGE_S,
    chunk_cat_bytes,
    copy_in_bytes,
    copy_out_bytes,
    hidden_by_device_s,
    hook_steps,
)
from topoprof.model.fsdp.timeline import FsdpOverhead, FsdpSetting, collective_times, fsdp_micro_batch
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.model_plan import plan_model
from topoprof.model.strategies.model_report import model_payload, read_model_report
from topoprof.model.strategies.predict import predict
from topoprof.specs.fsdp_modes import MODES

FULL = MODES["fsdp_full_shard"]

# Host steps of one micro-batch of fsdp_full_shard, synced: a block of one parameter runs its
# pre-forward, its reshard after forward, its unshard in backward and its post-backward; the root
# (two parameters) is never resharded after forward, so it has no unshard in backward.
BLOCK_STEPS = (17 + 3) + 2 + (16 + 3) + (8 + 5)
ROOT_STEPS = (17 + 3 * 2) + (8 + 5 * 2)


def _setting(**kw):
    base = dict(forward_s=1.0, backward_s=2.0, param_bytes=4, reduce_bytes=4, memory_bandwidth_gbps=None)
    return FsdpSetting(**{**base, **kw})


def test_copy_bytes_follow_what_fsdp_copies():
    # with a param_dtype: the shard cast into a flat buffer (read 4 B, write 2 B), then copied into
    # the all-gather input (2 + 2 B); without one, only that copy
    assert copy_in_bytes(8000, 2, 2, 4) == 4000 * (4 + 2) + 2 * 4000 * 2
    assert copy_in_bytes(8000, 2, 4, 4) == 2 * 4000 * 4
    assert copy_out_bytes(8000, 2) == 2 * 8000 * 2
    assert chunk_cat_bytes(7999, 8000, 2, 4) == 7999 * 2 + 8000 * 4  # gradients read, padded input written


def test_the_copy_in_lengthens_the_all_gather_and_the_other_copies_run_on_the_compute_stream():
    setting = _setting(memory_bandwidth_gbps=1.0, blocking=True)
    coll = collective_times(PLAN, setting, COMM)
    assert coll.copy_in_s[B0] == pytest.approx(2 * 2000 * 4 / 1e9)
    mb = fsdp_micro_batch(PLAN, setting, coll, FULL, True)
    ag = next(op for op in mb.ops if op.kind == "all_gather" and op.group == B0)
    assert ag.end_s - ag.start_s == pytest.approx(coll.all_gather_s[B0] + coll.copy_in_s[B0])
    # every all-gather's copy-out (the blocks' twice: forward and backward), every chunk-cat
    assert mb.fsdp_parts["all_gather_copy_out"] == pytest.approx(sum(coll.copy_out_s) + coll.copy_out_s[B0]
                                                                 + coll.copy_out_s[B1])
    assert mb.fsdp_parts["reduce_scatter_copy_in"] == pytest.approx(sum(coll.chunk_cat_s))
    assert mb.fsdp_work_s == pytest.approx(sum(mb.fsdp_parts.values()))


def test_hooks_are_host_steps_per_group_and_parameter():
    step = 1e-5
    setting = _setting(host_step_s=step)
    coll = collective_times(PLAN, setting, COMM)
    assert hook_steps("pre_forward", 3) == 17 + 9
    mb = fsdp_micro_batch(PLAN, setting, coll, FULL, True)
    assert mb.fsdp_parts["fsdp_hooks"] == pytest.approx(step * (2 * BLOCK_STEPS + ROOT_STEPS))
    quiet = fsdp_micro_batch(PLAN, setting, coll, MODES["fsdp_full_shard_no_sync"], False)
    no_sync = 2 * ((17 + 3) + 2 + (16 + 3) + 3) + (17 + 3 * 2) + 3 * 2
    assert quiet.fsdp_parts["fsdp_hooks"] == pytest.approx(step * no_sync)
    zero2 = fsdp_micro_batch(PLAN, setting, coll, MODES["fsdp_shard_grad_op"], True)  # no reshard, no unshard
    assert zero2.fsdp_parts["fsdp_hooks"] == pytest.approx(step * (2 * ((17 + 3) + (8 + 5)) + ROOT_STEPS))


def test_the_device_hides_the_hooks_where_the_host_is_not_the_bound():
    step = 1e-5
    total = step * (2 * BLOCK_STEPS + ROOT_STEPS)
    coll = collective_times(PLAN, _setting(), COMM)
    half = fsdp_micro_batch(PLAN, _setting(host_step_s=step, host_hidden_s=total / 2), coll, FULL, True)
    assert half.fsdp_parts["fsdp_hooks"] == pytest.approx(total / 2)
    hidden = fsdp_micro_batch(PLAN, _setting(host_step_s=step, host_hidden_s=2 * total), coll, FULL, True)
    assert "fsdp_hooks" not in hidden.fsdp_parts and hidden.compute_busy_s == pytest.approx(3.0)
    # the device's time beyond the host's, as a share of the micro-batch; none when host-bound
    assert hidden_by_device_s(1.0, 0.3, 1.0) == pytest.approx(0.7)
    assert hidden_by_device_s(1.0, 2.0, 1.0) == 0.0


def test_a_measured_overhead_replaces_the_priced_copies_and_hooks():
    setting = _setting(memory_bandwidth_gbps=1.0, host_step_s=1e-5, overhead=FsdpOverhead(1e-3, 2e-3, 1e-3, 5e-4))
    coll = collective_times(PLAN, setting, COMM)
    assert coll.copy_in_s == coll.copy_out_s == coll.chunk_cat_s == ()
    mb = fsdp_micro_batch(PLAN, setting, coll, FULL, True)
    assert set(mb.fsdp_parts) == {"measured"}
    # per group: forward and synced backward; the resharded blocks' unshard in backward
    assert mb.fsdp_parts["measured"] == pytest.approx(3 * (1e-3 + 2e-3) + 2 * 5e-4)


def _gpu_inputs(nodes: int = 1, workload: Workload = Workload(HAND), **compute) -> ModelInputs:
    gpn = 2
    comm = (RingComm(10.0, 0.0, gpn) if nodes == 1 else
            HierarchicalComm(RingComm(10.0, 0.0, gpn), RingComm(1.0, 0.0, nodes), nodes, gpn))
    values = {"micro_batch_time_s": 0.01, "optimizer_time_s": 0.004, "gpu": "h100-sxm", **compute}
    return ModelInputs(workload, Compute(**values), Cluster(comm, nodes, gpn), 4)


def test_a_gpu_what_if_prices_fsdps_own_work_part_by_part_with_cited_ranges():
    costs = predict(_gpu_inputs()).fsdp_costs
    assert set(costs) == {"exposed_comm", "compute_slowed", "all_gather_copy_in", "all_gather_copy_out",
                          "reduce_scatter_copy_in", "fsdp_hooks", "slowest_rank"}
    hooks = costs["fsdp_hooks"]
    # measured compute: nothing says how far the host runs ahead, so every step counts, at the
    # cited cost's middle and slow end; at the fast end the host is ahead throughout
    steps = 2 * BLOCK_STEPS + ROOT_STEPS
    assert hooks.seconds == pytest.approx(steps * (HOST_STEP_COST_RANGE_S[0] * HOST_STEP_COST_RANGE_S[1]) ** 0.5)
    assert hooks.range_s == (0.0, pytest.approx(steps * HOST_STEP_COST_RANGE_S[1]))
    # NCCL's SMs: not slowed at the fast end, slowed at the slow end
    assert costs["compute_slowed"].range_s[0] == 0.0 < costs["compute_slowed"].range_s[1]
    copies = costs["all_gather_copy_out"]
    assert copies.range_s[0] < copies.seconds < copies.range_s[1]


def test_the_recompute_of_checkpointed_groups_is_compute_not_compute_slowed():
    from topoprof.model.strategies.resolve import resolve
    from topoprof.model.strategies.steps import fsdp_job
    from topoprof.workload.checkpointing import parse_checkpointing

    priced = modelled((0.008, 0.01, 0.012), host_s=0.002, device_s=0.008, recompute_s=(0.002, 0.0025, 0.003))
    inputs = _gpu_inputs(micro_batch_time_s=None, modelled=priced,
                         workload=Workload(HAND, checkpointing=parse_checkpointing("full")))
    fast = resolve(inputs, "fast")
    job = fsdp_job(fast, COMM, "fsdp_full_shard")
    assert sum(job.setting.recompute_s) > 0  # the recompute is placed in the timeline
    # at the fast end NCCL's kernels slow nothing: what compute runs is all the model's own
    assert predict(inputs).fsdp_costs["compute_slowed"].range_s[0] == 0.0


def test_hooks_priced_from_the_model_s_ops_count_only_what_the_device_does_not_hide():
    from topoprof.model.strategies.resolve import resolve
    from topoprof.model.strategies.steps import fsdp_setting

    # device-bound: 3/4 of the micro-batch hides host work
    inputs = _gpu_inputs(micro_batch_time_s=None, modelled=modelled((0.008, 0.01, 0.012), host_s=0.002, device_s=0.008))
    for end, seconds in ((None, 0.01), ("slow", 0.012), ("fast", 0.008)):
        setting = fsdp_setting(resolve(inputs, end))
        assert setting.host_hidden_s == pytest.approx(seconds * 0.75)
    host_bound = _gpu_inputs(micro_batch_time_s=None, modelled=modelled((0.008, 0.01, 0.012), host_s=0.01,
                                                                         device_s=0.004))
    assert fsdp_setting(resolve(host_bound)).host_hidden_s == 0.0
    measured = fsdp_setting(resolve(_gpu_inputs()))
    assert measured.host_hidden_s is None  # all counted


def test_without_a_gpu_the_hooks_stay_unpriced_and_a_calibration_replaces_the_parts():
    cpu = predict(_gpu_inputs(gpu=None)).fsdp_costs
    assert cpu["fsdp_hooks"].seconds == 0.0 and cpu["all_gather_copy_out"].seconds == 0.0  # no bandwidth either
    measured = predict(_gpu_inputs(fsdp_forward_overhead_s=1e-3, fsdp_backward_overhead_s=2e-3,
                                   fsdp_backward_no_sync_overhead_s=1e-3, fsdp_unshard_overhead_s=5e-4)).fsdp_costs
    assert "fsdp_hooks" not in measured and measured["measured"].seconds == pytest.approx(3 * 3e-3 + 2 * 5e-4)


def test_any_measured_part_of_fsdps_own_work_drops_the_note_that_it_is_unpriced():
    from topoprof.report.text_model import fsdp_note

    assert fsdp_note(model_report())
    for key in ("fsdp_forward_overhead_s", "fsdp_backward_overhead_s", "fsdp_unshard_overhead_s"):
        assert fsdp_note(model_report(inputs={key: {"value": 1e-3, "source": "validate"}})) == []


def test_hsdp_shows_its_all_reduce_across_the_replicas():
    inputs = _gpu_inputs(nodes=2)
    h = predict(inputs).hsdp
    replicate = inputs.cluster.comm.at_shape(2, 1)
    assert h.shard_gpus == 2 and h.shard_bus_bandwidth_gbps == 10.0
    assert h.replicas == 2 and h.replicate_bus_bandwidth_gbps == 1.0 and h.all_reduces == 3
    # each group's shard all-reduced by every shard rank at once: the group's bytes at the node's NICs
    assert h.all_reduce_s == pytest.approx(sum(replicate.allreduce_s(g.padded_numel(2) * 4) for g in PLAN.groups))
    assert predict(_gpu_inputs()).hsdp is None
    from topoprof.report.text_fsdp import hsdp_line

    line = hsdp_line(read_model_report(model_payload(plan_model(inputs, {}, sweep=False))))[0]
    assert "all-reduced across the 2 nodes" in line and "(1 GB/s per node)" in line


@pytest.mark.slow
def test_the_model_command_shows_fsdps_parts_and_hsdps_levels(model_runs):
    run = model_runs("--preset", "llama3-8b", "--gpu", "h100-sxm", "--tokens", "8192", "--nodes", "4",
                     "--gpus-per-node", "8", "--link-bandwidth", "450", "--network-bandwidth", "50",
                     "--micro-batch-time", "1.0", "--no-sweep")
    assert run.returncode == 0, run.stderr
    text = run.text
    assert "FSDP's own work per group" not in text  # priced for the GPU named: no caveat
    assert "hsdp: all-gathers and reduce-scatters over the 8 GPUs of a node (450 GB/s ring)" in text
    assert "all-reduced across the 4 nodes" in text and "(50 GB/s per node)" in text
    assert "Where FSDP's cost goes in fsdp_full_shard" in text
    doc = run.doc
    assert doc["hsdp"]["all_reduces"] == 33 and doc["hsdp"]["all_reduce_s"] > 0
    assert {"fsdp_hooks", "all_gather_copy_in", "reduce_scatter_copy_in"} <= set(doc["fsdp_costs"])
    assert any(a.startswith("HSDP: per group") for a in doc["assumptions"])
    assert "the m nodes, the node's NICs shared by its g ranks" in doc["strategies"]["hsdp"]["formula"]
