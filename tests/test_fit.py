"""Latency/bandwidth fit on synthetic rows (exact, noisy, degenerate) and on its reporting."""
from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoprof.errors import InputError
from topoprof.measure.fit import Fit, bus_bandwidth_gbps, fit_all, fit_rows, predict_time_us
from topoprof.specs.collective_spec import BenchRow, get_collective, make_row, size_sweep

SIZES = size_sweep(8, 1 << 30, 2)  # 28 sizes, 8 B .. 1 GiB


def _time(alpha_us: float, beta_gbps: float, size: int) -> float:
    return alpha_us + size / (beta_gbps * 1e3)


def _rows(times: dict[int, float], collective: str = "all_reduce", nranks: int = 8, wrong: int | None = 0):
    spec = get_collective(collective)
    return [make_row(spec, s, nranks, "float", 4, t, wrong) for s, t in times.items()]


def _model_rows(alpha_us: float, beta_gbps: float, sizes=SIZES, **kw):
    return _rows({s: _time(alpha_us, beta_gbps, s) for s in sizes}, **kw)


def test_exact_recovery():
    fit = fit_rows(_model_rows(12.0, 4.0))
    assert fit.collective == "all_reduce"
    assert fit.latency_us == pytest.approx(12.0, rel=1e-9)
    assert fit.bandwidth_gbps == pytest.approx(4.0, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert fit.max_rel_error < 1e-9
    assert fit.n_points == 28
    assert fit.outliers == ()
    assert not fit.latency_clamped


@settings(max_examples=60, deadline=None)
@given(alpha=st.floats(0.5, 500.0), beta=st.floats(0.1, 2000.0))
def test_exact_recovery_any_parameters(alpha, beta):
    fit = fit_rows(_model_rows(alpha, beta))
    assert fit.latency_us == pytest.approx(alpha, rel=1e-6)
    assert fit.bandwidth_gbps == pytest.approx(beta, rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_recovery_with_3_percent_noise(seed):
    rng = random.Random(seed)
    times = {s: _time(12.0, 4.0, s) * (1 + rng.uniform(-0.03, 0.03)) for s in SIZES}
    fit = fit_rows(_rows(times))
    assert fit.latency_us == pytest.approx(12.0, rel=0.05)
    assert fit.bandwidth_gbps == pytest.approx(4.0, rel=0.05)
    assert fit.max_rel_error < 0.07
    assert 0.9 < fit.r2 < 1.0
    assert fit.outliers == ()


def test_plain_least_squares_would_lose_the_latency():
    """Why the weights: unweighted LS on these points puts alpha far from 12 us."""
    rng = random.Random(7)
    points = [(s, _time(12.0, 4.0, s) * (1 + rng.uniform(-0.03, 0.03))) for s in SIZES]
    n = len(points)
    mx = sum(s for s, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = sum((s - mx) * (t - my) for s, t in points) / sum((s - mx) ** 2 for s, _ in points)
    ols_alpha = my - slope * mx
    assert abs(ols_alpha - 12.0) > 100  # off by more than 100 us
    assert fit_rows(_rows(dict(points))).latency_us == pytest.approx(12.0, rel=0.05)


def test_negative_latency_is_clamped_and_bandwidth_refit():
    # Convex in size (t grows faster than linearly): the free line crosses below zero.
    times = {s: (s / 1000.0) ** 1.2 + 1e-3 for s in SIZES[10:]}
    fit = fit_rows(_rows(times))
    assert fit.latency_clamped
    assert fit.latency_us == 0.0
    # Refit through the origin: slope = sum(S/t) / sum((S/t)^2) (us per byte).
    ratios = [s / t for s, t in times.items()]
    slope = sum(ratios) / sum(r * r for r in ratios)
    assert fit.bandwidth_gbps == pytest.approx(1 / (slope * 1e3), rel=1e-12)
    assert all(predict_time_us(fit, s) > 0 for s in times)


def test_outlier_is_flagged_with_its_ratio():
    times = {s: _time(12.0, 4.0, s) for s in SIZES}
    times[1 << 20] *= 3.0
    fit = fit_rows(_rows(times))
    assert [size for size, _ in fit.outliers] == [1 << 20]
    assert fit.outliers[0][1] == pytest.approx(3.0, rel=0.1)
    assert fit.bandwidth_gbps == pytest.approx(4.0, rel=0.05)
    # A looser threshold lets it pass.
    assert fit_rows(_rows(times), outlier_threshold=5.0).outliers == ()


def test_rows_with_wrong_data_zero_size_or_no_time_are_ignored():
    rows = _model_rows(12.0, 4.0)
    bad = [
        BenchRow("all_reduce", 4096, 1024, "float", 9999.0, 0.0, 0.0, 3),  # data errors
        BenchRow("all_reduce", 0, 0, "float", 0.06, 0.0, 0.0, 0),  # aligned away to 0 B
        BenchRow("all_reduce", 512, 128, "float", 0.0, 0.0, 0.0, 0),
    ]
    fit = fit_rows(rows + bad)
    assert fit.n_points == 28
    assert fit.latency_us == pytest.approx(12.0, rel=1e-9)
    unchecked = [BenchRow("all_reduce", r.size_bytes, r.count, r.dtype, r.time_us, 0, 0, None) for r in rows]
    assert fit_rows(unchecked).n_points == 28  # wrong=None (not checked) is kept


def test_too_few_sizes_gives_none():
    assert fit_rows([]) is None
    assert fit_rows(_model_rows(12.0, 4.0, sizes=[1024])) is None
    repeated = _model_rows(12.0, 4.0, sizes=[1024]) * 3
    assert fit_rows(repeated) is None
    assert fit_rows(_model_rows(12.0, 4.0, sizes=[1024, 2048])) is not None


def test_flat_times_give_latency_and_infinite_bandwidth():
    fit = fit_rows(_rows({s: 12.0 for s in SIZES[:8]}))
    assert fit.latency_us == pytest.approx(12.0)
    assert math.isinf(fit.bandwidth_gbps)
    assert predict_time_us(fit, 1 << 30) == pytest.approx(12.0)
    assert fit.to_dict()["bandwidth_gbps"] is None


def test_mixed_collectives_need_a_choice():
    rows = _model_rows(12.0, 4.0) + _model_rows(20.0, 10.0, collective="all_gather")
    with pytest.raises(InputError, match="all_gather, all_reduce"):
        fit_rows(rows)
    assert fit_rows(rows, "all_gather").bandwidth_gbps == pytest.approx(10.0, rel=1e-9)
    fits = fit_all(rows + _model_rows(5.0, 1.0, sizes=[64], collective="broadcast"))
    assert sorted(fits) == ["all_gather", "all_reduce"]  # broadcast: a single size
    assert fits["all_reduce"].latency_us == pytest.approx(12.0, rel=1e-9)


def test_predict_and_bus_bandwidth():
    fit = fit_rows(_model_rows(12.0, 4.0))
    assert predict_time_us(fit, 4_000_000) == pytest.approx(12.0 + 1000.0)
    assert bus_bandwidth_gbps(fit, 8) == pytest.approx(4.0 * 1.75)
    gathered = fit_rows(_model_rows(12.0, 4.0, collective="all_gather"))
    assert bus_bandwidth_gbps(gathered, 4) == pytest.approx(4.0 * 0.75)


def test_r2_definition_on_relative_residuals():
    times = {s: _time(12.0, 4.0, s) * (1.1 if i % 2 else 0.9) for i, s in enumerate(SIZES)}
    fit = fit_rows(_rows(times))
    t = list(times.values())
    predicted = [predict_time_us(fit, s) for s in times]
    c = sum(1 / x for x in t) / sum(1 / x**2 for x in t)
    ss_res = sum(((x - p) / x) ** 2 for x, p in zip(t, predicted))
    ss_tot = sum(((x - c) / x) ** 2 for x in t)
    assert fit.r2 == pytest.approx(1 - ss_res / ss_tot, rel=1e-9)
    assert fit.max_rel_error == pytest.approx(max(abs(x - p) / x for x, p in zip(t, predicted)), rel=1e-9)


def test_dict_round_trip_is_json_safe():
    times = {s: _time(12.0, 4.0, s) for s in SIZES}
    times[1 << 20] *= 3.0
    fit = fit_rows(_rows(times))
    data = json.loads(json.dumps(fit.to_dict()))
    assert Fit.from_dict(data) == fit
    flat = fit_rows(_rows({s: 12.0 for s in SIZES[:4]}))
    assert Fit.from_dict(json.loads(json.dumps(flat.to_dict()))) == flat


@settings(max_examples=200, deadline=None)
@given(
    points=st.lists(
        st.tuples(st.integers(0, 1 << 62), st.floats()),
        max_size=12,
    )
)
def test_any_rows_give_a_fit_or_none_never_a_crash(points):
    rows = [BenchRow("all_reduce", s, s // 4, "float", t, 0.0, 0.0, 0) for s, t in points]
    fit = fit_rows(rows)
    if fit is not None:
        assert fit.latency_us >= 0 and fit.bandwidth_gbps > 0
        assert math.isfinite(fit.latency_us)
