"""Read the GPU/NIC path matrix and CPU/NUMA affinity printed by `nvidia-smi topo -m`.

Check by hand: run `nvidia-smi topo -m`; the legend under the matrix explains every code.

Running nvidia-smi (`run_topo_matrix`) is kept apart from parsing (`parse_topo_matrix`)
so that saved outputs, pasted from issues, chat or Markdown, read exactly like live ones.

Splitting rows: GPU/NIC cells are never blank, so they are the first words after the row
label. Affinity fields after them can be blank, which splitting on whitespace would lose.
nvidia-smi separates fields with tabs and space-aligned copies are those tabs expanded at
width 8, so after `expandtabs(8)` every field starts on a multiple of 8 and each extra stop
skipped is a blank field; this reads tab and space output alike. Words off the tab stops
(hand-aligned text) go to the header columns in order, or to the nearest heading.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from dataclasses import dataclass

from topoprof.errors import InputError, NothingMeasured, ParseError, TopoprofError

PATH_KINDS = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")  # best to worst
_OLD_NAMES = {"SOC": "SYS"}  # older drivers printed SOC for the path across CPU sockets
_KNOWN_CODES = "X, NV#, PIX, PXB, PHB, NODE, SYS (or SOC)"

CPU_AFFINITY = "CPU Affinity"
NUMA_AFFINITY = "NUMA Affinity"
GPU_NUMA_ID = "GPU NUMA ID"
_COLUMNS = (CPU_AFFINITY, NUMA_AFFINITY, GPU_NUMA_ID)

_TAB = 8  # nvidia-smi output is tab-separated; terminals and pastes expand tabs at width 8
_MAX_ID = 1 << 16  # no Linux machine has more CPUs or NUMA nodes; refuse instead of allocating
_PREFIX = re.compile(r"[ \t>]*")  # indentation and Markdown quote markers before a table
_WORD = re.compile(r"\S+")
# Device labels: GPU0, NIC0, or raw RDMA names (mlx5_0, bnxt_re0, ...), which end in a digit.
_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*[0-9]")
_GPU_LABEL = re.compile(r"GPU([0-9]{1,6})")
_VALUE_LIKE = re.compile(r"N/A|[0-9][0-9,-]*")  # what an affinity field looks like
_LEGEND = re.compile(r"[ \t>]*(NIC[0-9]+)\s*:\s*(\S+)\s*")


class AsymmetricTopologyWarning(UserWarning):
    """A path reads differently in its two directions; nvidia-smi prints symmetric matrices."""


@dataclass(frozen=True)
class PathCode:
    """One matrix cell: the kind of path between two devices, and the NVLink count for NV#."""

    kind: str  # one of PATH_KINDS
    nvlinks: int = 0  # the # in NV#, else 0

    def __post_init__(self) -> None:
        if self.kind not in PATH_KINDS:
            raise ValueError(f"unknown path kind {self.kind!r}")
        if self.nvlinks < 0 or (self.kind == "NV") != (self.nvlinks > 0):
            raise ValueError(f"{self.kind} with nvlinks={self.nvlinks}")

    @classmethod
    def parse(cls, text: str) -> PathCode:
        word = text.strip()
        match = re.fullmatch(r"NV([1-9][0-9]{0,3})", word)
        if match:
            return cls("NV", int(match.group(1)))
        kind = _OLD_NAMES.get(word, word)
        if kind == "NV" or kind not in PATH_KINDS:
            raise ValueError(f"unknown path code {text!r}")
        return cls(kind)

    @property
    def rank(self) -> int:
        """0 for X (self) up to 6 for SYS: lower is a better path."""
        return PATH_KINDS.index(self.kind)

    def __str__(self) -> str:
        return f"NV{self.nvlinks}" if self.kind == "NV" else self.kind


@dataclass(frozen=True)
class SmiGpu:
    index: int  # 0 for GPU0
    label: str  # "GPU0"
    cpu_affinity: tuple[int, ...] | None  # expanded, sorted CPU ids; None if blank or N/A
    cpu_affinity_text: str | None  # as printed; None if blank
    numa_affinity: tuple[int, ...] | None  # NUMA node ids; None if blank, N/A or no column
    gpu_numa_id: int | None  # "GPU NUMA ID" column; None if absent or N/A


@dataclass(frozen=True)
class SmiNic:
    index: int  # position among NICs
    label: str  # column label as printed: "NIC0" or "mlx5_0"
    device: str  # device name from the "NIC Legend" (NIC0: mlx5_0), else the label


