"""Collective specs against nccl-tests' formulas (src/*.cu) and against real nccl-tests logs."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topoprof.errors import InputError
from topoprof.measure.nccl_tests import parse_nccl_tests
from topoprof.specs.collective_spec import (
    COLLECTIVES,
    BenchRow,
    get_collective,
    make_row,
    parse_size,
    size_sweep,
)

FIXTURES = Path(__file__).parent / "fixtures"
GATHERED = ("all_gather", "reduce_scatter", "all_to_all")
WHOLE = ("all_reduce", "broadcast", "reduce", "sendrecv")


def _fixture_text(relative: str) -> str:
    """The log without its `# ` source header (everything up to and including `# ---`)."""
    lines = (FIXTURES / relative).read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith("# ---"))
    return "".join(lines[cut + 1 :])


# busbw factors exactly as each *GetBw in nccl-tests computes them.
NCCL_TESTS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,  # src/all_reduce.cu
    "all_gather": lambda n: (n - 1) / n,  # src/all_gather.cu
    "reduce_scatter": lambda n: (n - 1) / n,  # src/reduce_scatter.cu
    "all_to_all": lambda n: (n - 1) / n,  # src/alltoall.cu
    "broadcast": lambda n: 1.0,  # src/broadcast.cu
    "reduce": lambda n: 1.0,  # src/reduce.cu
    "sendrecv": lambda n: 1.0,  # src/sendrecv.cu
}


def test_every_collective_has_a_reference_factor():
    assert set(COLLECTIVES) == set(NCCL_TESTS_FACTOR)


@pytest.mark.parametrize("name", sorted(NCCL_TESTS_FACTOR))
@pytest.mark.parametrize("n", [2, 3, 8])
def test_busbw_factor_matches_nccl_tests(name, n):
    assert get_collective(name).busbw_factor(n) == pytest.approx(NCCL_TESTS_FACTOR[name](n), rel=1e-15)


def test_busbw_factor_examples():
    assert get_collective("all_reduce").busbw_factor(8) == 1.75
    assert get_collective("all_gather").busbw_factor(2) == 0.5
    assert get_collective("all_reduce").busbw_factor(1) == 0.0


def test_busbw_factor_rejects_no_ranks():
    with pytest.raises(InputError, match="nranks"):
        get_collective("all_reduce").busbw_factor(0)


def test_binaries():
    assert {s.nccl_tests_binary for s in COLLECTIVES.values()} == {
        "all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf",
        "alltoall_perf", "sendrecv_perf", "reduce_perf",
    }


@pytest.mark.parametrize(
    "name, n, size, expected_counts, printed, aligned",
    [
        # 1 KiB of float: count = 256 elements (setupArgs, src/common.cu).
        ("all_reduce", 2, 1024, (256, 256), 256, 1024),
        ("broadcast", 3, 1024, (256, 256), 256, 1024),
        ("reduce", 3, 1024, (256, 256), 256, 1024),
        ("sendrecv", 3, 1024, (256, 256), 256, 1024),
        ("all_gather", 2, 1024, (128, 256), 128, 1024),
        ("reduce_scatter", 2, 1024, (256, 128), 128, 1024),
        ("all_to_all", 2, 1024, (256, 256), 128, 1024),
        # n = 3: 256 // 3 = 85 per rank, rounded down to 84 (a 16-byte multiple of float).
        ("all_gather", 3, 1024, (84, 252), 84, 1008),
        ("reduce_scatter", 3, 1024, (252, 84), 84, 1008),
        ("all_to_all", 3, 1024, (252, 252), 84, 1008),
        # Whole-buffer collectives only round to whole elements.
        ("all_reduce", 3, 1026, (256, 256), 256, 1024),
        # 8 B on 2 ranks: 1 float per rank rounds to 0, printed as size 0 count 0.
        ("all_gather", 2, 8, (0, 0), 0, 0),
        ("all_to_all", 16, 1024, (256, 256), 16, 1024),
    ],
)
def test_counts_and_sizes(name, n, size, expected_counts, printed, aligned):
    spec = get_collective(name)
    assert spec.counts(size, n, 4) == expected_counts
    assert spec.printed_count(size, n, 4) == printed
    assert spec.aligned_size(size, n, 4) == aligned


@pytest.mark.parametrize(
    "elem, size, aligned",
    [
        (1, 100, 96),  # int8: 50 per rank -> 48 (16 B)
        (2, 100, 96),  # half: 25 per rank -> 24 (16 B)
        (8, 24, 0),  # double: 1 per rank -> 0 (16 B = 2 doubles)
        (8, 64, 64),  # double: 4 per rank -> 4
    ],
)
def test_chunk_alignment_is_16_bytes_for_every_type(elem, size, aligned):
    assert get_collective("all_gather").aligned_size(size, 2, elem) == aligned


def test_bad_arguments():
    spec = get_collective("all_gather")
    with pytest.raises(InputError, match="element size"):
        spec.counts(1024, 2, 3)
    with pytest.raises(InputError, match="size"):
        spec.counts(-8, 2, 4)
    with pytest.raises(InputError, match="nranks"):
        spec.aligned_size(1024, 0, 4)


@given(
    name=st.sampled_from(sorted(COLLECTIVES)),
    n=st.integers(1, 64),
    elem=st.sampled_from([1, 2, 4, 8]),
    size=st.integers(0, 1 << 34),
)
def test_alignment_properties(name, n, elem, size):
    spec = get_collective(name)
    aligned = spec.aligned_size(size, n, elem)
    assert 0 <= aligned <= size
    assert spec.aligned_size(aligned, n, elem) == aligned  # idempotent
    per_call_bytes = spec.printed_count(size, n, elem) * elem
    if name in GATHERED:
        assert aligned % (16 * n) == 0
        assert per_call_bytes * n == aligned
        assert size - aligned < 16 * n + elem * n
    else:
        assert per_call_bytes == aligned
        assert size - aligned < elem


@pytest.mark.parametrize(
    "fixture, collective, nranks",
    [
        ("topo/22_rtx2080ti-2x-pix-autodl.nccl-tests.txt", "all_reduce", 2),
        ("nccl_tests/dranet-b200-2node-all_gather.txt", "all_gather", 2),
        ("nccl_tests/rtx6000d-16rank-2node-alltoall.txt", "all_to_all", 16),
        ("nccl_tests/a3mega-h100-16rank-2node-all_reduce.txt", "all_reduce", 16),
    ],
)
def test_sizes_and_counts_match_real_logs(fixture, collective, nranks):
    """The requested sweep, aligned by the spec, reproduces the printed size and count columns."""
    log = parse_nccl_tests(_fixture_text(fixture), collective=collective)
    spec = get_collective(collective)
    requested = size_sweep(*_sweep_bounds(log.header), 2)
    assert [(spec.aligned_size(s, nranks, 4), spec.printed_count(s, nranks, 4)) for s in requested] == [
        (r.size_bytes, r.count) for r in log.rows
    ]


def _sweep_bounds(header: tuple[str, ...]) -> tuple[int, int]:
    line = next(h for h in header if "minBytes" in h)
    words = line.split()
    return int(words[words.index("minBytes") + 1]), int(words[words.index("maxBytes") + 1])


def test_old_all_gather_log_used_unrounded_chunks():
    """Pre-2022 all_gather used count/nranks per rank: sizes are count x 12 x 4 B, no 16 B rounding."""
    log = parse_nccl_tests(_fixture_text("nccl_tests/dgx2-v100-12x-all_gather-oldfmt.txt"))
    assert all(r.size_bytes == r.count * 12 * 4 for r in log.rows)
    assert [r.size_bytes for r in log.rows][3:6] == [48, 96, 240]
    # Today's 16-byte rule gives 192 B where that log printed 240 B (-b 256 B: 5 floats per
    # rank -> 4) and 960 B where it printed 1008 B (21 -> 20).
    spec = get_collective("all_gather")
    assert [spec.aligned_size(s, 12, 4) for s in (256, 1024)] == [192, 960]
    assert [r.size_bytes for r in log.rows][5:8] == [240, 480, 1008]


def test_get_collective_by_name_and_binary():
    assert get_collective("all_to_all") is get_collective("alltoall_perf") is get_collective("alltoall")
    assert get_collective("all_reduce_perf").name == "all_reduce"


def test_get_collective_unknown_lists_valid_names():
    with pytest.raises(InputError) as e:
        get_collective("allreduce2")
    message = str(e.value)
    assert "'allreduce2'" in message
    for name in COLLECTIVES:
        assert name in message


def test_make_row_computes_bandwidths():
    row = make_row(get_collective("all_gather"), 1 << 30, 8, "float", 4, 10_000.0, 0, (9_000.0, 10_000.0))
    assert row == BenchRow(
        collective="all_gather",
        size_bytes=1 << 30,
        count=(1 << 30) // 4 // 8,
        dtype="float",
        time_us=10_000.0,
        algbw_gbps=pytest.approx((1 << 30) / 10_000e-6 / 1e9),
        busbw_gbps=pytest.approx((1 << 30) / 10_000e-6 / 1e9 * 7 / 8),
        wrong=0,
        rank_times_us=(9_000.0, 10_000.0),
    )


def test_make_row_reproduces_nccl_tests_printed_bandwidths():
    log = parse_nccl_tests(_fixture_text("topo/22_rtx2080ti-2x-pix-autodl.nccl-tests.txt"))
    spec = get_collective("all_reduce")
    for printed in log.rows:
        row = make_row(spec, printed.size_bytes, 2, "float", 4, printed.time_us, 0)
        assert row.count == printed.count
        # Recomputed from the printed (rounded) time, so allow the last printed digit.
        assert abs(row.algbw_gbps - printed.algbw_gbps) <= 0.005 + row.algbw_gbps * 0.5 / printed.time_us
        assert row.busbw_gbps == row.algbw_gbps  # 2(n-1)/n = 1 for n = 2


def test_make_row_needs_a_time():
    with pytest.raises(InputError, match="time"):
        make_row(get_collective("all_reduce"), 8, 2, "float", 4, 0.0, 0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", 8), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("1G", 1 << 30), ("1g", 1 << 30),
        ("512KB", 512 << 10), ("64MiB", 64 << 20), ("8B", 8), ("1.5K", 1536), (" 2 M ", 2 << 20), ("0", 0),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1T", "-1", "1.3", "0.3K", "K", "1KK", "1e3"])
def test_parse_size_errors_name_the_text(text):
    with pytest.raises(InputError) as e:
        parse_size(text)
    assert repr(text) in str(e.value)


def test_size_sweep_factor_2():
    sizes = size_sweep(8, 1 << 30, 2)
    assert len(sizes) == 28
    assert sizes[0] == 8 and sizes[-1] == 1 << 30
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


def test_size_sweep_stops_at_max_like_nccl_tests():
    assert size_sweep(8, 1000, 2) == [8, 16, 32, 64, 128, 256, 512]
    assert size_sweep(64, 64, 2) == [64]
    assert size_sweep(1, 81, 3) == [1, 3, 9, 27, 81]


def test_size_sweep_additive_steps():
    mib = 1 << 20
    assert size_sweep(mib, 4 * mib, 1, step_bytes=mib) == [mib, 2 * mib, 3 * mib, 4 * mib]
    assert size_sweep(10, 25, 1, step_bytes=10) == [10, 20]


@pytest.mark.parametrize(
    "args, kwargs, fragment",
    [
        ((64, 8, 2), {}, "64 B > max size 8 B"),
        ((8, 64, 0), {}, "factor"),
        ((8, 64, 1.5), {}, "factor"),
        ((8, 64, 1), {}, "-i"),
        ((0, 64, 2), {}, "0 x 2 = 0"),
        ((8, 64, 2), {"step_bytes": 8}, "not both"),
        ((8, 64, 1), {"step_bytes": 0}, "step_bytes"),
        ((0, 1 << 30, 1), {"step_bytes": 1}, "1073741825 sizes"),
        ((-1, 8, 2), {}, "min"),
    ],
)
def test_size_sweep_errors(args, kwargs, fragment):
    with pytest.raises(InputError) as e:
        size_sweep(*args, **kwargs)
    assert fragment in str(e.value)
