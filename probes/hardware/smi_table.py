"""Reading one `nvidia-smi topo -m` table: its header, the path cells of every row, the affinity
fields of GPU rows, and the records they make. `topoprof.probes.hardware.nvidia_smi` is the public face; the words
and columns come from `topoprof.probes.hardware.smi_text`.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from topoprof.errors import ParseError
from topoprof.probes.hardware.smi_text import (
    APART,
    EITHER,
    GLUE,
    LABEL,
    SHIFT,
    TAB,
    VALUE,
    VALUE_LIKE,
    Glue,
    Word,
    affinity_fields,
    clean_lines,
    id_list,
    join_wrapped,
    layout,
    prefix_of,
    split_headings,
    split_labels,
    tail_readings,
    terminal_width,
    unglue,
)

PATH_KINDS = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")  # best to worst
_OLD_NAMES = {"SOC": "SYS"}  # older drivers printed SOC for the path across CPU sockets
_KNOWN_CODES = "X, NV#, PIX, PXB, PHB, NODE, SYS (or SOC)"

CPU_AFFINITY = "CPU Affinity"
NUMA_AFFINITY = "NUMA Affinity"
GPU_NUMA_ID = "GPU NUMA ID"
_COLUMNS = (CPU_AFFINITY, NUMA_AFFINITY, GPU_NUMA_ID)

_HEADING_WORDS = frozenset(" ".join(_COLUMNS).split())
# A header wider than the terminal fills a few lines (three for 8 GPUs + 6 NICs at 80 columns).
_MAX_WRAPPED_LINES = 8
_GPU_LABEL = re.compile(r"GPU([0-9]{1,6})")
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
    notes: tuple[str, ...] = ()  # what could not be read ("FILE:LINE: ..."), or was mended

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
    unread: tuple[str, ...] = ()  # the words after the labels when they are not those headings


@dataclass(frozen=True)
class _Row:
    number: int
    codes: tuple[PathCode, ...]
    fields: dict[str, str | None]  # affinity heading -> text as printed (None when blank)


def _is_code(text: str) -> bool:
    try:
        PathCode.parse(text)
    except ValueError:
        return False
    return True


def _is_word(text: str) -> bool:
    """A word a table holds: a path code, a device label, an affinity value or a heading word."""
    return (_is_code(text) or bool(LABEL.fullmatch(text)) or bool(VALUE.fullmatch(text))
            or text in _HEADING_WORDS)


def _decide(left: str, right: str) -> str:
    """At a terminal wrap, is left+right one word cut in two, or two words? (see topoprof.probes.hardware.smi_text)"""
    glued = left + right
    if len(left) > 1 and not _is_word(left) and _is_word(left[:-1]) and _is_word(left[-1] + right):
        return SHIFT
    if _is_code(glued) or (_is_word(glued) and not (_is_word(left) and _is_word(right))):
        return GLUE
    if VALUE.fullmatch(left) and VALUE.fullmatch(right) and VALUE.fullmatch(glued):
        return EITHER  # "2" / "0-39,60-79": one CPU list, or a NUMA node and a CPU list
    return APART


def _blanks_between(left: str, right: str, to_next_stop: int) -> int:
    """Blanks that stood between two words a glued copy's cut fell between (see smi_text.unglue):
    none if they are one word cut in two, one inside a heading, else a tab's worth."""
    if _decide(left, right) in (GLUE, EITHER):
        return 0
    if any(f"{left} {right}" in heading for heading in _COLUMNS):
        return 1
    return to_next_stop


def _split_glued(text: str, start: int) -> tuple[str, str] | None:
    """Two cells a terminal wrap left touching ("NODEPIX", "PIX0-63"): a path code, then a code
    or an affinity value starting on a tab stop, where the wrap put it. (The self cell " X " is
    printed with blanks around it, so it never touches.)"""
    for cut in range(len(text) - 1, 0, -1):
        head, tail = text[:cut], text[cut:]
        if (start + cut) % TAB == 0 and _is_code(head) and tail != "X" and (
                _is_code(tail) or VALUE_LIKE.fullmatch(tail)):
            return head, tail
    return None


