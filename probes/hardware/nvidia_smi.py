"""Read the GPU/NIC path matrix and CPU/NUMA affinity printed by `nvidia-smi topo -m`.

Check by hand: run `nvidia-smi topo -m`; the legend under the matrix explains every code.

Running nvidia-smi (`run_topo_matrix`) is kept apart from parsing (`parse_topo_matrix`) so that
saved outputs, pasted from issues, chat or Markdown, read exactly like live ones.

What matters is the path matrix: GPU x GPU and GPU x NIC cells. It is read wherever it can be:
through ANSI escapes, tabs or spaces, indentation, quotes and fences, and copies a terminal
wrapped (`topoprof.probes.hardware.smi_table` reads a table, `topoprof.probes.hardware.smi_text` turns the text into
words and fields). Only a matrix that cannot be read is refused (ParseError with FILE:LINE). The affinity
fields after it are secondary and vary between drivers (an empty field before a column, N/A
anywhere, a GPU NUMA ID column or none, an extra field on one row): one that cannot be read is
unknown, with a note in `SmiTopology.notes`, never a reason to refuse the file.
"""
from __future__ import annotations

import shutil
import subprocess

from topoprof.errors import InputError, NothingMeasured, TopoprofError
from topoprof.probes.hardware.smi_table import (
    CPU_AFFINITY,
    GPU_NUMA_ID,
    NUMA_AFFINITY,
    PATH_KINDS,
    AsymmetricTopologyWarning,
    PathCode,
    SmiGpu,
    SmiNic,
    SmiTopology,
    parse_topo_matrix,
)

__all__ = ["CPU_AFFINITY", "GPU_NUMA_ID", "NUMA_AFFINITY", "PATH_KINDS", "AsymmetricTopologyWarning", "PathCode",
           "SmiGpu", "SmiNic", "SmiTopology", "parse_topo_matrix", "read_topo_file", "run_topo_matrix"]


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
