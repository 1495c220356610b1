"""Import of real nccl-tests logs (tests/fixtures/nccl_tests/, tests/fixtures/topo/22_*) and bad input."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoprof.errors import InputError, ParseError
from topoprof.measure.fit import bus_bandwidth_gbps, fit_rows
from topoprof.measure.nccl_tests import parse_nccl_tests, parse_nccl_tests_runs, read_nccl_tests
from topoprof.specs.collective_spec import COLLECTIVES, get_collective, make_row

FIXTURES = Path(__file__).parent / "fixtures"
RTX2080 = "topo/22_rtx2080ti-2x-pix-autodl.nccl-tests.txt"
DRANET = "nccl_tests/dranet-b200-2node-all_gather.txt"
A3MEGA = "nccl_tests/a3mega-h100-16rank-2node-all_reduce.txt"
DGX2 = "nccl_tests/dgx2-v100-12x-all_gather-oldfmt.txt"
ALLTOALL = "nccl_tests/rtx6000d-16rank-2node-alltoall.txt"


def _text(relative: str) -> str:
    """The log without its `# ` source header (everything up to and including `# ---`)."""
    lines = (FIXTURES / relative).read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith("# ---"))
    return "".join(lines[cut + 1 :])


def _load(relative: str, **kw):
    return parse_nccl_tests(_text(relative), source=relative, **kw)


def _line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if fragment in line)


def _mean_busbw(relative: str, **kw) -> float:
    # nccl-tests' "Avg bus bandwidth" is the mean busbw over out-of-place and in-place rows
    # (args->bw[0] += busBw in BenchTime, src/common.cu).
    values = [r.busbw_gbps for which in ("out", "in") for r in _load(relative, which=which, **kw).rows]
    return sum(values) / len(values)


# --- the RTX 2080 Ti all_reduce log (fixture 22) ---------------------------------------------


def test_rtx2080ti_rows():
    log = _load(RTX2080)
    assert len(log.rows) == 28
    assert [r.size_bytes for r in log.rows] == [8 << i for i in range(28)]
    assert log.rows[-1].size_bytes == 1 << 30
    assert all(r.count * 4 == r.size_bytes and r.dtype == "float" and r.wrong == 0 for r in log.rows)
    assert log.rows[0].time_us == 12.25 and log.rows[-1].time_us == 268588.0


def test_rtx2080ti_metadata():
    log = _load(RTX2080)
    assert (log.collective, log.collective_from) == ("all_reduce", "default")
    assert log.nranks == 2
    assert log.devices == ("NVIDIA GeForce RTX 2080 Ti",) * 2
    assert log.hosts == ("autodl-container-xxxxx",)
    assert log.avg_busbw_gbps == 2.05774
    assert log.out_of_bounds == 0
    assert (log.algbw_mismatches, log.busbw_mismatches) == (0, 0)
    assert log.nccl_version is None
    assert log.header[0].startswith("# nThread 1 nGpus 2")


def test_rtx2080ti_peak_busbw():
    log = _load(RTX2080)
    peak = max(r.busbw_gbps for r in log.rows)
    assert peak == 4.00
    assert next(r.size_bytes for r in log.rows if r.busbw_gbps == peak) == 134217728


def test_rtx2080ti_in_place_columns():
    log = _load(RTX2080, which="in")
    assert log.rows[0].time_us == 12.00 and log.rows[-1].time_us == 268461.0
    assert log.which == "in"


def test_rtx2080ti_fit():
    log = _load(RTX2080)
    fit = fit_rows(log.rows)
    # n = 2: algbw == busbw, so beta should sit near the 4.00 GB/s plateau.
    assert fit.bandwidth_gbps == pytest.approx(4.0, rel=0.05)
    assert bus_bandwidth_gbps(fit, 2) == fit.bandwidth_gbps
    assert 11.0 < fit.latency_us < 13.0  # the small sizes run in 11.6 .. 12.9 us
    assert fit.r2 > 0.95


def test_source_header_is_tolerated():
    """The raw fixture, `# source:` lines included, gives the same rows."""
    raw = (FIXTURES / RTX2080).read_text()
    assert parse_nccl_tests(raw).rows == _load(RTX2080).rows


@pytest.mark.parametrize(
    "relative, kw",
    [(RTX2080, {}), (DRANET, {"collective": "all_gather"}), (A3MEGA, {}), (DGX2, {}), (ALLTOALL, {})],
)
def test_avg_bus_bandwidth_matches_the_rows(relative, kw):
    assert _mean_busbw(relative, **kw) == pytest.approx(_load(relative, **kw).avg_busbw_gbps, abs=0.005)


# --- other real logs ---------------------------------------------------------------------------


def test_dranet_all_gather_needs_its_collective_named():
    log = _load(DRANET, collective="all_gather")
    assert (log.collective, log.collective_from) == ("all_gather", "argument")
    assert log.nranks == 2
    assert log.hosts == ("nccl-gib-test-0", "nccl-gib-test-1")
    assert log.devices == ("NVIDIA B200", "NVIDIA B200")
    assert log.nccl_version == "2.26.6+cuda12.8"
    assert len(log.rows) == 28
    assert [(r.size_bytes, r.count) for r in log.rows[:3]] == [(0, 0), (0, 0), (32, 4)]
    assert (log.algbw_mismatches, log.busbw_mismatches) == (0, 0)
    assert max(r.busbw_gbps for r in log.rows) == 36.67
    fit = fit_rows(log.rows)
    assert fit.n_points == 26  # the two 0-byte rows are left out
    assert 14.0 < fit.latency_us < 19.0


def test_dranet_under_the_default_name_shows_busbw_mismatches():
    """Read as all_reduce (no binary name in the log), busbw = 2x(n-1)/n algbw disagrees."""
    log = _load(DRANET)
    assert (log.collective, log.collective_from) == ("all_reduce", "default")
    assert log.algbw_mismatches == 0
    assert log.busbw_mismatches > 20


def test_a3mega_multi_node_ranks_come_from_rank_lines():
    log = _load(A3MEGA)
    assert (log.collective, log.collective_from) == ("all_reduce", "log")  # from the "> " quoted mpirun line
    assert log.nranks == 16  # the nThread line alone says nGpus 1
    assert log.hosts == ("ztan-mig-235z", "ztan-mig-gq73")
    assert log.devices == ("NVIDIA H100 80GB HBM3",) * 16
    assert len(log.rows) == 31 and log.rows[-1].size_bytes == 8 << 30
    assert max(r.busbw_gbps for r in log.rows) == 338.82
    assert log.avg_busbw_gbps == 70.742
    assert (log.algbw_mismatches, log.busbw_mismatches) == (0, 0)


def test_old_format_all_gather():
    log = _load(DGX2)
    assert (log.collective, log.collective_from) == ("all_gather", "log")  # from the "Running:" line
    assert log.nranks == 12  # "#   Rank  0 Pid ..." lines without Group
    assert log.hosts == ("seville",)
    assert len(log.rows) == 31
    assert all(r.wrong is None for r in log.rows)  # "error" is a max deviation, not a count
    assert log.out_of_bounds == 4
    assert log.avg_busbw_gbps == 30.2993
    # Before 2020 nccl-tests already scaled all_gather algbw by (n-1)/n (issue #45): printed
    # busbw is right, printed algbw is not S/t.
    assert log.busbw_mismatches == 0
    assert log.algbw_mismatches == 22
    last = log.rows[-1]
    assert last.algbw_gbps == last.busbw_gbps == 73.75


def test_newest_format_all_to_all():
    log = _load(ALLTOALL)
    assert (log.collective, log.collective_from) == ("all_to_all", "log")  # "# Collective test starting:"
    assert log.nccl_tests_version == "2.18.3"
    assert log.nccl_version == "2.30.3+cuda13.0"
    assert log.nranks == 16
    assert len(log.rows) == 24  # the MPI help lines between header and rows are skipped
    assert all(r.wrong == 0 for r in log.rows)
    assert all(r.wrong is None for r in _load(ALLTOALL, which="in").rows)  # N/A
    assert (log.algbw_mismatches, log.busbw_mismatches) == (0, 0)
    fit = fit_rows(log.rows)
    assert (33554432, pytest.approx(31.5, rel=0.05)) in [(s, r) for s, r in fit.outliers]


def test_github_stripped_log_without_hash_lines():
    # NVIDIA/nccl-tests issue #37 (https://github.com/NVIDIA/nccl-tests/issues/37), as rendered
    # on GitHub: the leading '#' of every comment line was eaten by Markdown.
    text = """all_gather_perf -g 8 -b 4294967296 -e 4294967296 -n 100
                                             out-of-place                       in-place
       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
  4294967296     134217728   float    29122  129.05  129.05  1e+00    29169  128.84  128.84  1e+00
 Out of bounds values : 2 FAILED
 Avg bus bandwidth    : 128.942
