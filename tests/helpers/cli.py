"""The command line as a user runs it: `python -m topoprof ARGS` in a process of its own; and
`topoprof model --json` run once per session for a command whose output is the code's alone."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from helpers import cli_server


def topoprof(*args: str, timeout: float = 600, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Its exit code, stdout and stderr as text; `timeout` only stops a hung command. Forked from
    the test process's command server where it may be (`helpers.cli_server`)."""
    return cli_server.run(list(args), env=env, cwd=cwd, timeout=timeout, text=True)


@dataclass(frozen=True)
class ModelRun:
    """One `topoprof model ARGS --json`: what it printed, and what it means."""
    returncode: int
    stdout: str
    stderr: str

    @property
    def doc(self) -> dict:
        """The JSON it printed, parsed anew on each read (a test may change its copy)."""
        return json.loads(self.stdout)

    @property
    def text(self) -> str:
        """What the same command prints without --json: `topoprof model` renders its text from the
        document it would print as JSON, through the same reader (`topoprof/commands/model.py`)."""
        from topoprof.model.strategies.model_report import read_model_report
        from topoprof.report.text_model import render_model

        return render_model(read_model_report(self.doc)) + "\n"


class ModelRuns:
    """`topoprof model ARGS --json` for commands that time no model on this machine (a what-if
    traced on meta, or compute given): what they print is the code's and the arguments' (but for
    the host cost per op that selective checkpointing is priced with, measured under 0.1 s in the
    trace worker: a run's own value, as any single run would have), so one run serves every test
    of the session that asks it. Under pytest-xdist the runs are kept in
    the session's temporary folder, which every worker shares: a worker asking for a command
    another is running waits for it (a lock per command) rather than running it twice."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self.kept: dict[tuple[str, ...], ModelRun] = {}

    def __call__(self, *args: str) -> ModelRun:
        if args not in self.kept:
            self.kept[args] = self._shared(args) if self.folder is not None else self._run(args)
        return self.kept[args]

    @staticmethod
    def _run(args: tuple[str, ...]) -> ModelRun:
        proc = topoprof("model", *args, "--json")
        return ModelRun(proc.returncode, proc.stdout, proc.stderr)

    def _shared(self, args: tuple[str, ...]) -> ModelRun:
        assert self.folder is not None
        key = hashlib.sha256(json.dumps([os.getcwd(), *args]).encode()).hexdigest()[:20]
        kept = self.folder / f"{key}.json"
        with open(self.folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if kept.exists():
                return ModelRun(**json.loads(kept.read_text()))
            run = self._run(args)
            partial = kept.with_suffix(".partial")
            partial.write_text(json.dumps(run.__dict__))
            partial.replace(kept)
            return run
