"""The examples README.md and docs/ show, run again and compared with what the commands print now.

    python tests/docs_examples.py                   check every example (exit 1, with a diff, on a drift)
    python tests/docs_examples.py --write           write the exact examples' outputs anew
    python tests/docs_examples.py --write --recorded   also record anew the measured ones this machine runs
    python tests/docs_examples.py --list            list the examples and how each is checked
    python tests/docs_examples.py -k 'topoprof scan'   only the examples whose command holds that text

An example is a fenced block whose first line is `$ topoprof ARGS` (or `$ NAME=VALUE ... topoprof
ARGS`): the command, then what it printed (stdout and stderr together, as a terminal shows them).
HTML comments on the lines just above the fence say how it is checked:

  (none)                              exact: every line, after what varies by nature is replaced
                                      (time stamps, the host name, tool versions, this checkout's path)
  <!-- recorded: WHERE, DATE -->      measured, so its numbers differ run to run: run it, and compare
                                      every line with its numbers replaced (a renamed column or a new
                                      section is caught, another timing is not)
  <!-- recorded: WHERE, DATE; gpu --> needs a GPU: shown as recorded there, not run
  <!-- fake-nvml: SCENARIO -->        run against the test suite's fake NVML (tests/fake_nvml.py)
  <!-- exit: N -->                    the exit status it ends with (default 0)
  <!-- excerpt: PATH -->              a block quoting lines of PATH (no `$` line): each is there, in order

A line `...` alone stands for lines left out (any number, none included); the kept lines are
compared in order. Commands run as `python -m topoprof ARGS` with this checkout first on
PYTHONPATH, each in a scratch folder of its own with links to tests/ and to every folder of
reports/, so that what a command writes (a scan's report, a profile) lands there and never in the
checkout. `tests/test_docs_examples.py` runs the check.
"""
from __future__ import annotations

import argparse
import datetime
import difflib
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from helpers import cli_server

ROOT = Path(__file__).resolve().parent.parent
# Selective op checkpointing's host cost per op is measured where the model runs; stated, as
# tests/golden/outputs.py states it, so that an example's output depends on the code alone.
STATED = {"TOPOPROF_SELECTIVE_CHECKPOINT_RATIO": "4.2"}
TESTS = ROOT / "tests"
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
ELISION = "..."
TIMEOUT_S = 600

# The host the recorded examples were taken on, and this one: both read as <host>.
RECORDED_HOSTS = ("vm",)

_FENCE = re.compile(r"^(```|~~~)")
_COMMENT = re.compile(r"^<!--\s*(.*?)\s*-->\s*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# What differs from run to run by nature, in the order replaced.
_VOLATILE = (
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"\d{8}T\d{6}Z"), "<time>"),
    (re.compile(r"\b(torch|topoprof|python|Python|CUDA|cuda|NCCL|nccl|driver) v?\d+(\.\d+)+[\w.+-]*"), r"\1 <version>"),
    (re.compile(r"^(topoprof profile: ).+? \("), r"\1<device> ("),  # the CPU's or GPU's model name
)
# A number as the tools print them: 1,024.8  -6.9  1.39e-17  0.5
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:e[-+]?\d+)?")
# An SI prefix on a unit after a number (245 MFLOP/s, 1.65 GB/s, 4 MiB): which one depends on the number.
_PREFIX = re.compile(r"(#) ?[kKMGT](?=i?B\b|i?B/s|FLOP/s)")
# Whether a measurement fell inside its predicted range is itself measured.
_INSIDE = re.compile(r"(#) (in|out)\b")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int           # 1-based line of the fence
    kind: str           # exact | shape | gpu | excerpt
    command: str        # after `$ `; for an excerpt, the file quoted
    expected: tuple[str, ...]
    exit_code: int = 0
    fake_nvml: str | None = None
    recorded: str | None = None
    first: int = 0      # 0-based index of the first output line in the file
    last: int = 0       # 0-based index one past the last output line (the closing fence)

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


@dataclass(frozen=True)
class Outcome:
    example: Example
    ok: bool
    seconds: float
    detail: str = ""
    raw: tuple[str, ...] = ()   # what the command printed, for --write


# ---- finding the examples ---------------------------------------------------------------------


