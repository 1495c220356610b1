"""The command line as a user runs it: `python -m topoprof ARGS` in a process of its own."""
from __future__ import annotations

import subprocess
import sys


def topoprof(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Its exit code, stdout and stderr as text; `timeout` only stops a hung command."""
    return subprocess.run([sys.executable, "-m", "topoprof", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)