def _words(raw: str) -> list[str]:
    return raw.lstrip(" \t>").split()


def _is_header(raw: str) -> bool:
    words = _words(raw)
    # the GPU0 data row also starts with GPU0, but its next word is a path code (X)
    return bool(words) and words[0] == "GPU0" and not _is_code(words[1] if len(words) > 1 else "")


def _is_first_row(raw: str) -> bool:
    words = _words(raw)
    return len(words) > 1 and words[0] == "GPU0" and _is_code(words[1])


def _is_some_row(raw: str) -> bool:
    words = _words(raw)
    return len(words) > 1 and bool(LABEL.fullmatch(words[0])) and _is_code(words[1])


def _header_end(lines: list[str], at: int) -> int:
    """Index of the GPU0 row: the next line, or, for a header a terminal wrapped over several
    lines, the first line after it that starts the GPU0 row."""
    for j in range(at + 1, min(len(lines), at + 1 + _MAX_WRAPPED_LINES)):
        if _is_first_row(lines[j]):
            return j
        if not lines[j].strip() or _is_some_row(lines[j]):
            break
    return at + 1


def _ends_table(raw: str, next_label: str | None) -> bool:
    words = _words(raw)
    return (not words or words[0] == next_label or words[0].startswith(("Legend", "```", "$"))
            or words[:2] == ["NIC", "Legend:"] or _LEGEND.fullmatch(raw) is not None)


def _parse_header(words: list[Word], number: int, source: str, cells: int) -> _Header:
    """The header's labels and headings; `cells` is the number of path cells in the GPU0 row."""
    labels: list[str] = []
    while len(labels) < len(words) and LABEL.fullmatch(words[len(labels)][1]):
        labels.append(words[len(labels)][1])
    rest = split_headings(words[len(labels):], _HEADING_WORDS)
    if cells > len(labels):
        labels = split_labels(labels, cells)
    _check_labels(labels, number, source)
    gpu_count = sum(1 for label in labels if _GPU_LABEL.fullmatch(label))
    columns = _affinity_columns(rest)
    if columns is None:  # the matrix does not depend on these columns: its rows are still read
        return _Header(tuple(labels), gpu_count, (), tuple(word for _, word in rest))
    return _Header(tuple(labels), gpu_count, columns)


def _affinity_columns(rest: list[Word]) -> tuple[tuple[str, int], ...] | None:
    """The affinity headings after the device labels and their columns; None if other words are
    there or one comes twice."""
    columns: list[tuple[str, int]] = []
    while rest:
        name = next((c for c in _COLUMNS if [w for _, w in rest[:len(c.split())]] == c.split()), None)
        if name is None or name in dict(columns):
            return None
        columns.append((name, rest[0][0]))
        rest = rest[len(name.split()):]
    return tuple(columns)


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


def _read_codes(words: list[Word], size: int) -> tuple[list[PathCode], list[Word]]:
    """The path cells after the row label, and the words after them."""
    codes: list[PathCode] = []
    rest = list(words[1:])
    while rest:
        start, word = rest[0]
        if _is_code(word):
            codes.append(PathCode.parse(word))
            rest.pop(0)
            continue
        glued = _split_glued(word, start) if len(codes) < size else None
        if glued is None:
            break
        codes.append(PathCode.parse(glued[0]))
        rest[0] = (start + len(glued[0]), glued[1])
    return codes, rest