@dataclass(frozen=True)
class SmiTopology:
    source: str
    gpus: tuple[SmiGpu, ...]
    nics: tuple[SmiNic, ...]
    matrix: tuple[tuple[PathCode, ...], ...]  # square; rows/cols = gpus then nics, as printed

    def __post_init__(self) -> None:
        size = len(self.gpus) + len(self.nics)
        if len(self.matrix) != size or any(len(row) != size for row in self.matrix):
            raise ValueError(f"matrix must be {size}x{size} for {size} devices")

    def gpu_path(self, a: int, b: int) -> PathCode:
        """Path between GPU`a` and GPU`b` (GPU indices as printed: 0 for GPU0)."""
        return self.matrix[self._gpu_position(a)][self._gpu_position(b)]

    def gpu_nic_path(self, gpu: int, nic: int) -> PathCode:
        """Path between GPU`gpu` and the NIC at position `nic` among the NICs."""
        if not 0 <= nic < len(self.nics):
            raise IndexError(f"{self.source}: no NIC at position {nic} ({len(self.nics)} NICs)")
        return self.matrix[self._gpu_position(gpu)][len(self.gpus) + nic]

    def _gpu_position(self, index: int) -> int:
        for position, gpu in enumerate(self.gpus):
            if gpu.index == index:
                return position
        raise IndexError(f"{self.source}: no GPU{index} in the topology")


@dataclass(frozen=True)
class _Header:
    labels: tuple[str, ...]  # device columns, GPUs first
    gpu_count: int
    columns: tuple[tuple[str, int], ...]  # affinity headings and the column each starts at


@dataclass(frozen=True)
class _Row:
    number: int
    codes: tuple[PathCode, ...]
    fields: dict[str, str | None]  # affinity heading -> text as printed (None when blank)


def _layout(raw: str, prefix: str | None = None) -> list[tuple[int, str]]:
    """Words of a line with their columns, counted from the table's left edge.

    The indentation or quote prefix is removed before tabs are expanded, so tab stops fall
    where nvidia-smi put them even when a whole block was indented.
    """
    if prefix is None or not raw.startswith(prefix):
        prefix = _PREFIX.match(raw).group()
    body = raw[len(prefix):].expandtabs(_TAB)
    return [(m.start(), m.group()) for m in _WORD.finditer(body)]


def _is_header(raw: str) -> bool:
    words = raw.lstrip(" \t>").split()
    if not words or words[0] != "GPU0":
        return False
    try:  # the GPU0 data row also starts with GPU0, but its next word is a path code (X)
        PathCode.parse(words[1] if len(words) > 1 else "")
    except ValueError:
        return True
    return False


def _parse_header(raw: str, number: int, prefix: str, source: str) -> _Header:
    words = _layout(raw, prefix)
    labels = []
    while len(labels) < len(words) and _LABEL.fullmatch(words[len(labels)][1]):
        labels.append(words[len(labels)][1])
    columns: list[tuple[str, int]] = []
    rest = words[len(labels):]
    while rest:
        name = next((c for c in _COLUMNS if [w for _, w in rest[:len(c.split())]] == c.split()), None)
        if name is None or name in dict(columns):
            raise ParseError(source, number, f"unexpected column heading {rest[0][1]!r} in the header"
                             f" (expected device labels, then {', '.join(_COLUMNS)})")
        columns.append((name, rest[0][0]))
        rest = rest[len(name.split()):]
    _check_labels(labels, number, source)
    gpu_count = sum(1 for label in labels if _GPU_LABEL.fullmatch(label))
    return _Header(tuple(labels), gpu_count, tuple(columns))


def _check_labels(labels: list[str], number: int, source: str) -> None:
    seen: set[str] = set()
    seen_nic = False
    for label in labels:
        gpu = _GPU_LABEL.fullmatch(label)
        key = f"GPU{int(gpu.group(1))}" if gpu else label  # GPU01 and GPU1 name the same GPU
        if key in seen:
            raise ParseError(source, number, f"column {label} appears twice in the header")
        if gpu and seen_nic:
            raise ParseError(source, number, f"column {label} comes after NIC columns; GPUs must come first")
        seen.add(key)
        seen_nic = seen_nic or not gpu


def _parse_row(raw: str, number: int, label: str, header: _Header, source: str) -> _Row:
    words = _layout(raw)
    if words[0][1] != label:
        hint = "" if words[0][1] in header.labels else " (wrapped or cut lines?)"
        raise ParseError(source, number, f"expected the row for {label}, found {words[0][1]!r}{hint}")
    size = len(header.labels)
    codes = []
    for _, word in words[1:]:
        try:
            codes.append(PathCode.parse(word))
        except ValueError:
            break
    if len(codes) != size:
        following = words[1 + len(codes)][1] if len(codes) + 1 < len(words) else None
        if len(codes) < size and following is not None and not _VALUE_LIKE.fullmatch(following):
            raise ParseError(source, number, f"row {label}: unknown path code {following!r} "
                             f"(known: {_KNOWN_CODES})")
        raise ParseError(source, number, f"row {label}: expected {size} path cells, got {len(codes)}")
    if label not in header.labels[:header.gpu_count]:
        return _Row(number, tuple(codes), {})  # NIC rows carry no affinity fields
    last_start, last_word = words[size]
    fields = _affinity_fields(last_start + len(last_word), words[size + 1:], header, source, number)
    return _Row(number, tuple(codes), fields)


