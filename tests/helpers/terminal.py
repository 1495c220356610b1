"""What a copy from a terminal holds when a line is wider than the terminal (tmux 3.3a's rules).

Used to turn every saved `nvidia-smi topo -m` fixture into the copy an 80-column terminal would
give. Checked against real tmux captures: `tests/fixtures/topo/30_*` and `31_*` are fixture 18
copied out of tmux, and `terminal_copy` must reproduce them (tests/test_nvidia_smi.py).

- A printable character goes at the cursor; at the last column the cursor stays and the next
  character wraps to the next line first.
- A tab moves to the next multiple of 8, but never past the last column; a tab that arrives while
  a wrap is pending wraps and is used up (the next word starts at column 0).
- `join=True` is tmux's `capture-pane -J`: the lines of one wrapped line are put back together,
  each but the last padded to the terminal's width.

`glued_copy` is another terminal's copy (issue #21, a shell transcript from an 80-column
terminal): a line longer than the width is cut at that column and the rest is put on the same
physical line, after blanks up to a fixed column far to the right (253 in the transcript seen).
Tabs are expanded where the whole line would have put them, so the rest keeps its spacing.
"""
from __future__ import annotations

TAB = 8


def _screen_lines(line: str, width: int) -> list[str]:
    rows: list[str] = []
    row: list[str] = []
    col, pending = 0, False
    for ch in line:
        if pending:
            rows.append("".join(row).rstrip())
            row, col, pending = [], 0, False
            if ch == "\t":
                continue
        if ch == "\t":
            col = min((col // TAB + 1) * TAB, width - 1)
            continue
        row.extend(" " * (col - len(row)))
        if col < len(row):
            row[col] = ch
        else:
            row.append(ch)
        if col == width - 1:
            pending = True
        else:
            col += 1
    rows.append("".join(row).rstrip())
    return rows


def terminal_copy(text: str, width: int = 80, join: bool = False) -> str:
    out: list[str] = []
    for line in text.split("\n"):
        rows = _screen_lines(line, width)
        out.extend(["".join(r.ljust(width) for r in rows[:-1]) + rows[-1]] if join else rows)
    return "\n".join(out)


FAR_COLUMN = 253  # where the transcript of issue #21 put the rest of every line wider than 80


def glued_copy(text: str, width: int = 80, far: int = FAR_COLUMN) -> str:
    out: list[str] = []
    for line in text.split("\n"):
        line = line.expandtabs(TAB).rstrip()
        out.append(line[:width].ljust(far) + line[width:] if len(line) > width else line)
    return "\n".join(out)