def _notes_above(lines: list[str], fence: int) -> dict[str, str]:
    """The `<!-- key: value -->` comments directly above line `fence` (blank lines allowed between)."""
    notes: dict[str, str] = {}
    i = fence - 1
    while i >= 0 and (not lines[i].strip() or _COMMENT.match(lines[i].strip())):
        match = _COMMENT.match(lines[i].strip())
        if match:
            key, _, value = match.group(1).partition(":")
            notes.setdefault(key.strip().lower(), value.strip())
        i -= 1
    return notes


def _example(path: Path, lines: list[str], fence: int, end: int) -> Example | None:
    body = [line.rstrip() for line in lines[fence + 1:end]]
    notes = _notes_above(lines, fence)
    common = dict(path=path, line=fence + 1, last=end)
    if "excerpt" in notes:
        return Example(kind="excerpt", command=notes["excerpt"], expected=tuple(body), first=fence + 1, **common)
    if not body or not body[0].startswith("$ "):
        return None
    words = shlex.split(body[0][2:])
    program = next((w for w in words if not _ENV.match(w)), None)
    if program != "topoprof":
        return None
    recorded = notes.get("recorded")
    kind = "exact"
    if recorded is not None:
        kind = "gpu" if "gpu" in [part.strip().lower() for part in recorded.split(";")] else "shape"
    return Example(kind=kind, command=body[0][2:], expected=tuple(_trim(body[1:])), first=fence + 2,
                   exit_code=int(notes.get("exit", "0")), fake_nvml=notes.get("fake-nvml"),
                   recorded=recorded, **common)


def find_examples(paths=DOCS) -> list[Example]:
    found = []
    for path in paths:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        fence = None
        for i, line in enumerate(lines):
            if _FENCE.match(line.strip()):
                if fence is None:
                    fence = i
                else:
                    example = _example(Path(path), lines, fence, i)
                    if example is not None:
                        found.append(example)
                    fence = None
    return found


# ---- comparing --------------------------------------------------------------------------------


def _trim(lines) -> list[str]:
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def normalized(line: str) -> str:
    """A line with what varies by nature replaced: time stamps, host names, versions, the device."""
    line = line.replace("python -m topoprof", "topoprof")
    for host in {*RECORDED_HOSTS, socket.gethostname()}:
        line = re.sub(rf"(?<![\w.]){re.escape(host)}(?![\w])", "<host>", line)
    for pattern, placeholder in _VOLATILE:
        line = pattern.sub(placeholder, line)
    return line


def shape(line: str) -> str:
    """A normalized line with its numbers replaced and its spacing collapsed: what a measured
    example keeps from run to run."""
    line = _NUMBER.sub("#", normalized(line))
    line = _INSIDE.sub(r"\1 in|out", _PREFIX.sub(r"\1 ", line))
    return " ".join(line.split())


def _segments(expected) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for line in expected:
        if line.strip() == ELISION:
            out.append([])
        else:
            out[-1].append(line)
    return out


def align(expected, actual, same, anchored: bool = True) -> list[int] | None:
    """Where each kept line of `expected` is in `actual` (indices), or None if they are not all there
    in order. `...` lines stand for any number of lines; `anchored`: the first and last segments
    sit at the start and end of `actual` unless an elision stands there."""
    segments = _segments(expected)
    expected = [line for line in expected if line.strip() != ELISION]
    at, found = 0, []

    def fits(seg, start):
        return start + len(seg) <= len(actual) and all(same(e, actual[start + j]) for j, e in enumerate(seg))

    for n, seg in enumerate(segments):
        if not seg:
            continue
        first, last = n == 0, n == len(segments) - 1
        if anchored and last and len(segments) > 1:  # the tail, after an elision: it ends the output
            start = len(actual) - len(seg)
            if start < at or not fits(seg, start):
                return None
        elif anchored and first:
            start = 0
            if not fits(seg, 0) or (len(segments) == 1 and len(seg) != len(actual)):
                return None
        else:
            start = next((s for s in range(at, len(actual) - len(seg) + 1) if fits(seg, s)), None)
            if start is None:
                return None
        found += range(start, start + len(seg))
        at = start + len(seg)
    if anchored and segments == [[]] and actual:
        return None  # an empty output was shown, and something was printed
    return found


