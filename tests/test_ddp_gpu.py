"""What DDP costs on a GPU beyond its all-reduces: each part's arithmetic, the accounting that
ties the parts to the step times, the ranges of a what-if, and validate's measurements of them."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from topoprof.model.comm.collectives import RingComm
from topoprof.model.compute.timing import Compute
from topoprof.model.ddp.gpu_costs import (
    ddp_kernels,
    expected_max_normal,
    expected_range_normal,
    gpu_speed_spread_range,
    nccl_sm_slowdown_range,
    straggler_wait_s,
)
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.model_report import read_model_report
from topoprof.model.strategies.predict import predict
from topoprof.model.strategies.resolve import DDP_GPU_UNPRICED_NOTE
from topoprof.model.strategies.steps import ddp_one_gpu_s
from topoprof.workload.presets import get_preset


def test_expected_maximum_of_normals():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    # tabulated: E[max of 8] = 1.4236, of 32 = 2.0697 (Harter 1961)
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-3)
    assert expected_max_normal(32) == pytest.approx(2.0697, abs=1e-3)
    values = [expected_max_normal(n) for n in (1, 2, 4, 8, 16, 64)]
    assert values == sorted(values)


def test_kernels_per_synced_micro_batch():
    # a copy in and a copy out per gradient, one all-reduce per bucket; the bucket view drops the copy out
    assert ddp_kernels(161, 5, False) == 327
    assert ddp_kernels(161, 5, True) == 166


def test_nccl_holds_two_sms_per_ring():
    assert nccl_sm_slowdown_range(80, 1) == (1.0, 80 / 78)
    assert nccl_sm_slowdown_range(132, 6) == (1.0, 132 / 120)
    with pytest.raises(ValueError):
        nccl_sm_slowdown_range(8, 4)


def test_gpu_speed_spread_comes_from_the_cited_cluster_spreads():
    low, high = gpu_speed_spread_range()
    span = expected_range_normal(25_000)
    assert (low * span, high * span) == (pytest.approx(0.08), pytest.approx(0.22))


def test_straggler_wait_synced_vs_no_sync():
    wait = straggler_wait_s
    c, k = 0.1, 8
    # a persistently slower GPU is slower on every micro-batch: no_sync saves nothing of it
    assert wait(8, c, k, k, 0.02, 0.0) == pytest.approx(wait(8, c, k, 1, 0.02, 0.0))
    assert wait(8, c, k, k, 0.02, 0.0) == pytest.approx(k * c * 0.02 * expected_max_normal(8))
    # jitter is waited for at every sync: once per step with no_sync, on a sum whose spread grows as sqrt(k)
    synced, once = wait(8, c, k, k, 0.0, 0.005), wait(8, c, k, 1, 0.0, 0.005)
    assert once == pytest.approx(synced / math.sqrt(k))
    # more ranks, longer wait; one rank, none
    assert wait(1, c, k, k, 0.02, 0.005) == 0.0
    assert wait(16, c, k, k, 0.02, 0.005) > wait(8, c, k, k, 0.02, 0.005) > wait(2, c, k, k, 0.02, 0.005)
    # compute measured as the slowest of the same number of ranks already holds the synced wait
    assert wait(4, c, k, k, 0.02, 0.005, basis_world_size=4) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError):
        wait(4, c, 8, 3, 0.02, 0.005)


def _inputs(compute: Compute, world: int = 8, accum: int = 1, **work) -> ModelInputs:
    return ModelInputs(Workload(get_preset("gpt2"), micro_batch_size=4, tokens_per_micro_batch=4096, **work),
                       compute, Cluster(RingComm(100.0, 3.4, world), 1, world), accumulation_steps=accum)


V100 = Compute(micro_batch_time_s=0.2, gpu="v100-sxm2", precision="fp32", optimizer_time_s=0.002)


@pytest.mark.parametrize("accum", [1, 4])
def test_the_parts_add_up_to_what_ddp_adds(accum):
    pred = predict(_inputs(V100, accum=accum))
    single, synced = pred.strategies["single"].step_time_s, pred.strategies["ddp_synced"].step_time_s
    parts = sum(c.seconds for c in pred.ddp_costs.values())
    assert accum * parts == pytest.approx(synced - single, rel=1e-9)
    for name, cost in pred.ddp_costs.items():
        if cost.range_s is not None:
            assert cost.range_s[0] <= cost.seconds <= cost.range_s[1], name


def test_a_gpu_what_if_is_a_range_and_a_calibration_makes_it_one_number():
    pred = predict(_inputs(V100))
    for part in ("ddp_kernels", "slowest_rank", "backward_slowed"):
        assert pred.ddp_costs[part].range_s is not None, part
    low, high = pred.strategies["ddp_synced"].range.step_time_s
    assert low < pred.strategies["ddp_synced"].step_time_s < high
    # a calibration as validate writes it: DDP's kernels, the ranks' spread, the slowdown beside an
    # all-reduce, and the memory bandwidth its copies reach
    measured = replace(V100, ddp_kernel_s=6e-6, rank_speed_spread=0.01, compute_slowdown_during_comm=1.02,
                       memory_bandwidth_gbps=800.0)
    again = predict(_inputs(measured))
    assert all(c.range_s is None for c in again.ddp_costs.values())
    # FSDP's hooks, which nothing measured, still make the prediction a what-if; DDP's rows are
    # one number within it
    lo, hi = again.strategies["ddp_synced"].range.step_time_s
    assert lo == again.strategies["ddp_synced"].step_time_s == hi
    fsdp = {"fsdp_forward_overhead_s": 1e-4, "fsdp_backward_overhead_s": 1e-4,
            "fsdp_backward_no_sync_overhead_s": 1e-4, "fsdp_unshard_overhead_s": 1e-4}
    assert predict(_inputs(replace(measured, **fsdp))).strategies["ddp_synced"].range is None


def test_gradient_as_bucket_view_halves_the_copy_kernels():
    tensors = len(get_preset("gpt2").tensors)
    plain = predict(_inputs(V100)).ddp_costs["ddp_kernels"].seconds
    view = predict(_inputs(V100, gradient_as_bucket_view=True)).ddp_costs["ddp_kernels"].seconds
    buckets = predict(_inputs(V100)).buckets.count
    assert plain / view == pytest.approx((2 * tensors + buckets) / (tensors + buckets))


def test_without_a_gpu_the_gpu_parts_are_not_priced_and_it_says_so():
    pred = predict(_inputs(Compute(micro_batch_time_s=0.2, optimizer_time_s=0.0)))
    assert pred.ddp_costs["ddp_kernels"].seconds == 0 and pred.ddp_costs["slowest_rank"].seconds == 0
    assert DDP_GPU_UNPRICED_NOTE in pred.warnings


def test_ddp_on_one_gpu_costs_its_kernels_and_copies():
    inputs = _inputs(replace(V100, ddp_kernel_s=5e-6), world=1)
    layout = inputs.workload.layout
    from topoprof.model.ddp.buckets import ddp_buckets

    kernels = ddp_kernels(len(layout.tensors), len(ddp_buckets(layout, 4, None)), False)
    traffic = 4 * 4 * layout.params / 900e9
    assert ddp_one_gpu_s(inputs) == pytest.approx(0.2 + kernels * 5e-6 + traffic)


def test_nothing_to_gain_only_below_five_percent_at_the_top_of_the_range():
    from topoprof.model.strategies.model_plan import plan_model
    from topoprof.model.strategies.model_report import model_payload
    from topoprof.report.text_model import ddp_cost_share, render_model

    heavy = read_model_report(model_payload(plan_model(_inputs(replace(V100, micro_batch_time_s=50.0)),
                                                       {"link_bandwidth_gbps": 100}, sweep=False)))
    assert ddp_cost_share(heavy)[2] < 5 and "nothing worth attacking" in render_model(heavy)
    light = read_model_report(model_payload(plan_model(_inputs(replace(V100, micro_batch_time_s=0.02)),
                                                       {"link_bandwidth_gbps": 100}, sweep=False)))
    assert ddp_cost_share(light)[2] >= 5 and "nothing worth attacking" not in render_model(light)
    assert "Where DDP's cost goes" in render_model(light)


def _rotation(levels: list[float], jitter: list[list[float]]) -> list[dict]:
    """One rotation's calibration records: rank r's micro-batch j takes levels[r] + jitter[r][j]."""
    out = []
    for level, noise in zip(levels, jitter):
        times = [level + e for e in noise]
        out.append({"calibration": {"forward_s": [t / 3 for t in times], "backward_s": [2 * t / 3 for t in times]}})
    return out


def test_validate_splits_the_ranks_spread_into_speed_and_jitter():
    from topoprof.model.validate.rotations import rank_spread

    # rank 1 is 10 % slower on every micro-batch, nothing else moves
    steady = rank_spread([_rotation([0.1, 0.11], [[0.0] * 4, [0.0] * 4])] * 3)
    assert steady["rank_jitter"] == pytest.approx(0.0, abs=1e-10)
    assert steady["rank_speed_spread"] == pytest.approx(0.005 * math.sqrt(2) / 0.105)
    assert steady["rank_spread_world_size"] == 2
    # the same speeds with jitter that averages out on each rank: the jitter shows, the levels stay
    noisy = rank_spread([_rotation([0.1, 0.1], [[0.002, -0.002, 0.002, -0.002], [-0.002, 0.002, -0.002, 0.002]])])
    assert noisy["rank_jitter"] > 0 and noisy["rank_speed_spread"] == 0.0
    # 8 residuals of +-0.002 s over (2-1)(4-1) degrees of freedom, as a share of the 0.1 s micro-batch
    assert noisy["rank_jitter"] == pytest.approx((8 * 0.002 ** 2 / 3) ** 0.5 / 0.1)
    assert rank_spread([_rotation([0.1], [[0.0, 0.0]])]) is None


def test_validate_carries_the_copy_cost_per_kernel_when_it_exceeds_the_traffic():
    from topoprof.model.validate.run import _copy_costs

    msg = {"params": 1_000_000, "memory_bandwidth_gbps": 16.0, "rotations": [[{"bucket_numel": [250_000] * 4}]]}
    traffic_s = 16e6 / 16e9
    out = _copy_costs(traffic_s + 0.0054, msg, tensors=50)
    assert out["ddp_kernel_s"] == pytest.approx(0.0054 / (2 * 50 + 4)) and "ddp_copy_bandwidth_gbps" not in out
    # why there is no copy rate of its own: the traffic moves at the measured bandwidth
    assert "at the measured 16 GB/s" in out["ddp_copies_basis"] and "51.9 us per kernel" in out["ddp_copies_basis"]
    # faster than the measured bandwidth: one effective copy rate, as before
    faster = _copy_costs(traffic_s / 2, msg, tensors=50)
    assert faster["ddp_copy_bandwidth_gbps"] == pytest.approx(32.0)
    assert "one effective copy rate" in faster["ddp_copies_basis"]


def test_the_what_if_kernel_range_holds_the_tools_own_gpu_measurement():
    """A range the tool's own GPU measurement falls outside of is not a range: `validate` on a real
    H200 measured DDP's cost per kernel (the committed record) inside the what-if's cited span."""
    import ast
    import json
    import os

    from topoprof.model.ddp.gpu_costs import KERNEL_COST_RANGE_S

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports",
                        "gpu-nvidia-h200-20261126", "summary.json")
    with open(path) as f:
        tests = {t["test"]: t for t in json.load(f)["tests"]}
    measured = ast.literal_eval(tests["test_validate_on_one_gpu_measures_ddps_own_costs"]["measured"]["calibration"])
    low, high = KERNEL_COST_RANGE_S
    assert low <= measured["ddp_kernel_s"] <= high, (measured["ddp_kernel_s"], KERNEL_COST_RANGE_S)
