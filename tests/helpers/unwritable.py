"""Places a run cannot write to, for the tests of what topoprof does then (tests/test_outputs.py,
tests/test_scan.py). We run as root, so permissions stop nothing: the places are real ones, a path
under /proc or a regular file where a folder should be."""
from __future__ import annotations

import subprocess
import sys


def cli_with(setup: str, *args: str) -> subprocess.CompletedProcess:
    """Run the CLI with `args` in a fresh Python after the statements in `setup`."""
    code = f"import sys\n{setup}\nsys.argv = ['topoprof', *{list(args)!r}]\nfrom topoprof.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("topoprof: error: ")
    return lines[0]