def _parse_row(words: list[Word], number: int, label: str, header: _Header, source: str,
               notes: list[str], either: dict[int, int] | None = None) -> _Row:
    if words[0][1] != label:
        hint = "" if words[0][1] in header.labels else " (wrapped or cut lines?)"
        raise ParseError(source, number, f"expected the row for {label}, found {words[0][1]!r}{hint}")
    size = len(header.labels)
    codes, tail = _read_codes(words, size)
    if len(codes) != size:
        following = tail[0][1] if tail else None
        if len(codes) < size and following is not None and not VALUE_LIKE.fullmatch(following):
            raise ParseError(source, number, f"row {label}: unknown path code {following!r} "
                             f"(known: {_KNOWN_CODES})")
        raise ParseError(source, number, f"row {label}: expected {size} path cells, got {len(codes)}")
    if label not in header.labels[:header.gpu_count] or not tail or header.unread:
        # NIC rows carry no affinity fields; under headings that cannot be read they are unknown
        return _Row(number, tuple(codes), {})
    last_start, last_word = words[len(words) - len(tail) - 1]
    readings = {tuple(sorted(f.items())) for f in (
        affinity_fields(last_start + len(last_word), option, header.columns)
        for option in tail_readings(words, len(words) - len(tail), either or {})) if f is not None}
    if len(readings) == 1:
        return _Row(number, tuple(codes), dict(readings.pop()))
    shown = ", ".join(repr(word) for _, word in tail)
    names = ", ".join(name for name, _ in header.columns) or "none"
    why = ("can be read more than one way where a terminal wrapped the line" if readings
           else f"do not fit the header columns ({names})")
    notes.append(f"{source}:{number}: row {label}: the fields after the path cells ({shown}) {why};"
                 " its CPU and NUMA affinity are unknown")
    return _Row(number, tuple(codes), {})


def _read_ids(row: _Row, column: str, label: str, source: str, notes: list[str]) -> tuple[int, ...] | None:
    """One affinity field; one that cannot be read is unknown, with a note."""
    text = row.fields.get(column)
    try:
        ids = id_list(text)
        if column == GPU_NUMA_ID and ids is not None and len(ids) != 1:
            raise ValueError(f"{text!r} is not one NUMA node")
        return ids
    except ValueError as err:
        notes.append(f"{source}:{row.number}: row {label}: cannot read {column} {text!r} ({err}); taken as unknown")
        return None


def _make_gpu(label: str, row: _Row, source: str, notes: list[str]) -> SmiGpu:
    cpus = _read_ids(row, CPU_AFFINITY, label, source, notes)
    numa = _read_ids(row, NUMA_AFFINITY, label, source, notes)
    numa_id = _read_ids(row, GPU_NUMA_ID, label, source, notes)
    gpu_label = _GPU_LABEL.fullmatch(label)
    assert gpu_label is not None  # the header's labels were read with LABEL
    index = int(gpu_label.group(1))
    cpu_text = row.fields.get(CPU_AFFINITY) if cpus is not None else None
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
    entries = [(match[1], match[2]) for match in map(_LEGEND.fullmatch, lines) if match]
    return dict(reversed(entries))  # the first entry for a NIC wins


class _Table:
    """One table's lines: the header (one line, or several a terminal wrapped) and each row."""

    def __init__(self, lines: list[str], at: int):
        self.lines, self.at = lines, at
        self.first_row = _header_end(lines, at)
        self.wrapped = self.first_row > at + 1
        self.prefix = prefix_of(lines[self.first_row]) if self.first_row < len(lines) else ""
        block = range(at, next((j for j in range(self.first_row, len(lines)) if not lines[j].strip()), len(lines)))
        self.width = terminal_width([lines[j] for j in block], self.prefix)

    def words(self, start: int, stop: int) -> tuple[list[Word], dict[int, int]]:
        """The words of lines start..stop as one logical line, and the breaks open to two readings."""
        parts = self.lines[start:stop]
        if len(parts) == 1:
            return layout(parts[0], self.prefix if start == self.at else None), {}
        return join_wrapped(parts, self.width, self.prefix, _decide)

    def row_end(self, start: int, next_label: str | None, size: int) -> int:
        """The line after row `start`: in a wrapped copy, or when the row lacks cells, the lines
        that continue it come first."""
        stop = start + 1
        while stop < len(self.lines) and not _ends_table(self.lines[stop], next_label):
            if not self.wrapped and len(_read_codes(self.words(start, stop)[0], size)[0]) >= size:
                break
            stop += 1
        return stop


