"""FSDP2's timeline (topoprof.model.fsdp) on hand-built cases, its groups on the presets, and
`topoprof model` listing the FSDP strategies."""
from __future__ import annotations

import pytest
from helpers.cli import topoprof
from helpers.fsdp_layouts import B0, B1, COMM, HAND, PLAN, ROOT
from helpers.model_reports import model_report

from topoprof.errors import InputError
from topoprof.model.comm.collectives import HierarchicalComm, MeasuredComm, RingComm
from topoprof.model.compute.timing import Compute
from topoprof.model.fsdp.plan import CHUNKS_PER_GROUP, fsdp_plan
from topoprof.model.fsdp.timeline import FsdpSetting, collective_times, fsdp_micro_batch, fsdp_step
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.predict import predict
from topoprof.model.strategies.results import StrategyResult, Unavailable
from topoprof.specs.fsdp_modes import FSDP_ONE_NODE, HSDP_ONE_NODE_REASON, MODES
from topoprof.workload.presets import get_preset, synthetic_layout


def _setting(**kw):
    base = dict(forward_s=1.0, backward_s=2.0, param_bytes=4, reduce_bytes=4, memory_bandwidth_gbps=None)
    return FsdpSetting(**{**base, **kw})


def _coll(setting, comm=COMM):
    return collective_times(PLAN, setting, comm)


def _kinds(mb, kind):
    return [op for op in mb.ops if op.kind == kind]


def test_groups_one_per_block_and_the_root_last():
    assert [g.name for g in PLAN.groups] == ["blocks.0", "blocks.1", "root"]
    assert [g.numel for g in PLAN.groups] == [4000, 4000, 3000]
    assert PLAN.forward_order == (ROOT, B0, B1) and PLAN.post_forward_order == (B0, B1, ROOT)
    assert sum(s.forward_share for s in PLAN.segments) == pytest.approx(1.0)
    assert sum(s.backward_share for s in PLAN.segments) == pytest.approx(1.0)


@pytest.mark.parametrize("name, blocks", [("gpt2", 12), ("gpt3-xl", 24), ("bert-base", 12), ("llama-7b", 32),
                                          ("resnet50", 4)])
def test_preset_groups(name, blocks):
    layout = get_preset(name)
    plan = fsdp_plan(layout)
    assert len(plan.groups) == blocks + 1 and plan.groups[-1].name == "root"
    assert sum(g.numel for g in plan.groups) == layout.params


def test_params_layout_groups_chunks():
    layout = synthetic_layout(1_000_000)
    plan = fsdp_plan(layout)
    assert len(plan.groups) == 100 // CHUNKS_PER_GROUP + 1 and plan.groups[-1].numel == 0
    assert sum(g.numel for g in plan.groups) == layout.params


def test_fsdp_unit_groups_its_children_and_refuses_a_module_that_wraps_nothing():
    plan = fsdp_plan(get_preset("llama-7b"), unit="model.layers")
    assert len(plan.groups) == 33
    with pytest.raises(InputError, match="--fsdp-unit nothing"):
        fsdp_plan(get_preset("llama-7b"), unit="nothing")


def test_blocking_backend_adds_every_collective_to_the_compute():
    """gloo: each collective blocks the thread, so the micro-batch is compute plus every collective."""
    setting = _setting(blocking=True)
    coll = _coll(setting)
    mode = MODES["fsdp_full_shard"]
    mb = fsdp_micro_batch(PLAN, setting, coll, mode, synced=True)
    forward_ag = sum(coll.all_gather_s)              # every group, the root included
    backward_ag = coll.all_gather_s[B0] + coll.all_gather_s[B1]  # resharded blocks only
    rs = sum(coll.reduce_scatter_s)
    assert mb.wall_s == pytest.approx(3.0 + forward_ag + backward_ag + rs)
    assert mb.compute_busy_s == pytest.approx(3.0) and mb.exposed_s == pytest.approx(forward_ag + backward_ag + rs)
    for a, b in zip(mb.ops, mb.ops[1:]):  # one at a time
        assert b.start_s >= a.end_s - 1e-12


