"""What validate's rotations reduce to: the calibration with its spread, a mode's measured step
and its parts, the communication slowdown per size, on hand-made records whose answers are known."""
from __future__ import annotations

import statistics

import pytest

from topoprof.model.validate import rotations as rot


def _calibration(c: float, ddp: float, opt: float = 0.01, n: int = 4, copies: float = 0.002) -> dict:
    # forward is a third of each micro-batch, as everywhere below
    # two halves around the steps (probes/ranks/validation.py): an optimizer time and a DDP pair each
    return {"forward_s": [c / 3] * n, "backward_s": [2 * c / 3] * n, "optimizer_s": [opt, opt],
            "ddp_forward_s": [ddp / 3] * 2, "ddp_backward_s": [2 * ddp / 3] * 2,
            "local_forward_s": [ddp / 3] * 2, "local_backward_s": [2 * ddp / 3 + copies] * 2,
            "ddp_pairs": [0, n // 2]}


def _step(t0: float, micro: list[tuple[float, float, float, float]], opt: tuple[float, float]) -> dict:
    """micro: (forward start, backward start, last bucket launch or None, backward end), relative."""
    return {"t0": t0, "step_s": opt[1], "zero_grad": [0.0, 0.0001], "optimizer": list(opt),
            "micro": [{"forward": [f, b], "backward": [b, e],
                       "buckets": [] if launch is None else [[0, 10, launch - 0.002, launch - 0.001],
                                                             [1, 20, launch, e - 0.001]]}
                      for f, b, launch, e in micro]}


def _rank(c: float, ddp: float, steps: dict, interference: dict | None = None) -> dict:
    record = {"calibration": _calibration(c, ddp), "modes": steps, "bucket_numel": [10, 20],
              "allreduce_alone_s": [0.001, 0.002]}
    if interference:
        record["interference"] = interference
    return record


def test_compute_is_the_slower_rank_micro_batch_by_micro_batch():
    rotation = [_rank(0.030, 0.031, {}), _rank(0.036, 0.037, {})]
    cal = rot.calibration([rotation])
    assert cal["micro_batch_time_s"].value == pytest.approx(0.036)
    assert cal["forward_s"].value == pytest.approx(0.012) and cal["backward_s"].value == pytest.approx(0.024)


def test_a_rotation_takes_its_level_and_the_run_slow_spells_rate():
    # Four rotations at 30 ms per micro-batch; one has a slow spell in one micro-batch (90 ms).
    quiet = [[_rank(0.030, 0.031, {}), _rank(0.030, 0.031, {})] for _ in range(3)]
    spell = [_rank(0.030, 0.031, {}), _rank(0.030, 0.031, {})]
    spell[0]["calibration"]["forward_s"][2] = 0.030  # 90 ms = 30 forward + 60 backward
    spell[0]["calibration"]["backward_s"][2] = 0.060
    run = quiet + [spell]
    samples = [0.030] * 15 + [0.090]
    shift = statistics.fmean(samples) - statistics.median(samples)
    for one in run:  # every rotation: its own median level plus the run's spell cost
        assert rot.calibration([one], run)["micro_batch_time_s"].value == pytest.approx(0.030 + shift)


def test_ddp_costs_are_paired_differences_that_a_slow_spell_does_not_move():
    run = [[_rank(0.030, 0.031, {}), _rank(0.030, 0.031, {})] for _ in range(4)]
    # a slow spell under one rank's DDP passes: both its pairs are off, the median is not
    cal = run[1][0]["calibration"]
    for key in ("ddp_backward_s", "local_backward_s"):
        cal[key] = [x + 0.040 for x in cal[key]]
    costs = rot.ddp_costs(run)
    assert costs["ddp_overhead_s"].value == pytest.approx(0.001)   # through DDP in no_sync, less bare
    assert costs["ddp_copies_s"].value == pytest.approx(0.002)     # synced without comm, less no_sync
    assert costs["ddp_overhead_s"].n == 16 and costs["ddp_overhead_s"].high == pytest.approx(0.041)


def test_comm_slowdown_is_a_ratio_of_sums_per_size():
    def sample(beside):
        return {"compute_slowdown": 1.5, "allreduce_beside_s": beside, "allreduce_alone_s": [0.001, 0.010],
                "bytes": [40, 4000]}

    run = [[_rank(0.03, 0.03, {}, sample([0.004, 0.020])), _rank(0.03, 0.03, {}, sample([0.005, 0.020]))],
           [_rank(0.03, 0.03, {}, sample([0.001, 0.030])), _rank(0.03, 0.03, {}, sample([0.002, 0.010]))]]
    (small, f_small), (large, f_large) = rot.comm_slowdowns(run)
    assert (small, large) == (40, 4000)
    assert f_small.value == pytest.approx((0.005 + 0.002) / 0.002)  # slower rank, summed over rotations
    assert f_large.value == pytest.approx((0.020 + 0.030) / 0.020)
    assert f_small.n == 2 and f_small.low == pytest.approx(2.0) and f_small.high == pytest.approx(5.0)
    assert rot.calibration(run)["comm_slowdown_during_compute"].value == f_large.value  # the largest size


def test_interference_sampled_in_some_rotations_only_still_counts():
    # sampled every other rotation: the first timed rotation may have none
    sample = {"compute_slowdown": 1.5, "allreduce_beside_s": [0.003], "allreduce_alone_s": [0.001], "bytes": [40]}
    run = [[_rank(0.03, 0.03, {}), _rank(0.03, 0.03, {})],
           [_rank(0.03, 0.03, {}, sample), _rank(0.03, 0.03, {}, sample)]]
    ((size, factor),) = rot.comm_slowdowns(run)
    assert size == 40 and factor.value == pytest.approx(3.0) and factor.n == 1
    assert rot.calibration(run)["comm_slowdown_during_compute"].value == pytest.approx(3.0)


def test_waiting_for_a_slower_rank_is_compute_and_the_tail_is_exposed():
    # Rank 1 starts the step 1 ms after rank 0 (monotonic clock) and launches its last bucket
    # later: rank 0's backward waits for it; that wait is compute, the rest after it is exposed.
    r0 = _step(100.000, [(0.000, 0.010, 0.030, 0.036)], (0.037, 0.040))
    r1 = _step(100.001, [(0.000, 0.010, 0.032, 0.035)], (0.036, 0.039))
    rotation = [{"modes": {"ddp_synced": r0}}, {"modes": {"ddp_synced": r1}}]
    parts = rot.step_parts(rotation, "ddp_synced", 0)
    # rank 1's launch at 100.033 is 0.033 into rank 0's step
    assert parts["compute"] == pytest.approx(0.010 + (0.033 - 0.010))
    assert parts["exposed_comm"] == pytest.approx(0.036 - 0.033)
    assert parts["optimizer"] == pytest.approx(0.003)
    assert sum(parts.values()) == pytest.approx(0.040)  # the parts add up to the step


def test_a_micro_batch_without_communication_is_all_compute():
    step = _step(5.0, [(0.0, 0.01, None, 0.03), (0.03, 0.04, None, 0.06)], (0.06, 0.07))
    parts = rot.step_parts([{"modes": {"ddp_no_sync": step}}], "ddp_no_sync", 0)
    assert parts == pytest.approx({"compute": 0.06, "exposed_comm": 0.0, "optimizer": 0.01, "other": 0.0})


def test_measured_mode_is_the_slowest_rank_median_and_its_parts_add_up():
    def rotation(seconds):
        fast = _step(1.0, [(0.0, 0.01, 0.03, 0.035)], (0.036, seconds - 0.002))
        slow = _step(1.0, [(0.0, 0.01, 0.03, 0.035)], (0.036, seconds))
        return [{"modes": {"ddp_synced": fast}}, {"modes": {"ddp_synced": slow}}]

    measured = rot.measured_mode([rotation(0.05), rotation(0.07), rotation(0.06)], "ddp_synced")
    assert measured["steps"] == [0.05, 0.07, 0.06] and measured["step"].value == 0.06
    assert measured["middle"] == 2
    assert sum(measured["parts"].values()) == pytest.approx(0.06)
    assert 0 < measured["parts_cover_pct"] <= 100


def test_each_ddp_sample_is_paired_with_the_micro_batch_it_repeats():
    # the half after the steps ran slower (40 ms): its DDP sample pairs with its own plain one
    rank = _rank(0.030, 0.031, {})
    cal = rank["calibration"]
    cal["forward_s"][2:] = [0.040 / 3] * 2
    cal["backward_s"][2:] = [2 * 0.040 / 3] * 2
    cal["ddp_forward_s"][1], cal["ddp_backward_s"][1] = 0.041 / 3, 2 * 0.041 / 3
    cal["local_forward_s"][1], cal["local_backward_s"][1] = 0.041 / 3, 2 * 0.041 / 3 + 0.002
    costs = rot.ddp_costs([[rank]])
    assert costs["ddp_overhead_s"].low == pytest.approx(0.001) and costs["ddp_overhead_s"].high == pytest.approx(0.001)
    assert costs["ddp_copies_s"].value == pytest.approx(0.002)
