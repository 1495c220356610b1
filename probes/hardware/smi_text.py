"""Words, columns and fields of `nvidia-smi topo -m` text as it really reaches us.

The table reader (`topoprof.probes.hardware.smi_table`) reads a table as words placed at columns. This module turns
the dirty text people and drivers produce into those words, and the words after a row's path
cells into its affinity fields:

- ANSI escapes anywhere: driver 580 underlines the header (ESC[4m ... ESC[0m) even into a file or a
  pipe, and `grep --color`, `script` or a terminal log colour cells. Escapes take no column on a
  terminal, so removing them before tabs are expanded keeps every column where it was.
- Tabs: nvidia-smi separates fields with tabs; terminals and pastes expand them at width 8.
- Terminal wraps: a copy from an 80-column terminal breaks each long line into several physical
  lines (or, joined back by the terminal, keeps one line with the continuation shifted). A
  terminal advances a tab that would cross the right margin only to the last column, prints the
  next character there and wraps after it, so a word can be split across two lines ("N" / "ODE")
  or two cells can touch ("NODEPIX"). `join_wrapped` rebuilds the logical line: line k of a row
  starts at column k x width, and at each break a word is glued back or kept apart depending on
  which reading gives table words. A word that starts in the last column got there by a tab that
  stopped at the margin: how many tab stops (blank fields) were skipped before it is lost, and
  it keeps that column (one before a multiple of 8) so the reader can tell.
- Glued copies: another terminal cuts a long line at its width and puts the rest on the same
  physical line, after blanks up to a fixed column far to the right ("CPU Affi<173 blanks>nity").
  `unglue` takes that pad out again, so each such line is one logical line on its own line number.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

TAB = 8  # nvidia-smi output is tab-separated; terminals and pastes expand tabs at width 8
_MAX_ID = 1 << 16  # no Linux machine has more CPUs or NUMA nodes; refuse instead of allocating
_MAX_READINGS = 64  # ways of reading one row's wrapped affinity fields (2 or 3 per open break)
_MAX_SKIPPED_STOPS = 3  # a tab stopped at the margin stood for 1..3 tab stops (0..2 blank fields)

# CSI sequences (colours, underline: ESC [ ... letter), OSC (ESC ] ... BEL or ESC \), and the
# two-character escapes; what is left of a lone ESC goes too.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|\x1b")
PREFIX = re.compile(r"[ \t>]*")  # indentation and Markdown quote markers before a table


def prefix_of(text: str) -> str:
    """The indentation and quote markers `text` starts with (PREFIX matches every line)."""
    match = PREFIX.match(text)
    assert match is not None
    return match.group()
_WORD = re.compile(r"\S+")
# Device labels: GPU0, NIC0, or raw RDMA names (mlx5_0, bnxt_re0, ...), which end in a digit.
LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*[0-9]")
VALUE_LIKE = re.compile(r"N/A|[0-9][0-9,-]*")  # what an affinity field looks like
VALUE = re.compile(r"N/A|[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*")  # ... and reads as one
# A pad between words this long is a glued copy's: blank fields span at most 3 tab stops (29 blanks
# in the saved outputs), while the pad reaches from the terminal's width to a column far beyond it.
_GLUE_GAP = re.compile(r"(?<=\S) {40,}(?=\S)")
_FIELD = re.compile(r"(?<=  )\S+")  # a word two blanks or more after the one before: a new field

Word = tuple[int, str]  # (column from the table's left edge, text)


def clean_lines(text: str) -> list[str]:
    """Split on "\\n" only (str.splitlines() also breaks on form feeds, which would make line
    numbers disagree with the user's editor); drop CRs, no-break spaces and ANSI escapes."""
    return [_ANSI.sub("", line.rstrip("\r")).replace("\r", " ").replace("\xa0", " ")
            for line in text.split("\n")]


def body(raw: str, prefix: str | None = None) -> str:
    """The line without the table's indentation or quote prefix, tabs expanded.

    The prefix is removed before tabs are expanded, so tab stops fall where nvidia-smi put them
    even when a whole block was indented.
    """
    if prefix is None or not raw.startswith(prefix):
        prefix = prefix_of(raw)
    return raw[len(prefix):].expandtabs(TAB)


def layout(raw: str, prefix: str | None = None) -> list[Word]:
    """Words of one physical line with their columns, counted from the table's left edge."""
    return [(m.start(), m.group()) for m in _WORD.finditer(body(raw, prefix))]


@dataclass(frozen=True)
class Glue:
    """How a glued copy was taken apart: the lines that held the rest of a wider line after a pad,
    the pad's length, and the terminal's width where the lines show it for certain."""

    lines: tuple[int, ...]  # indices of the glued lines
    pad: int  # blanks added between the cut and the rest
    width: int | None  # the column of the cut; None where no line shows it for certain


def unglue(lines: list[str], blanks_between) -> tuple[list[str], Glue | None]:
    """`lines` with the pad of a glued copy taken out of every glued line (see the module doc).
    `blanks_between(left, right, to_next_stop)` says how many blanks stood between two words a cut
    fell between: 0 for one word cut in two, 1 for two words of one field, or `to_next_stop`.

    The pad is the same on every line: the cut is at the terminal's width and the rest starts at
    one far column. Each line shows the pad plus the blanks its cut fell on, so the pad is at most
    the narrowest gap. The fields after the first word of each rest were placed by nvidia-smi's
    tabs: the pad that puts most of them on tab stops is the one, taken as large as the narrowest
    gap allows. Without such fields, the words on either side of each gap tell the fewest blanks
    that stood there, and so the most pad each line allows: the pad is the least of those. Only
    table lines (those that start with a device label) count; a glued legend or prose line alone
    shows the pad at its narrowest gap.
    """
    texts = {i: line.expandtabs(TAB) for i, line in enumerate(lines)}
    # the search starts after indentation and quote markers, whose blanks are no pad
    gaps = {i: match.span() for i, text in texts.items()
            if (match := _GLUE_GAP.search(text, len(prefix_of(text))))}
    if not gaps:
        return lines, None
    widest_pad = min(end - start for start, end in gaps.values())
    votes = [sum(_fields_on_tab_stops(texts[i], *gaps[i], pad) for i in gaps)
             for pad in range(widest_pad - TAB + 1, widest_pad + 1)]
    if max(votes) > 0:
        pad = widest_pad - TAB + 1 + max(range(TAB), key=lambda k: (votes[k], k))
    else:
        pad = min((_pad_from_words(texts[i], *gaps[i], blanks_between) for i in gaps if _is_table_line(texts[i])),
                  default=widest_pad)
    out = list(lines)
    for i, (start, end) in gaps.items():
        out[i] = texts[i][:start] + " " * (end - start - pad) + texts[i][end:]
    cut, rest = max(start for start, _ in gaps.values()), min(end for _, end in gaps.values())
    return out, Glue(tuple(sorted(gaps)), pad, cut if rest - cut == pad else None)


def _is_table_line(text: str) -> bool:
    """A header or row: its first word (after quote markers) is a device label."""
    words = text[len(prefix_of(text)):].split(maxsplit=1)
    return bool(words) and LABEL.fullmatch(words[0]) is not None


def _edge(text: str) -> int:
    """The column of a line's first word, after any quote markers: the table's left edge."""
    match = _WORD.search(text, len(prefix_of(text)))
    return match.start() if match else 0


def _fields_on_tab_stops(text: str, start: int, end: int, pad: int) -> int:
    """For a glued table line, how many fields after the first word of the rest land on a tab
    stop once `pad` blanks are taken out, less those that do not (a field follows two blanks or
    more). Other lines (legend, prose) do not count."""
    if not _is_table_line(text):
        return 0
    edge = _edge(text)
    fields = [m.start() for m in _FIELD.finditer(text, end + 1)]
    return sum(1 if (at - pad - edge) % TAB == 0 else -1 for at in fields)


def _pad_from_words(text: str, start: int, end: int, blanks_between) -> int:
    """The pad of one glued line, from the words on either side of its gap."""
    left, right = text[:start].split()[-1], text[end:].split()[0]
    edge = _edge(text)
    next_stop = edge + ((start - edge) // TAB + 1) * TAB
    return end - start - blanks_between(left, right, next_stop - start)


GLUE, APART, EITHER, SHIFT = "glue", "apart", "either", "shift"


def join_wrapped(parts: list[str], width: int, prefix: str | None, decide) -> tuple[list[Word], dict[int, int]]:
    """Words of a logical line that a terminal `width` columns wide broke into `parts`, and the
    words whose reading is open: {index: where the word could be cut in two}.

    Where a word ends at the margin and the next line starts with a word, `decide(left, right)`
    says whether they are one word cut by the wrap (GLUE), two words (APART), both readings give
    table words (EITHER: glued here, and listed so the caller can try both), or the last
    character of `left` starts `right` (SHIFT: the separator was a tab that stopped at the last
    column, "mlx5_10m" / "lx5_11" is mlx5_10, mlx5_11).
    """
    words: list[Word] = []
    either: dict[int, int] = {}
    for k, raw in enumerate(parts):
        # A copy indented or quoted as a whole carries the prefix on every physical line; a
        # continuation's own leading blanks are columns of the table.
        line = [(start + k * width, text) for start, text in layout(raw, prefix if k == 0 else prefix or "")]
        if k > 0 and words and line:
            words, line, cut = _mend_break(words, line, k * width, decide)
            if cut:
                either[len(words)] = cut
        words.extend(line)
    return words, either


def _mend_break(words: list[Word], line: list[Word], edge: int, decide) -> tuple[list[Word], list[Word], int]:
    (left_at, left), (right_at, right) = words[-1], line[0]
    if left_at + len(left) != edge or right_at != edge:  # a blank at the break: nothing was cut
        return words, line, 0
    verdict = decide(left, right)
    if verdict == SHIFT:
        return words[:-1] + [(left_at, left[:-1])], [(edge - 1, left[-1] + right)] + line[1:], 0
    if verdict == APART:
        return words, line, 0
    return words[:-1], [(left_at, left + right)] + line[1:], len(left) if verdict == EITHER else 0


def terminal_width(lines: list[str], prefix: str | None) -> int:
    """The width of the terminal that wrapped `lines`: the widest line, unless no line reached
    the margin (every break fell on blanks); then the next multiple of 8, since tab-separated
    continuations only line up with the tab stops on such a terminal (80, 120, 160, ...)."""
    ends = [layout(raw, prefix if i == 0 else None)[-1:] for i, raw in enumerate(lines)]
    width = max((start + len(word) for line in ends for start, word in line), default=0)
    at_margin = any(start == width - 1 or start % TAB for line in ends for start, word in line
                    if start + len(word) == width)
    return width if width % TAB == 0 or at_margin else (width // TAB + 1) * TAB


def split_headings(words: list[Word], heading_words: frozenset[str]) -> list[Word]:
    """Headings a terminal wrap left touching ("AffinityNUMA") are split into their words."""
    out: list[Word] = []
    for start, word in words:
        parts = re.findall("|".join(sorted(heading_words, key=len, reverse=True)), word)
        if len(parts) > 1 and "".join(parts) == word:
            for part in parts:
                out.append((start, part))
                start += len(part)
        else:
            out.append((start, word))
    return out


def split_labels(labels: list[str], cells: int) -> list[str]:
    """Two device labels a terminal wrap left touching ("mlx5_10mlx5_11"), split where the first
    row shows more path cells than the header has labels, and only where the cut is certain."""
    cuts = {i: [k for k in range(1, len(label)) if label[k - 1].isdigit() and label[k].isalpha()
                and LABEL.fullmatch(label[:k]) and LABEL.fullmatch(label[k:])]
            for i, label in enumerate(labels)}
    glued = {i: c[0] for i, c in cuts.items() if len(c) == 1}
    if len(labels) + len(glued) != cells:
        return labels
    return [part for i, label in enumerate(labels)
            for part in ((label[:glued[i]], label[glued[i]:]) if i in glued else (label,))]


# ---- affinity fields: the words after a row's path cells -------------------------------------


def tail_readings(words: list[Word], first: int, either: dict[int, int]) -> list[list[Word]]:
    """The words after the path cells, once for each way of reading what a terminal wrap left
    open: a break that gives table words glued or apart, and a word that a tab stopped at the
    margin (column 8k-1), which may belong one, two or three tab stops on."""
    # Each open break doubles the readings and each margin word triples them: the caps apply as
    # they grow, or a row with many of them (a mangled copy) would take exponential time and memory.
    readings = [list(words[first:])]
    for index, cut in sorted(either.items(), reverse=True):
        if index >= first:
            start, word = words[index]
            apart = [(start, word[:cut]), (start + cut, word[cut:])]
            readings += [r[:index - first] + apart + r[index - first + 1:] for r in readings]
            readings = readings[:_MAX_READINGS]
    out = []
    for reading in readings:
        variants = [reading]
        for i, (start, word) in enumerate(reading):
            if start % TAB == TAB - 1:
                variants = [v[:i] + [(start + 1 + TAB * skip, word)] + v[i + 1:]
                            for v in variants for skip in range(_MAX_SKIPPED_STOPS)][:_MAX_READINGS]
        out += variants
    return out


def affinity_fields(end: int, tail: list[Word], columns: tuple[tuple[str, int], ...]) -> dict[str, str | None] | None:
    """Map the words after the path cells (the last of which ends at column `end`) to the
    header's affinity columns ((heading, column) pairs); None if they do not fit."""
    names = [name for name, _ in columns]
    if all(start % TAB == 0 for start, _ in tail):
        fields = _fit(_fields_by_tab_stops(end, tail), len(names))
        return None if fields is None else {name: (field or None) for name, field in zip(names, fields)}
    if len(tail) == len(names):
        return {name: word for name, (_, word) in zip(names, tail)}
    if len(tail) > len(names):
        return None
    return _fields_by_heading(tail, columns)


def _fields_by_tab_stops(end: int, tail: list[Word]) -> list[str]:
    """Rebuild tab-separated fields: each extra tab stop skipped is one blank field."""
    fields: list[str] = []
    for start, word in tail:
        next_stop = (end // TAB + 1) * TAB
        fields.extend([""] * ((start - next_stop) // TAB))
        fields.append(word)
        end = start + len(word)
    return fields


def _fit(fields: list[str], count: int) -> list[str] | None:
    """`count` fields from a row that has more: drivers print an empty field before a column
    (`0-63<TAB>0<TAB><TAB>N/A` under three headings; `0-7<TAB><TAB>N/A<TAB><TAB>N/A` on a Tesla
    P4), and a row can start one stop late. Surplus blank fields that come just before a value go,
    the rightmost first; values are never dropped."""
    fields = list(fields)
    while len(fields) > count and fields and not fields[-1]:
        fields.pop()
    while len(fields) > count:
        surplus = [i for i in range(len(fields) - 1) if not fields[i] and fields[i + 1]]
        if not surplus:
            return None
        del fields[surplus[-1]]
    return fields + [""] * (count - len(fields))


def _fields_by_heading(tail: list[Word], columns: tuple[tuple[str, int], ...]) -> dict[str, str | None] | None:
    """Hand-aligned text: each word goes to the nearest heading, in order."""
    fields: dict[str, str | None] = {}
    last = -1
    for start, word in tail:
        index = min(range(len(columns)), key=lambda i: abs(columns[i][1] - start))
        if index <= last:
            return None
        fields[columns[index][0]] = word
        last = index
    return fields


def id_list(text: str | None) -> tuple[int, ...] | None:
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
