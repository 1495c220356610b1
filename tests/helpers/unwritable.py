"""Places a run cannot write to, for the tests of what topoprof does then (tests/test_outputs.py,
tests/test_scan.py). We run as root, so permissions stop nothing: a place that fails only at the
end of a run is a folder turned into a regular file after the check before the run passed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def cli_with(setup: str, *args: str) -> subprocess.CompletedProcess:
    """Run the CLI with `args` in a fresh Python after the statements in `setup`."""
    code = f"import sys\n{setup}\nsys.argv = ['topoprof', *{list(args)!r}]\nfrom topoprof.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def broken_after_check(check: str, folder: Path, spare: Path, *args: str,
                       also: str = "") -> subprocess.CompletedProcess:
    """Run the CLI with `folder` turned into a regular file right after topoprof.jsonio.`check`
    passed for a path in it, as a disk that fills or a mount that goes read-only during the run,
    and the temporary directory set to `spare`; `also`: more statements to run first."""
    setup = (f"import pathlib, shutil, tempfile\n"
             f"import topoprof.jsonio as j\n"
             f"real = j.{check}\n"
             f"def check_then_break(path, option):\n"
             f"    real(path, option)\n"
             f"    if path and path.startswith({str(folder)!r}):\n"
             f"        shutil.rmtree({str(folder)!r}, ignore_errors=True)\n"
             f"        pathlib.Path({str(folder)!r}).write_text('not a folder any more')\n"
             f"j.{check} = check_then_break\n"
             f"tempfile.tempdir = {str(spare)!r}\n{also}")
    return cli_with(setup, *args)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("topoprof: error: ")
    return lines[0]
