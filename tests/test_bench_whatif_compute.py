"""The what-if compute benchmark: which traced outputs it counts as fresh pages, and the committed GPU rows it reads."""
from __future__ import annotations

import pytest

from tests.benchmarks.bench_whatif_compute import fresh_bytes
from topoprof.specs.traced_pass import TracedOp, TracedPass


def _op(view, outputs, **more):
    return TracedOp(name="aten.add.Tensor", phase="forward", flops=0, view=view, bytes_read=0, bytes_written=0,
                    outputs=outputs, **more)


def test_fresh_bytes_count_large_outputs_written_anew_only():
    trace = TracedPass(ops=[
        _op(False, [64, 8], inplace=False),   # one large output, one small
        _op(False, [100], inplace=True),      # written in place: its pages exist
        _op(True, [100]),                     # a view writes nothing
        _op(False, [32]),                     # exactly at the threshold
    ])
    assert fresh_bytes(trace, 32) == 64 + 32


def test_the_committed_gpu_rows_are_read_from_the_file(tmp_path):
    from tests.benchmarks.bench_whatif_compute import GPU_SHAPES, describe
    from tests.benchmarks.whatif_gpu import COMMITTED, committed_rows

    names = [describe(p, kw) for p, kw in GPU_SHAPES]
    gpu, measured = committed_rows(COMMITTED, names)
    assert gpu == "h200-sxm" and sorted(measured) == sorted(names)
    assert measured["gpt3-xl L4 4x512"] == pytest.approx(20.05e-3)
    made = tmp_path / "out.txt"
    made.write_text("# torch 2.11, CUDA 13.0, NVIDIA H100 80GB HBM3 as h100-sxm; bf16\n"
                    "shape   kernels   GFLOP  measured ms  predicted ms\n"
                    "gpt2 L6 2x512                      333   531.9         7.50          5.50        2.47-12.46\n"
                    "unknown L1 1x1                       1     1.0         1.00          1.00        1.00-1.00\n")
    assert committed_rows(str(made), names) == ("h100-sxm", {"gpt2 L6 2x512": pytest.approx(7.5e-3)})


def test_a_gpu_runs_header_is_read_back_as_the_gpu_it_ran_on(tmp_path):
    from tests.benchmarks.bench_whatif_compute import GPU_SHAPES, describe
    from tests.benchmarks.whatif_gpu import committed_rows, header

    made = tmp_path / "out.txt"
    made.write_text(header("torch 2.11, CUDA 13.0", "NVIDIA H100 80GB HBM3", 3, "this GPU's quick profile") + "\n"
                    "gpt2 L6 2x512                      333   531.9         7.50          5.50        2.47-12.46\n")
    assert committed_rows(str(made), [describe(p, kw) for p, kw in GPU_SHAPES])[0] == "h100-sxm"