def _same_exact(expected: str, actual: str) -> bool:
    return normalized(expected) == normalized(actual)


def _same_shape(expected: str, actual: str) -> bool:
    return shape(expected) == shape(actual)


def _diff(example: Example, actual: list[str]) -> str:
    show = normalized if example.kind == "exact" else shape
    diff = difflib.unified_diff([show(x) for x in example.expected], [show(x) for x in actual],
                                f"{example.where} (docs)", "now", n=1, lineterm="")
    return "\n".join(list(diff)[:60])


# ---- running ----------------------------------------------------------------------------------


def _scratch(tmp: Path) -> None:
    """Links to what the examples read (tests/, each folder of reports/); a real reports/ to write in."""
    (tmp / "tests").symlink_to(TESTS)
    (tmp / "reports").mkdir()
    for entry in (ROOT / "reports").iterdir():
        (tmp / "reports" / entry.name).symlink_to(entry)


def _environment(example: Example, tmp: Path) -> dict[str, str]:
    if example.fake_nvml:
        if str(TESTS) not in sys.path:
            sys.path.insert(0, str(TESTS))
        from helpers.fake_driver import driver_env

        env = driver_env(tmp, nvml_scenario=example.fake_nvml)
    else:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in [os.environ.get("PYTHONPATH")] if p]])
    env.update(COLUMNS="80", PYTHONUNBUFFERED="1")  # click wraps --help at the terminal's width
    # op checkpointing's host cost per op, measured where the model runs, stated as the golden outputs state it
    env.update(STATED)
    words = shlex.split(example.command)
    env.update(w.split("=", 1) for w in words[:words.index("topoprof")])
    return env


