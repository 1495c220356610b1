"""Import of NVIDIA nccl-tests `*_perf` stdout logs into BenchRows.

What the binaries print (src/common.cu, run() and TimeTest()):
  # nccl-tests version 2.18.3 nccl-headers=...  (recent releases only)
  # Collective test starting: alltoall_perf        (recent releases only)
  # nThread 1 nGpus 2 minBytes 8 maxBytes ... step: 2(factor) ...
  # Using devices
  #  Rank  0 Group  0 Pid 31706 on host device  0 [0000:b4:00] NVIDIA GeForce RTX 2080 Ti
  NCCL version 2.26.6+cuda12.8                   (from NCCL itself, on stdout)
  #       size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong
  <rows: out-of-place group, then in-place group>
  # Out of bounds values : 0 OK
  # Avg bus bandwidth    : 2.05774
Older releases print `#   Rank  0 Pid ...` (no Group), omit `redop`/`root` where the
collective has none (all_gather: `size count type time ...`) and print a max-error value in an
`error` column instead of a `#wrong` count. Logs copied from terminals also carry mpirun/NCCL
INFO/MPI chatter, quoted ("> ") lines and wrapper-script output; all of that is tolerated.

Rows keep nccl-tests' own algbw/busbw. They are also recomputed from size and time with the
collective's spec, allowing for the printed precision, and disagreements are counted: a log
from NCCL_ALGO=NVLS (other all_reduce factor), from all_gather before mid-2020 (algbw already
scaled by (n-1)/n, NVIDIA/nccl-tests issue #45) or imported under the wrong collective name
shows up there.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from topoprof.errors import InputError, ParseError
from topoprof.specs.collective_spec import COLLECTIVES, BenchRow, CollectiveSpec, algbw_gbps, get_collective

DEFAULT_COLLECTIVE = "all_reduce"

_QUOTE_RE = re.compile(r"^\s*>\s?")
_NTHREAD_RE = re.compile(r"nThreads?:?\s+(\d+)\s+nGpus:?\s+(\d+)", re.ASCII)
_RANK_RE = re.compile(
    r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$",
    re.ASCII,
)
_NCCL_VERSION_RE = re.compile(r"NCCL version\s+(\S+)")
_TESTS_VERSION_RE = re.compile(r"nccl-tests version\s+(\S+)")
_STARTING_RE = re.compile(r"Collective test starting:\s*(\S+)")
_BINARY_RE = re.compile(r"(?<![A-Za-z0-9_])([a-z][a-z0-9_]*?)_perf(?:_mpi)?(?![A-Za-z0-9_])")
_OOB_RE = re.compile(r"Out of bounds values\s*:\s*(\d+)", re.ASCII)
_AVG_RE = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)")
_ROW_START_RE = re.compile(r"^\s*\d+\s+\d+\s+[A-Za-z]", re.ASCII)
_UINT_RE = re.compile(r"[0-9]+")

_GROUP_DEFAULT = ("time", "algbw", "busbw", "#wrong")
_GROUP_LABELS = ("out-of-place", "in-place")


@dataclass(frozen=True)
class NcclTestsLog:
    """One nccl-tests run: its rows (out-of-place or in-place columns) and what the log says.

    nranks: from the `Rank` lines (every process under MPI), else nThread x nGpus (which
    counts one process only), else None. devices/hosts: in rank order, from the `Rank` lines.
    header: the lines before the first row, as found. collective_from: where the collective
    came from: the log (`Collective test starting:` or a `*_perf` name), the argument, or the
    all_reduce default.
    """

    source: str
    collective: str
    nranks: int | None
    devices: tuple[str, ...]
    rows: tuple[BenchRow, ...]
    avg_busbw_gbps: float | None
    header: tuple[str, ...]
    hosts: tuple[str, ...] = ()
    nccl_version: str | None = None
    nccl_tests_version: str | None = None
    out_of_bounds: int | None = None
    algbw_mismatches: int = 0  # rows whose printed algbw != size/time (beyond print precision)
    busbw_mismatches: int = 0  # rows whose printed busbw != recomputed algbw * factor(nranks)
    collective_from: str = "default"  # "log", "argument" or "default"
    which: str = "out"


@dataclass
class _Layout:
    lead: tuple[str, ...] | None = None  # column names before the first time column
    group: tuple[str, ...] = _GROUP_DEFAULT
    groups: int | None = None


def _strip(line: str) -> str:
    return _QUOTE_RE.sub("", line, count=1)


def _column_header(line: str) -> _Layout | None:
    """The `# size count type ... time algbw busbw #wrong ...` line, as a layout."""
    tokens = line.lstrip("#").split()
    if len(tokens) < 4 or tokens[0] != "size" or tokens[1] != "count":
        return None
    starts = [i for i, t in enumerate(tokens) if t in ("time", "cputime")]
    if not starts:
        return None
    first = starts[0]
    return _Layout(lead=tuple(tokens[:first]), group=tuple(tokens[first : first + 4]), groups=len(starts))


def _split_runs(lines: list[str]) -> list[list[tuple[int, str]]]:
    """Blocks of (line number, text), each holding one run; a run ends at its Avg line."""
    blocks: list[list[tuple[int, str]]] = [[]]
    has_rows = False
    for number, raw in enumerate(lines, start=1):
        line = _strip(raw)
        if has_rows and _NTHREAD_RE.search(line) and line.lstrip().startswith("#"):
            blocks.append([])  # a new run without the previous one's footer
            has_rows = False
        blocks[-1].append((number, raw))
        if _ROW_START_RE.match(line):
            has_rows = True
        elif has_rows and _AVG_RE.search(line):
            blocks.append([])
            has_rows = False
    return [b for b in blocks if any(_ROW_START_RE.match(_strip(t)) for _, t in b)]


def _number(token: str, column: str, group: str, source: str, number: int) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError(source, number, f"column '{column}' ({group}): {token!r} is not a number") from None


def _wrong(token: str, column: str, group: str, source: str, number: int) -> int | None:
    token = token.rstrip("*")
    if token == "N/A" or column == "error":
        # `error` (old releases) is the max deviation of any element, not a count of wrong ones.
        return None
    if _UINT_RE.fullmatch(token):
        return int(token)
    _number(token, column, group, source, number)
    return None  # a float such as 0e+00: an old-style error value without a header line


def _half_ulp(token: str) -> float:
    """Half a unit in the last printed place: '12.25' -> 0.005, '16801' -> 0.5."""
    try:
        exponent = Decimal(token).as_tuple().exponent
    except InvalidOperation:
        return 0.0
    return 0.5 * 10.0**exponent if isinstance(exponent, int) else 0.0


def _agrees(printed: str, value: float, time_token: str, time_us: float) -> bool:
    """printed == value up to the rounding of the printed bandwidth and of the printed time."""
    tolerance = _half_ulp(printed) + abs(value) * _half_ulp(time_token) / time_us + 1e-9
    return abs(float(printed) - value) <= tolerance


class _Run:
    """State while reading one block."""

    def __init__(self, source: str, which: str):
        self.source, self.which = source, which
        self.layout = _Layout()
        self.header: list[str] = []
        self.rows: list[tuple[int, list[str]]] = []
        self.ranks: dict[int, tuple[str, str]] = {}
        self.per_process: int | None = None
        self.nccl_version: str | None = None
        self.tests_version: str | None = None
        self.starting: tuple[int, str] | None = None
        self.binary: tuple[int, str] | None = None
        self.oob: int | None = None
        self.avg: float | None = None

    def feed(self, number: int, raw: str) -> None:
        line = _strip(raw).rstrip()
        in_table = bool(self.rows) or self.layout.lead is not None
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if (in_table and _UINT_RE.fullmatch(first)) or _ROW_START_RE.match(line):
            self.rows.append((number, line.split()))
            return
        if not self.rows:
            self.header.append(raw.rstrip())
            self._preamble(number, line)
        self._footer(line)

    def _preamble(self, number: int, line: str) -> None:
        layout = _column_header(line) if line.lstrip().startswith("#") else None
        if layout is not None:
            self.layout = layout
        if m := _RANK_RE.search(line):
            self.ranks.setdefault(int(m.group(1)), (m.group(2), m.group(3)))
        if (m := _NTHREAD_RE.search(line)) and int(m.group(1)) * int(m.group(2)) > 0:
            self.per_process = int(m.group(1)) * int(m.group(2))
        if m := _NCCL_VERSION_RE.search(line):
            self.nccl_version = m.group(1)
        if m := _TESTS_VERSION_RE.search(line):
            self.tests_version = m.group(1)
        if m := _STARTING_RE.search(line):
            self.starting = (number, m.group(1))
        for m in _BINARY_RE.finditer(line):
            self.binary = (number, m.group(1))

    def _footer(self, line: str) -> None:
        if m := _OOB_RE.search(line):
            self.oob = int(m.group(1))
        if m := _AVG_RE.search(line):
            try:
                value = float(m.group(1))
            except ValueError:
                value = math.nan
            self.avg = None if math.isnan(value) else value

    def nranks(self) -> int | None:
        # Rank lines cover every process under MPI; nThread x nGpus counts one process only.
        return max(self.ranks) + 1 if self.ranks else self.per_process

    def collective(self, requested: str | None) -> tuple[CollectiveSpec, str]:
        found = self.starting or self.binary
        spec_from_log = None
        if found is not None:
            number, binary = found
            binary = binary.removesuffix("_mpi").removesuffix("_perf")
            spec_from_log = next((s for s in COLLECTIVES.values() if s.nccl_tests_binary == f"{binary}_perf"), None)
            if spec_from_log is None:
                supported = ", ".join(s.nccl_tests_binary for s in COLLECTIVES.values())
                raise ParseError(self.source, number, f"log is from {binary}_perf, which is not supported; supported: "
                                                      f"{supported}")
        if requested is not None:
            spec = get_collective(requested)
            if spec_from_log is not None and spec_from_log is not spec:
                assert found is not None  # the log named its binary
                raise ParseError(
                    self.source, found[0], f"log is from {spec_from_log.nccl_tests_binary} but "
                                           f"collective={requested!r} was given"
                )
            return spec, "log" if spec_from_log is not None else "argument"
        if spec_from_log is not None:
            return spec_from_log, "log"
        return get_collective(DEFAULT_COLLECTIVE), "default"

    def _row_layout(self, number: int, tokens: list[str]) -> tuple[int, int]:
        """(number of columns before the first time column, number of 4-column groups)."""
        lay = self.layout
        if lay.lead is not None:
            assert lay.groups is not None  # read from the same header as `lead`
            expected = len(lay.lead) + 4 * lay.groups
            if len(tokens) != expected:
                names = " ".join(lay.lead + lay.group * lay.groups)
                raise ParseError(self.source, number, f"row has {len(tokens)} columns, expected {expected} ({names})")
            return len(lay.lead), lay.groups
        if len(tokens) < 7:
            raise ParseError(
                self.source, number,
                f"row has {len(tokens)} columns; expected size count type [redop] [root] then time algbw busbw #wrong",
            )
        # No header line: size count type, optional redop/root, then one or two groups of 4.
        groups = 2 if len(tokens) >= 11 else 1
        return len(tokens) - 4 * groups, groups

    def row(self, number: int, tokens: list[str], spec: CollectiveSpec,
            nranks: int | None) -> tuple[BenchRow, bool, bool]:
        """The row and whether its algbw and busbw agree with recomputation."""
        lead, groups = self._row_layout(number, tokens)
        if not _UINT_RE.fullmatch(tokens[1]):
            raise ParseError(self.source, number, f"column 'count': {tokens[1]!r} is not a whole number")
        index = 0 if self.which == "out" else 1
        if index >= groups:
            raise ParseError(self.source, number, "row has no in-place columns (which='in')")
        label = _GROUP_LABELS[index]
        at = lead + 4 * index
        t_tok, a_tok, b_tok, w_tok = tokens[at : at + 4]
        names = self.layout.group
        time_us = _number(t_tok, names[0], label, self.source, number)
        alg: float | None = _number(a_tok, names[1], label, self.source, number)
        bus: float | None = _number(b_tok, names[2], label, self.source, number)
        wrong = _wrong(w_tok, names[3], label, self.source, number)
        size = int(tokens[0])
        if nranks == 1:  # nccl-tests prints S / t and a busbw of 0; one rank moves nothing between GPUs
            alg = bus = None
        bench = BenchRow(spec.name, size, int(tokens[1]), tokens[2], time_us, alg, bus, wrong)
        if not time_us > 0:
            return bench, True, True
        expected = algbw_gbps(size, time_us)
        alg_ok = _agrees(a_tok, expected, t_tok, time_us)
        bus_ok = nranks is None or _agrees(b_tok, expected * spec.busbw_factor(nranks), t_tok, time_us)
        return bench, alg_ok, bus_ok


def _parse_block(block, source: str, collective: str | None, which: str) -> NcclTestsLog:
    run = _Run(source, which)
    for number, raw in block:
        run.feed(number, raw)
    spec, collective_from = run.collective(collective)
    nranks = run.nranks()
    rows, alg_bad, bus_bad = [], 0, 0
    for number, tokens in run.rows:
        bench, alg_ok, bus_ok = run.row(number, tokens, spec, nranks)
        rows.append(bench)
        alg_bad += not alg_ok
        bus_bad += not bus_ok
    ordered = [run.ranks[r] for r in sorted(run.ranks)]
    hosts = tuple(dict.fromkeys(host for host, _ in ordered))
    return NcclTestsLog(
        source=source,
        collective=spec.name,
        nranks=nranks,
        devices=tuple(device for _, device in ordered),
        rows=tuple(rows),
        avg_busbw_gbps=run.avg,
        header=tuple(run.header),
        hosts=hosts,
        nccl_version=run.nccl_version,
        nccl_tests_version=run.tests_version,
        out_of_bounds=run.oob,
        algbw_mismatches=alg_bad,
        busbw_mismatches=bus_bad,
        collective_from=collective_from,
        which=which,
    )


def parse_nccl_tests_runs(
    text: str, source: str = "<log>", collective: str | None = None, which: str = "out"
) -> list[NcclTestsLog]:
    """Every run in a log that holds several (e.g. a script running each *_perf in turn)."""
    if which not in ("out", "in"):
        raise InputError(f"which must be 'out' (out-of-place columns) or 'in' (in-place), got {which!r}")
    blocks = _split_runs(text.splitlines())
    if not blocks:
        raise ParseError(source, None, "no nccl-tests table rows found (lines like '  8  2  float  sum  -1  12.25  "
                                       "0.00  0.00  0 ...')")
    return [_parse_block(b, source, collective, which) for b in blocks]


def parse_nccl_tests(
    text: str, source: str = "<log>", collective: str | None = None, which: str = "out"
) -> NcclTestsLog:
    """One nccl-tests run. ParseError(source, line, ...) on a malformed row or when no rows exist."""
    runs = parse_nccl_tests_runs(text, source, collective, which)
    if len(runs) > 1:
        second = next(n for n, t in _split_runs(text.splitlines())[1] if _ROW_START_RE.match(_strip(t)))
        raise ParseError(
            source, second, f"a second nccl-tests run's table starts here ({len(runs)} runs in all); read them with "
                            f"parse_nccl_tests_runs()"
        )
    return runs[0]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None


def read_nccl_tests(path: str, **kw) -> NcclTestsLog:
    """parse_nccl_tests on a file; InputError 'PATH: cannot read: reason' when it cannot be read."""
    return parse_nccl_tests(_read(path), source=path, **kw)


def read_nccl_tests_runs(path: str, **kw) -> list[NcclTestsLog]:
    """parse_nccl_tests_runs on a file."""
    return parse_nccl_tests_runs(_read(path), source=path, **kw)
