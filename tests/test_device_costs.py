"""What a CPU's profile measures beyond a GPU's (`probes/device_profile/device_costs.py`): the cost of fresh
pages and a convolution's host cost per call, each positive, in its unit, with how."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from topoprof.probes.device_profile.device_costs import FRESH_PAGE_MIN_BYTES, conv_host_costs, fastest, fresh_page_cost  # noqa: E402


def test_fresh_pages_and_convolutions_are_measured_with_how():
    pages = fresh_page_cost(repeats=1)
    assert pages["fresh_page_s_per_byte"] >= 0 and pages["fresh_page_min_bytes"] == FRESH_PAGE_MIN_BYTES == 32 << 20
    assert "measured" in pages["how"]["fresh_page_s_per_byte"]
    convs = conv_host_costs(repeats=1)
    for key in ("host_conv_forward_s", "host_conv_backward_s"):
        assert 0 < convs[key] < 0.1 and "measured" in convs["how"][key], key


def test_fastest_keeps_the_fastest_call_after_a_warm_up():
    calls = []
    assert fastest(lambda: calls.append(1), 3) >= 0 and len(calls) == 4
