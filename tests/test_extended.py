"""A micro-batch's compute extended from passes at 1 and 2 blocks (topoprof/model/compute/extended.py)."""
from __future__ import annotations

from topoprof.model.compute.extended import Line, at_depth
from topoprof.model.compute.timing import Compute


def test_ends_whose_lines_cross_still_make_a_range_about_the_middle():
    """Each end grows on its own line; where the host and the device trade the bound between
    depths they can cross (a user's nn.MultiheadAttention model gave a fast end above its slow
    one at its depth). The range holds both ends; the middle is the middle as extended."""
    # (fast, middle, slow, forward, recompute) at 1 and 2 blocks: the fast end grows fastest
    line = Line(one=(0.010, 0.011, 0.013, 0.004, 0.0), two=(0.014, 0.0135, 0.0145, 0.005, 0.0), device="gpu")
    fast, middle, slow = line.at(16)[:3]
    assert fast > middle  # the lines crossed
    priced = at_depth({"none": line}, "none", 2, 16, "4x2048")
    assert priced.seconds == (min(fast, middle, slow), middle, max(fast, middle, slow))
    assert Compute(micro_batch_time_s=None, modelled=priced).modelled == priced  # a valid range
