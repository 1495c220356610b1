"""Every source a report draws on, with what became of it: a probe that fails is a status and a
reason, never the end of the run.

`attempt(name, fn)` runs one probe (nvidia-smi, NVML, the host, the rank processes, the copies)
and returns its value or None with a `ProbeStatus` that says why: "unavailable" when the source
is not on this machine (no driver, no nvidia-smi), "error" when it is there but failed. The
caller records it and goes on with what the other sources know. Under `topoprof --debug` an
unexpected exception is raised instead, with its traceback.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import click

from topoprof.errors import NothingMeasured, TopoprofError

OK, PARTIAL, UNAVAILABLE, ERROR, SKIPPED = "ok", "partial", "unavailable", "error", "skipped"


@dataclass(frozen=True)
class ProbeStatus:
    name: str    # "nvidia-smi", "NVML", "host", "ranks", "copies", ...
    status: str  # OK, PARTIAL (read, with gaps named in detail), UNAVAILABLE, ERROR, SKIPPED
    detail: str = ""


def _debug() -> bool:
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(obj and obj.get("debug"))


def attempt(name: str, fn: Callable[[], Any]) -> tuple[Any, ProbeStatus]:
    """(fn(), ok) or (None, the reason it failed)."""
    try:
        return fn(), ProbeStatus(name, OK)
    except NothingMeasured as err:
        return None, ProbeStatus(name, UNAVAILABLE, str(err))
    except TopoprofError as err:
        return None, ProbeStatus(name, ERROR, str(err))
    except Exception as err:  # a probe's own bug or an odd driver answer must not end the run
        if _debug():
            raise
        text = str(err).splitlines()[0][:300] if str(err) else ""
        return None, ProbeStatus(name, ERROR, f"{type(err).__name__}: {text}" if text else type(err).__name__)


def summary(statuses) -> list[str]:
    """One line per source that is not plainly ok, for notes and the printed summary."""
    return [f"{s.name}: {s.status}" + (f": {s.detail}" if s.detail else "")
            for s in statuses if s.status != OK]