def test_prefetch_hides_all_gathers_behind_compute_but_not_the_first_nor_the_last_reduce_scatter():
    setting = _setting()
    coll = _coll(setting)
    mode = MODES["fsdp_full_shard"]
    mb = fsdp_micro_batch(PLAN, setting, coll, mode, synced=True)
    blocking = fsdp_micro_batch(PLAN, _setting(blocking=True), coll, mode, synced=True)
    assert mb.exposed_s < blocking.exposed_s
    # the root's all-gather opens the forward with nothing to hide behind, and so does the first
    # block's (the embedding lookup before it computes ~nothing); at the end the root's
    # reduce-scatter runs after all backward compute (the final callback), after the first block's,
    # whose buffer it waits for, with the same nothing (the embedding's backward) to hide behind
    assert mb.exposed_s == pytest.approx(coll.all_gather_s[ROOT] + coll.all_gather_s[B0]
                                         + coll.reduce_scatter_s[B0] + coll.reduce_scatter_s[ROOT])
    first = mb.ops[0]
    assert first.kind == "all_gather" and first.group == ROOT and first.start_s == 0.0
    last = mb.ops[-1]
    assert last.kind == "reduce_scatter" and last.group == ROOT and last.end_s == pytest.approx(mb.wall_s)


def test_all_gathers_and_reduce_scatters_share_one_channel_in_issue_order():
    setting = _setting(forward_s=1e-6, backward_s=1e-6)  # communication-bound: the channel is the path
    coll = _coll(setting)
    mb = fsdp_micro_batch(PLAN, setting, coll, MODES["fsdp_full_shard"], synced=True)
    for a, b in zip(mb.ops, mb.ops[1:]):
        assert b.start_s >= a.end_s - 1e-12
    assert mb.wall_s >= 2 * sum(coll.all_gather_s) - coll.all_gather_s[ROOT] + sum(coll.reduce_scatter_s) - 1e-12


def test_no_sync_reduces_only_on_the_last_micro_batch():
    setting = _setting()
    coll = _coll(setting)
    step = fsdp_step(PLAN, setting, coll, MODES["fsdp_full_shard_no_sync"], 4, 0.1)
    counts = [len(_kinds(mb, "reduce_scatter")) for mb in step.micro_batches]
    assert counts == [0, 0, 0, 3]
    synced = fsdp_step(PLAN, setting, coll, MODES["fsdp_full_shard"], 4, 0.1)
    assert [len(_kinds(mb, "reduce_scatter")) for mb in synced.micro_batches] == [3, 3, 3, 3]
    assert step.step_s < synced.step_s
    # every micro-batch all-gathers in forward either way (resharded after backward)
    assert all(len(_kinds(mb, "all_gather")) == 5 for mb in step.micro_batches)


def test_shard_grad_op_has_no_backward_all_gather():
    setting = _setting(blocking=True)
    coll = _coll(setting)
    full = fsdp_micro_batch(PLAN, setting, coll, MODES["fsdp_full_shard"], True)
    zero2 = fsdp_micro_batch(PLAN, setting, coll, MODES["fsdp_shard_grad_op"], True)
    assert len(_kinds(full, "all_gather")) == 3 + 2 and len(_kinds(zero2, "all_gather")) == 3
    assert full.wall_s - zero2.wall_s == pytest.approx(coll.all_gather_s[B0] + coll.all_gather_s[B1])


def test_hsdp_adds_an_all_reduce_across_replicas_per_group():
    intra, inter = RingComm(100.0, 0.0, 2), RingComm(1.0, 0.0, 2)
    comm = HierarchicalComm(intra, inter, 2, 2)
    setting = _setting()
    shard, replicate = comm.at_shape(1, 2), comm.at_shape(2, 1)
    coll = collective_times(PLAN, setting, shard, replicate)
    assert coll.all_reduce_s == tuple(replicate.allreduce_s(g.numel * 4) for g in PLAN.groups)
    mb = fsdp_micro_batch(PLAN, setting, coll, MODES["hsdp"], True)
    ars = _kinds(mb, "all_reduce")
    assert [op.group for op in ars] == [B1, B0, ROOT]
    for ar in ars:  # each after its group's reduce-scatter
        rs = next(op for op in mb.ops if op.kind == "reduce_scatter" and op.group == ar.group)
        assert ar.start_s >= rs.end_s - 1e-12
    assert mb.wall_s >= ars[-1].end_s - 1e-12
    quiet = fsdp_micro_batch(PLAN, setting, coll, MODES["hsdp_no_sync"], False)
    assert not _kinds(quiet, "all_reduce") and not _kinds(quiet, "reduce_scatter")


