"""This machine's CPU measured for the roofline (`probes/device_costs.py`): every figure there,
positive and in its unit, and how several measurements combine."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from probes.device_costs import best_of, measure_cpu_costs  # noqa: E402
from topoprof.model.compute.roofline import measured_device


def test_the_cpus_figures_are_measured_and_feed_a_device():
    costs = measure_cpu_costs(repeats=1)
    for key in ("peak_flops", "bandwidth_bps", "host_forward_s", "host_backward_s", "host_conv_forward_s",
                "host_conv_backward_s"):
        assert costs[key] > 0 and "measured" in costs["how"][key], key
    assert costs["fresh_page_s_per_byte"] >= 0 and costs["fresh_page_min_bytes"] == 32 << 20
    assert costs["host_forward_s"] < 1e-3 and costs["peak_flops"] > 1e8  # microseconds per op; GFLOP/s at least
    device = measured_device(costs)
    assert device.peak_flops == costs["peak_flops"] and set(device.host_cost_by_kind) == {"aten.convolution"}


def test_several_measurements_keep_compute_and_pages_at_their_best_and_bandwidth_at_its_median():
    slow = {"peak_flops": 1.0, "bandwidth_bps": 2.0, "fresh_page_s_per_byte": 3.0, "host_forward_s": 4.0,
            "host_backward_s": 5.0, "host_conv_forward_s": 6.0, "host_conv_backward_s": 7.0, "threads": 2}
    fast = {**slow, "peak_flops": 10.0, "bandwidth_bps": 20.0, "host_forward_s": 0.4, "host_conv_backward_s": 0.7,
            "fresh_page_s_per_byte": 0.3}
    best = best_of(slow, fast, {**slow, "bandwidth_bps": 8.0})
    assert (best["peak_flops"], best["host_forward_s"], best["host_backward_s"], best["host_conv_backward_s"]) \
        == (10.0, 0.4, 5.0, 0.7)
    assert best["bandwidth_bps"] == 8.0 and best["fresh_page_s_per_byte"] == 0.3
