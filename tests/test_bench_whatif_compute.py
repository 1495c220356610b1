"""The what-if compute benchmark's fresh-page check: which traced outputs it counts as fresh pages."""
from __future__ import annotations

from tests.benchmarks.bench_whatif_compute import fresh_bytes


def test_fresh_bytes_count_large_outputs_written_anew_only():
    trace = {"ops": [
        {"view": False, "inplace": False, "outputs": [64, 8]},   # one large output, one small
        {"view": False, "inplace": True, "outputs": [100]},      # written in place: its pages exist
        {"view": True, "outputs": [100]},                        # a view writes nothing
        {"view": False, "outputs": [32]},                        # exactly at the threshold
    ]}
    assert fresh_bytes(trace, 32) == 64 + 32
