"""Errors that the CLI turns into one line on stderr and a documented exit code.

Exit codes (README "Exit codes"):
  0  success
  1  nothing could be measured (e.g. a GPU-only probe on a machine without a GPU)
  2  bad usage or bad input (unreadable file, impossible option values)
  3  a measurement run failed part-way (a rank died or hung); results measured before are kept.
     Also: the results could not be written where asked and went to the temporary directory
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_NOTHING_MEASURED = 1
EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 3


class TopoprofError(Exception):
    """Base class: the message is the whole one-line error a user sees. `detail_text`, when set, is
    printed under it (the traceback of the user's own code that failed, never topoprof's)."""

    exit_code = EXIT_BAD_INPUT
    detail_text: str = ""


class InputError(TopoprofError):
    """Bad usage or bad input: a file that cannot be read, an impossible option value."""

    exit_code = EXIT_BAD_INPUT


class ParseError(InputError):
    """Text that cannot be read, located as FILE:LINE."""

    def __init__(self, source: str, line: int | None, message: str):
        self.source = source
        self.line = line
        self.detail = message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


class NothingMeasured(TopoprofError):
    """The probe cannot run here (no GPU, no driver, no nvidia-smi)."""

    exit_code = EXIT_NOTHING_MEASURED


class RunFailed(TopoprofError):
    """A multi-rank run ended early: a rank died, hung or raised."""

    exit_code = EXIT_RUN_FAILED


class SavedElsewhere(TopoprofError):
    """Everything was measured, but a result could not be written where asked (the disk filled,
    the mount went read-only): it was written to the temporary directory, which the message names."""

    exit_code = EXIT_RUN_FAILED