def run(example: Example) -> Outcome:
    words = shlex.split(example.command)
    args = words[words.index("topoprof") + 1:]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="topoprof-docs-") as name:
        tmp = Path(name)
        _scratch(tmp)
        try:
            proc = cli_server.run(args, cwd=tmp, env=_environment(example, tmp), stderr=subprocess.STDOUT,
                                  timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Outcome(example, False, time.monotonic() - started, f"no end after {TIMEOUT_S} s")
        text = proc.stdout.decode("utf-8", "replace")
        for path in {str(tmp), str(tmp.resolve())}:
            text = text.replace(path + os.sep, "").replace(path, ".")
        text = text.replace(str(ROOT) + os.sep, "").replace("python -m topoprof", "topoprof")  # as the user runs it
    seconds = time.monotonic() - started
    actual = _trim(text.splitlines())
    if proc.returncode != example.exit_code:
        return Outcome(example, False, seconds, f"exit {proc.returncode}, the docs say {example.exit_code}:\n"
                       + "\n".join(actual[-20:]), tuple(actual))
    same = _same_exact if example.kind == "exact" else _same_shape
    if align(example.expected, actual, same) is None:
        return Outcome(example, False, seconds, _diff(example, actual), tuple(actual))
    return Outcome(example, True, seconds, raw=tuple(actual))


def check_excerpt(example: Example) -> Outcome:
    source = ROOT / example.command
    if not source.is_file():
        return Outcome(example, False, 0.0, f"{example.command}: no such file")
    actual = _trim(source.read_text(encoding="utf-8").splitlines())
    found = align(example.expected, actual, lambda e, a: e == a, anchored=False)
    return Outcome(example, found is not None, 0.0,
                   "" if found is not None else f"not every line is in {example.command}, in this order")


def check(example: Example) -> Outcome:
    if example.kind == "excerpt":
        return check_excerpt(example)
    if example.kind == "gpu":
        return Outcome(example, True, 0.0, "needs a GPU: not run")
    return run(example)


# ---- writing ----------------------------------------------------------------------------------


def refreshed(outcome: Outcome) -> list[str] | None:
    """The example's output lines with what the command prints now, keeping its cuts (`...`): each
    kept line is replaced by the line it stands for, found by shape. None if they cannot be matched."""
    example, actual = outcome.example, list(outcome.raw)
    if not any(line.strip() == ELISION for line in example.expected):
        return actual
    where = align(example.expected, actual, _same_shape)
    if where is None:
        return None
    now = iter(where)
    return [line if line.strip() == ELISION else actual[next(now)] for line in example.expected]


def write(outcomes: list[Outcome], recorded: bool) -> list[str]:
    """Rewrite the outputs of the examples that differ; returns what could not be rewritten."""
    failed, edits = [], {}
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    for o in outcomes:
        e = o.example
        if o.ok and not (recorded and e.kind == "shape"):
            continue
        if e.kind not in ("exact", "shape") or (e.kind == "shape" and not recorded) or not o.raw:
            failed.append(f"{e.where}: {e.kind}, not rewritten"
                          + (f" ({o.detail.splitlines()[0]})" if o.detail else ""))
            continue
        new = refreshed(o)
        if new is None:
            failed.append(f"{e.where}: its kept lines are no longer in the output; cut it again by hand")
            continue
        edits.setdefault(e.path, []).append((e, new))
    for path, changes in edits.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for e, new in sorted(changes, key=lambda c: -c[0].first):
            lines[e.first:e.last] = new
            if e.kind == "shape":  # a new recording: its date
                for i in range(e.line - 2, max(e.line - 6, -1), -1):
                    lines[i] = re.sub(r"(<!--\s*recorded:[^;>]*?,\s*)\d{4}-\d\d-\d\d", rf"\g<1>{today}", lines[i])
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {len(changes)} example(s) in {path}")
    return failed


# ---- main -------------------------------------------------------------------------------------


def commands_without_example(examples: list[Example]) -> list[str]:
    """The commands `topoprof --help` lists that no run example shows (each needs at least one)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    text = subprocess.run([sys.executable, "-m", "topoprof", "--help"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120).stdout
    listed = re.findall(r"^  (\w+) ", text.split("Commands:", 1)[-1], re.M)
    shown = {shlex.split(e.command)[shlex.split(e.command).index("topoprof") + 1]
             for e in examples if e.kind in ("exact", "shape") and len(shlex.split(e.command)) > 1}
    return [c for c in listed if c not in shown] or ([] if listed else ["(topoprof --help listed no command)"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)")
    parser.add_argument("--write", action="store_true", help="rewrite the exact examples that differ")
    parser.add_argument("--recorded", action="store_true", help="with --write: record the measured ones anew too")
    parser.add_argument("--list", action="store_true", help="list the examples, run nothing")
    parser.add_argument("--jobs", type=int, default=2, help="examples run at once (default 2)")
    parser.add_argument("-k", dest="only", help="only the examples whose command contains this text")
    args = parser.parse_args(argv)
    files = [p.resolve() for p in args.files] or list(DOCS)
    examples = [e for e in find_examples(files) if not args.only or args.only in e.command]
    if args.list:
        for e in examples:
            print(f"{e.kind:<8} {e.where:<28} {e.command}")
        return 0
    started = time.monotonic()
    slow_first = sorted(examples, key=lambda e: (e.kind != "shape", e.line))  # the measured ones take longest
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = {id(o.example): o for o in pool.map(check, slow_first)}
    outcomes = [done[id(e)] for e in examples]
    for o in outcomes:
        status = "ok " if o.ok else "BAD"
        print(f"{status} {o.example.kind:<8} {o.seconds:6.1f} s  {o.example.where:<28} {o.example.command}")
        if not o.ok:
            print("    " + o.detail.replace("\n", "\n    "))
    missing = commands_without_example(examples) if not (args.files or args.only) else []
    if missing:
        print(f"BAD no run example shows: {', '.join(missing)}")
    counts = {k: sum(e.kind == k for e in examples) for k in ("exact", "shape", "gpu", "excerpt")}
    bad = [o for o in outcomes if not o.ok]
    print(f"{len(examples)} example(s): {counts['exact']} exact, {counts['shape']} by shape, {counts['gpu']} not run "
          f"(GPU), {counts['excerpt']} excerpt(s); {len(bad)} differ; {time.monotonic() - started:.1f} s")
    if args.write:
        failed = write(outcomes, args.recorded)
        for line in failed:
            print(f"not rewritten: {line}")
        return 1 if failed or missing else 0
    return 1 if bad or missing or not examples else 0


if __name__ == "__main__":
    sys.exit(main())
