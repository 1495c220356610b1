"""The torch the kept outputs were written with: CI's pin (`.ci/run`'s `torch==X.Y.Z`). The op
trace follows torch's own ops, which change from release to release (a decomposition more or less,
another kernel count), and a feature may need a newer release; so a test that compares what the
commands print now with outputs kept in the tree runs on that release and is skipped, with the
reason, on another."""
from __future__ import annotations

import re
from pathlib import Path

from topoprof.measure.torch_support import parse_version, torch_version_text

CI_RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"


def ci_torch() -> tuple[int, int] | None:
    found = re.search(r"torch==(\d+\.\d+)", CI_RUN.read_text())
    return parse_version(found.group(1)) if found else None


def other_torch_than_ci() -> str | None:
    """Why the kept outputs cannot be compared here (another torch than CI's), or None."""
    installed, pinned = torch_version_text(), ci_torch()
    if pinned is None or (installed and parse_version(installed) == pinned):
        return None
    return (f"the kept outputs were written with CI's torch {'.'.join(map(str, pinned))} (.ci/run); "
            f"this is torch {installed}, whose ops differ")