def _affinity_fields(end: int, tail: list[tuple[int, str]], header: _Header,
                     source: str, number: int) -> dict[str, str | None]:
    """Map the words after the path cells to the header's affinity columns."""
    names = [name for name, _ in header.columns]
    if not tail:
        return {}
    if all(start % _TAB == 0 for start, _ in tail):
        return _assign(_fields_by_tab_stops(end, tail), names, source, number)
    if len(tail) == len(names):
        return {name: word for name, (_, word) in zip(names, tail)}
    if len(tail) > len(names):
        raise ParseError(source, number, f"{len(tail)} fields after the path cells, but the header"
                         f" names {len(names)} ({', '.join(names) or 'none'})")
    return _fields_by_heading(tail, header.columns, source, number)


def _fields_by_tab_stops(end: int, tail: list[tuple[int, str]]) -> list[str]:
    """Rebuild tab-separated fields: each extra tab stop skipped is one blank field."""
    fields: list[str] = []
    for start, word in tail:
        next_stop = (end // _TAB + 1) * _TAB
        fields.extend([""] * ((start - next_stop) // _TAB))
        fields.append(word)
        end = start + len(word)
    return fields


def _assign(fields: list[str], names: list[str], source: str, number: int) -> dict[str, str | None]:
    while fields and not fields[-1]:
        fields.pop()
    if len(fields) > len(names):
        # GPU rows carry one blank field more than the header names, before the last column
        # (e.g. "0-63<TAB>0<TAB><TAB>N/A" under "CPU Affinity, NUMA Affinity, GPU NUMA ID").
        middle = fields[len(names) - 1:-1]
        if not names or any(middle):
            extra = ", ".join(repr(field) for field in fields if field)
            raise ParseError(source, number, f"fields after the path cells ({extra}) do not fit"
                             f" the header columns ({', '.join(names) or 'none'})")
        fields = fields[:len(names) - 1] + fields[-1:]
    return {name: (field or None) for name, field in zip(names, fields)}


def _fields_by_heading(tail: list[tuple[int, str]], columns: tuple[tuple[str, int], ...],
                       source: str, number: int) -> dict[str, str | None]:
    fields: dict[str, str | None] = {}
    last = -1
    for start, word in tail:
        index = min(range(len(columns)), key=lambda i: abs(columns[i][1] - start))
        if index <= last:
            raise ParseError(source, number, f"cannot tell which column {word!r} belongs to")
        fields[columns[index][0]] = word
        last = index
    return fields


def _id_list(text: str | None) -> tuple[int, ...] | None:
    """Expand "0-23,48-71" to sorted ids; None for blank or N/A. ValueError if unreadable."""
    if text is None or text.upper() == "N/A":
        return None
    ids: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"([0-9]{1,6})(?:-([0-9]{1,6}))?", part)
        if not match:
            raise ValueError(f"{part!r} is not a number or a range")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low or high >= _MAX_ID:
            raise ValueError(f"{part!r} is not a plausible range")
        ids.update(range(low, high + 1))
    return tuple(sorted(ids))


def _make_gpu(label: str, row: _Row, source: str) -> SmiGpu:
    cpu_text = row.fields.get(CPU_AFFINITY)
    numa_text = row.fields.get(NUMA_AFFINITY)
    numa_id_text = row.fields.get(GPU_NUMA_ID)
    try:
        cpus = _id_list(cpu_text)
        numa = _id_list(numa_text)
        numa_id = _id_list(numa_id_text)
        if numa_id is not None and len(numa_id) != 1:
            raise ValueError(f"{numa_id_text!r} is not one NUMA node")
    except ValueError as err:
        raise ParseError(source, row.number, f"row {label}: cannot read affinity: {err}") from None
    index = int(_GPU_LABEL.fullmatch(label).group(1))
    return SmiGpu(index, label, cpus, cpu_text, numa, numa_id[0] if numa_id else None)


def _check_matrix(header: _Header, rows: list[_Row], source: str) -> None:
    labels = header.labels
    for i, row in enumerate(rows):
        for j, code in enumerate(row.codes):
            if i == j and code.kind != "X":
                raise ParseError(source, row.number, f"row {labels[i]}: the cell for itself must be X, got {code}")
            if i != j and code.kind == "X":
                raise ParseError(source, row.number, f"row {labels[i]}: the cell for {labels[j]} is X,"
                                 " which only marks a device with itself")
    pairs = [(i, j) for i in range(len(rows)) for j in range(i) if rows[i].codes[j] != rows[j].codes[i]]
    if pairs:
        i, j = pairs[0]
        warnings.warn(f"{source}:{rows[i].number}: {labels[i]}->{labels[j]} is {rows[i].codes[j]} but"
                      f" {labels[j]}->{labels[i]} is {rows[j].codes[i]} ({len(pairs)} asymmetric pairs)",
                      AsymmetricTopologyWarning, stacklevel=3)


def _nic_legend(lines: list[str]) -> dict[str, str]:
    """NIC Legend entries ("  NIC0: mlx5_0") printed below the matrix by newer drivers."""
    entries = [match.groups() for match in map(_LEGEND.fullmatch, lines) if match]
    return dict(reversed(entries))  # the first entry for a NIC wins


def _parse_table(lines: list[str], at: int, source: str) -> SmiTopology:
    prefix = _PREFIX.match(lines[at + 1]).group() if at + 1 < len(lines) else ""
    header = _parse_header(lines[at], at + 1, prefix, source)
    rows = []
    for k, label in enumerate(header.labels):
        index = at + 1 + k
        if index >= len(lines) or not _layout(lines[index]):
            found = "a blank line" if any(line.strip() for line in lines[index:]) else "the input ends"
            raise ParseError(source, index + 1, f"table ends after {k} of {len(header.labels)} rows:"
                             f" expected the row for {label}, {found}")
        rows.append(_parse_row(lines[index], index + 1, label, header, source))
    count = header.gpu_count
    gpus = tuple(_make_gpu(label, row, source) for label, row in zip(header.labels, rows[:count]))
    _check_matrix(header, rows, source)  # last, so that a table refused later has not warned
    legend = _nic_legend(lines[at + 1 + len(rows):])
    nics = tuple(SmiNic(i, label, legend.get(label, label)) for i, label in enumerate(header.labels[count:]))
    return SmiTopology(source, gpus, nics, tuple(row.codes for row in rows))


def parse_topo_matrix(text: str, source: str = "<text>") -> SmiTopology:
    """Parse `nvidia-smi topo -m` output; text around the table (prompts, fences, legend) is skipped.

    Line numbers in errors count from the start of `text`, so they match the user's file.
    Raises ParseError(source, line, message) for anything that cannot be read.
    """
    # Split on "\n" only: str.splitlines() also breaks on form feeds and other separators,
    # which would make line numbers disagree with the user's editor.
    lines = [line.rstrip("\r").replace("\r", " ").replace("\xa0", " ") for line in text.split("\n")]
    starts = [i for i, line in enumerate(lines) if _is_header(line)]
    if not starts:
        raise ParseError(source, None, "no `nvidia-smi topo -m` table found"
                         " (no header line starting with GPU0 followed by column labels)")
    first_error: ParseError | None = None
    for at in starts:  # a paste may hold `topo -p2p` or a broken capture before the real table
        try:
            return _parse_table(lines, at, source)
        except ParseError as err:
            first_error = first_error or err
    raise first_error


def read_topo_file(path: str) -> SmiTopology:
    """Parse a saved `nvidia-smi topo -m` output (check by hand: `cat PATH`)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        # PowerShell's `>` writes UTF-16 with a byte-order mark; everything else is UTF-8.
        encoding = "utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
        text = data.decode(encoding)
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: cannot read: not UTF-8 text ({err.reason} at byte {err.start})") from None
    return parse_topo_matrix(text, path)


def run_topo_matrix(timeout_s: float = 20.0) -> str:
    """Run `nvidia-smi topo -m` and return its output (check by hand: `nvidia-smi topo -m`)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise NothingMeasured("nvidia-smi not found on PATH; install the NVIDIA driver, or read a"
                              " saved `nvidia-smi topo -m` output from a file")
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        said = _first_line(err.stderr) or _first_line(err.stdout)
        raise TopoprofError(f"nvidia-smi topo -m did not finish within {timeout_s:g} s"
                            + (f": {said}" if said else "")) from None
    except OSError as err:
        raise TopoprofError(f"cannot run {exe}: {err.strerror or err}") from None
    if done.returncode != 0:
        # nvidia-smi prints some failures (e.g. no driver loaded) on stdout, not stderr.
        said = _first_line(done.stderr) or _first_line(done.stdout) or "no message"
        raise TopoprofError(f"nvidia-smi topo -m failed (exit {done.returncode}): {said}")
    return done.stdout.decode("utf-8", errors="replace")


def _first_line(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        output = output.decode("utf-8", errors="replace")
    return next((line.strip() for line in (output or "").splitlines() if line.strip()), "")