def _parse_table(lines: list[str], at: int, source: str, glue: Glue | None) -> SmiTopology:
    table = _Table(lines, at)
    header_words = table.words(at, table.first_row)[0]
    second = header_words[1][1] if len(header_words) > 1 else None
    first = table.words(table.first_row, table.row_end(table.first_row, second, len(header_words)))[0]
    header = _parse_header(header_words, at + 1, source, len(_read_codes(first, len(header_words))[0]))
    rows: list[_Row] = []
    notes: list[str] = []
    index = table.first_row
    for k, label in enumerate(header.labels):
        if index >= len(lines) or not lines[index].strip():
            found = "a blank line" if any(line.strip() for line in lines[index:]) else "the input ends"
            raise ParseError(source, index + 1, f"table ends after {k} of {len(header.labels)} rows:"
                             f" expected the row for {label}, {found}")
        next_label = header.labels[k + 1] if k + 1 < len(header.labels) else None
        stop = table.row_end(index, next_label, len(header.labels))
        words, either = table.words(index, stop)
        rows.append(_parse_row(words, index + 1, label, header, source, notes, either))
        index = stop
    count = header.gpu_count
    gpus = tuple(_make_gpu(label, row, source, notes) for label, row in zip(header.labels, rows[:count]))
    _check_matrix(header, rows, source)  # last, so that a table refused later has not warned
    if header.unread:
        notes.insert(0, f"{source}:{at + 1}: the header's words after the device labels"
                        f" ({', '.join(map(repr, header.unread))}) are not the headings {', '.join(_COLUMNS)};"
                        " CPU and NUMA affinity are unknown")
    if table.wrapped:
        notes.insert(0, f"{source}:{at + 1}: the table was wrapped at {table.width} columns (a terminal"
                        " copy); its lines were joined back")
    glued = [i for i in glue.lines if at <= i < index] if glue else []
    if glue and glued:
        notes.insert(0, _glue_note(glue, glued, len(table.prefix.expandtabs(TAB)), source))
    legend = _nic_legend(lines[index:])
    nics = tuple(SmiNic(i, label, legend.get(label, label)) for i, label in enumerate(header.labels[count:]))
    return SmiTopology(source, gpus, nics, tuple(row.codes for row in rows), tuple(notes))


def _glue_note(glue: Glue, glued: list[int], indent: int, source: str) -> str:
    # the width counts from the table's left edge, as for a hard-wrapped copy: a paste may indent
    where = f"at {glue.width - indent} columns" if glue.width is not None else "by the terminal"
    return (f"{source}:{glued[0] + 1}: {len(glued)} line(s) of the table were wrapped {where} with the rest"
            f" put on the same line after {glue.pad} blanks (a terminal copy); they were joined back")


def parse_topo_matrix(text: str, source: str = "<text>") -> SmiTopology:
    """Parse `nvidia-smi topo -m` output; text around the table (prompts, fences, legend) is skipped.

    Line numbers in errors count from the start of `text`, so they match the user's file. Only a
    path matrix that cannot be read raises ParseError(source, line, message); an affinity field
    that cannot be read is unknown, with a note in `SmiTopology.notes`.
    """
    lines, glue = unglue(clean_lines(text), _blanks_between)
    starts = [i for i, line in enumerate(lines) if _is_header(line)]
    if not starts:
        raise ParseError(source, None, "no `nvidia-smi topo -m` table found"
                         " (no header line starting with GPU0 followed by column labels)")
    first_error: ParseError | None = None
    for at in starts:  # a paste may hold `topo -p2p` or a broken capture before the real table
        try:
            return _parse_table(lines, at, source, glue)
        except ParseError as err:
            first_error = first_error or err
    assert first_error is not None  # starts is not empty
    raise first_error