"""
    log = parse_nccl_tests(text)
    assert log.collective == "all_gather"
    assert log.nranks is None
    assert [(r.size_bytes, r.time_us, r.wrong) for r in log.rows] == [(4294967296, 29122.0, None)]
    assert (log.out_of_bounds, log.avg_busbw_gbps) == (2, 128.942)
    assert log.algbw_mismatches == 1  # the pre-2020 (n-1)/n scaling again
    assert fit_rows(log.rows) is None  # one size


# --- collective naming -------------------------------------------------------------------------


def test_argument_conflicting_with_the_log_is_refused():
    text = _text(A3MEGA)
    with pytest.raises(ParseError) as e:
        parse_nccl_tests(text, source="a3mega.txt", collective="all_gather")
    assert e.value.line == _line_of(text, "all_reduce_perf")
    assert "all_reduce_perf" in str(e.value) and "'all_gather'" in str(e.value)
    assert parse_nccl_tests(text, collective="all_reduce_perf").collective_from == "log"


def test_unsupported_binary_is_refused():
    text = "./build/hypercube_perf -b 8 -e 64 -f 2 -g 2\n" + _text(RTX2080)
    with pytest.raises(ParseError, match="hypercube_perf, which is not supported"):
        parse_nccl_tests(text)


def test_unknown_collective_argument():
    with pytest.raises(InputError, match="unknown collective"):
        parse_nccl_tests(_text(RTX2080), collective="allreduce")


# --- malformed input ---------------------------------------------------------------------------


def test_bad_number_names_row_and_column():
    text = _text(RTX2080).replace("11.61    0.01", "11.6x    0.01", 1)
    with pytest.raises(ParseError) as e:
        parse_nccl_tests(text, source="run.log")
    line = _line_of(text, "11.6x")
    assert (e.value.source, e.value.line) == ("run.log", line)
    assert str(e.value) == f"run.log:{line}: column 'time' (out-of-place): '11.6x' is not a number"


def test_bad_in_place_number_only_matters_for_in_place():
    text = _text(RTX2080).replace("12.21    0.01", "12.21    abc", 1)
    assert len(parse_nccl_tests(text).rows) == 28
    with pytest.raises(ParseError, match=r"column 'algbw' \(in-place\): 'abc'"):
        parse_nccl_tests(text, which="in")


def test_missing_column_gives_expected_layout():
    text = _text(RTX2080)
    row = next(line for line in text.splitlines() if line.strip().startswith("4096 "))
    broken = text.replace(row, row.rsplit(maxsplit=1)[0])
    with pytest.raises(ParseError) as e:
        parse_nccl_tests(broken, source="run.log")
    assert e.value.line == _line_of(text, row)
    assert "row has 12 columns, expected 13 (size count type redop root time algbw busbw #wrong" in str(e.value)


def test_bad_count_column():
    text = _text(RTX2080).replace("        2048           512 ", "        2048           5x2 ", 1)
    with pytest.raises(ParseError, match="column 'count': '5x2' is not a whole number"):
        parse_nccl_tests(text)


def test_no_rows():
    with pytest.raises(ParseError) as e:
        parse_nccl_tests("# nThread 1 nGpus 2\n# Using devices\n", source="empty.log")
    assert e.value.line is None
    assert str(e.value).startswith("empty.log: no nccl-tests table rows found")


def test_in_place_missing():
    text = "8 2 float sum -1 12.25 0.00 0.00 0\n16 4 float sum -1 11.77 0.00 0.00 0\n"
    assert len(parse_nccl_tests(text).rows) == 2
    with pytest.raises(ParseError, match="no in-place columns"):
        parse_nccl_tests(text, which="in")


def test_which_must_be_out_or_in():
    with pytest.raises(InputError, match="which"):
        parse_nccl_tests(_text(RTX2080), which="both")


# --- several runs in one log, files ------------------------------------------------------------


def test_several_runs():
    first, second = _text(RTX2080), _text(ALLTOALL)
    text = first + second
    with pytest.raises(ParseError) as e:
        parse_nccl_tests(text, source="both.log")
    assert e.value.line == len(first.splitlines()) + _line_of(second, "        1024            16")
    assert "parse_nccl_tests_runs" in str(e.value)
    runs = parse_nccl_tests_runs(text)
    assert [(r.collective, r.nranks, len(r.rows)) for r in runs] == [("all_reduce", 2, 28), ("all_to_all", 16, 24)]


def test_read_file(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(_text(RTX2080))
    log = read_nccl_tests(str(path), which="in")
    assert log.source == str(path) and len(log.rows) == 28 and log.which == "in"


def test_read_missing_file(tmp_path):
    missing = tmp_path / "nope.log"
    with pytest.raises(InputError) as e:
        read_nccl_tests(str(missing))
    assert str(e.value) == f"{missing}: cannot read: No such file or directory"
    with pytest.raises(InputError, match="cannot read"):
        read_nccl_tests(str(tmp_path))


# --- printing like nccl-tests and reading back ---------------------------------------------------


def _nccl_tests_time(time_us: float) -> str:
    # BenchTime in src/common.cu: %7.0f from 10000 us, %7.1f from 100 us, else %7.2f.
    if time_us >= 10000.0:
        return f"{time_us:7.0f}"
    return f"{time_us:7.1f}" if time_us >= 100.0 else f"{time_us:7.2f}"


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(COLLECTIVES)),
    nranks=st.integers(2, 64),
    alpha=st.floats(2.0, 200.0),
    beta=st.floats(0.5, 900.0),
)
def test_rows_printed_like_nccl_tests_read_back_without_mismatches(name, nranks, alpha, beta):
    spec = get_collective(name)
    lines = [f"# {spec.nccl_tests_binary} -b 8 -e 1G -f 2", f"# nThread 1 nGpus {nranks} minBytes 8"]
    expected = []
    for i in range(28):
        size = spec.aligned_size(8 << i, nranks, 4)
        if size == 0:
            continue
        row = make_row(spec, size, nranks, "float", 4, alpha + size / (beta * 1e3), 0)
        expected.append(row)
        group = f"{_nccl_tests_time(row.time_us)}  {row.algbw_gbps:6.2f}  {row.busbw_gbps:6.2f}  {0:6g}"
        lines.append(f"{size:12d}  {row.count:12d}  {'float':>8}  {'sum':>6}  {-1:6d}  {group}  {group}")
    log = parse_nccl_tests("\n".join(lines))
    assert log.collective == name and log.nranks == nranks
    assert [(r.size_bytes, r.count) for r in log.rows] == [(r.size_bytes, r.count) for r in expected]
    assert (log.algbw_mismatches, log.busbw_mismatches) == (0, 0)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    junk=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
)
def test_damaged_logs_fail_cleanly(data, junk):
    """Any one token of a real log replaced by junk: a result or a ParseError, never a traceback."""
    relative = data.draw(st.sampled_from([RTX2080, DRANET, A3MEGA, DGX2, ALLTOALL]))
    lines = _text(relative).splitlines()
    index = data.draw(st.integers(0, len(lines) - 1))
    tokens = lines[index].split() or [""]
    position = data.draw(st.integers(0, len(tokens) - 1))
    tokens[position] = junk
    lines[index] = "  ".join(tokens)
    try:
        log = parse_nccl_tests("\n".join(lines), collective=data.draw(st.sampled_from([None, "all_gather"])))
    except ParseError:
        return
    fit_rows(log.rows)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_fails_cleanly(text):
    try:
        parse_nccl_tests(text)
    except ParseError:
        pass