def test_mixed_precision_sets_the_bytes_each_collective_moves():
    bf16 = _coll(_setting(param_bytes=2, reduce_bytes=4))
    fp32 = _coll(_setting())
    assert bf16.all_gather_s == tuple(t / 2 for t in fp32.all_gather_s)
    assert bf16.reduce_scatter_s == fp32.reduce_scatter_s


def test_gloo_reduce_scatter_is_an_all_reduce_unless_measured():
    setting = _setting(reduce_scatter_as_allreduce=True)
    coll = _coll(setting)
    assert coll.reduce_scatter_s == tuple(COMM.allreduce_s(g.numel * 4) for g in PLAN.groups)
    measured = MeasuredComm(latency_us=0.0, algbw_gbps=1.0, world_size=2, points=((1e3, 10.0), (1e6, 1000.0)),
                            curves=(("reduce_scatter", ((1e3, 7.0), (1e6, 7000.0))),))
    coll = collective_times(PLAN, setting, measured)
    assert coll.reduce_scatter_s[B0] == pytest.approx(7.0 * 16000 / 1e3 * 1e-6)


def _inputs(nodes=1, gpn=2, backend="nccl", k=4, **work):
    comm = RingComm(10.0, 0.0, gpn) if nodes == 1 else HierarchicalComm(RingComm(10.0, 0.0, gpn),
                                                                        RingComm(1.0, 0.0, nodes), nodes, gpn)
    return ModelInputs(Workload(HAND, **work), Compute(micro_batch_time_s=0.01, optimizer_time_s=0.004),
                       Cluster(comm, nodes, gpn, backend=backend), k)


def test_strategies_list_fsdp_beside_ddp():
    p = predict(_inputs())
    for name in FSDP_ONE_NODE:
        assert isinstance(p.strategies[name], StrategyResult), name
    assert p.strategies["hsdp"] == Unavailable(HSDP_ONE_NODE_REASON)
    two_nodes = predict(_inputs(nodes=2))
    assert isinstance(two_nodes.strategies["hsdp"], StrategyResult)
    # the optimizer steps only the local shard
    step = p.strategies["fsdp_shard_grad_op"]
    assert step.step_time_s > 4 * 0.01 + 0.004 / 2


def test_gloo_prices_no_overlap():
    nccl = predict(_inputs()).strategies["fsdp_full_shard"]
    gloo = predict(_inputs(backend="gloo")).strategies["fsdp_full_shard"]
    assert gloo.comm_exposed_s > nccl.comm_exposed_s and gloo.step_time_s > nccl.step_time_s


def _cli(*args):
    return topoprof("model", *args, timeout=120)


@pytest.mark.slow
def test_model_lists_fsdp_strategies_with_step_times(model_runs):
    run = model_runs("--preset", "llama-7b", "--gpu", "h100-sxm", "--world-size", "8", "--tokens", "4096",
                     "--link-bandwidth", "370")
    assert run.returncode == 0, run.stderr
    text = run.text
    for name in FSDP_ONE_NODE:
        row = next(line for line in text.splitlines() if line.startswith(name + " "))
        assert "n/a" not in row
    assert "hsdp, hsdp_no_sync: n/a" in text
    doc = run.doc
    assert doc["inputs"]["fsdp_param_bytes"]["value"] == 2 and doc["inputs"]["fsdp_reduce_bytes"]["value"] == 4
    for name in FSDP_ONE_NODE:
        assert doc["strategies"][name]["step_time_s"] > 0
        assert len(doc["sweep"]["strategies"][name]) == len(doc["sweep"]["accum"])


def test_model_refuses_an_fsdp_unit_that_wraps_nothing():
    proc = _cli("--preset", "gpt2", "--micro-batch-time", "0.1", "--world-size", "2", "--link-bandwidth", "10",
                "--fsdp-unit", "nothing.here")
    assert proc.returncode == 2 and "--fsdp-unit" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_model_text_says_fsdps_own_work_is_unpriced_only_without_a_gpu_or_a_measurement():
    from topoprof.report.text_model import _fsdp_heading

    plain = {"fsdp_groups": {"grouping": "2 groups"}}
    assert "is not priced: no GPU named and nothing measured it" in _fsdp_heading(model_report(inputs=plain))
    measured = {**plain, "fsdp_forward_overhead_s": {"value": 1e-4, "source": "calibration"}}
    assert "not priced" not in _fsdp_heading(model_report(inputs=measured))
    priced = {**plain, "fsdp_host_step_s": {"value": 8e-6, "source": "what-if range"}}
    assert "not priced" not in _fsdp_heading(model_report(inputs=priced))
