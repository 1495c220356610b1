"""JSON output: dataclasses to plain data, and the envelope every `--json` document carries."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import tempfile
from collections.abc import Mapping
from typing import Any

from topoprof import __version__
from topoprof.errors import InputError

SCHEMA_VERSION = 1


def to_jsonable(obj: Any) -> Any:
    """Plain JSON data from dataclasses, mappings, tuples and sets; NaN/inf become null."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(to_jsonable(v) for v in obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def envelope(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The common head of every JSON document: schema, tool version, host and UTC time."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "tool": {"name": "topoprof", "version": __version__},
        "host": platform.node(),
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **{k: to_jsonable(v) for k, v in payload.items()},
    }


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False)


def load_json(path: str) -> Any:
    """A JSON file, or InputError 'PATH: cannot read: ...' / 'PATH:LINE: not JSON: ...'."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: not JSON: {err.msg}") from None


@dataclasses.dataclass(frozen=True)
class Moved:
    """A result that could not be written where asked: where it went instead (None: nowhere, it
    must be printed) and why. Commands end with exit 3 on it, after everything else is out."""

    option: str
    wanted: str
    written_to: str | None
    reason: str

    def message(self) -> str:
        if self.written_to is None:
            return (f"{self.option} {self.wanted}: cannot write ({self.reason}), nor in the temporary directory;"
                    " it is printed on stdout instead")
        return f"{self.option} {self.wanted}: cannot write ({self.reason}); written to {self.written_to} instead"


def write_text(path: str, text: str, option: str) -> Moved | None:
    """Write a result file. If that fails at the end of a run, the file goes to a new folder in the
    system's temporary directory instead, so nothing measured is lost: the Moved says where and why."""
    try:
        _write(path, text)
        return None
    except OSError as err:
        reason = _why(err)
    try:
        spare = os.path.join(spare_folder(), os.path.basename(path) or "result.json")
        _write(spare, text)
    except OSError:
        spare = None
    return Moved(option, path, spare, reason)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def spare_folder() -> str:
    """A new folder in the system's temporary directory, for results that cannot go where asked."""
    return tempfile.mkdtemp(prefix="topoprof-")


def _why(err: OSError) -> str:
    return err.strerror or str(err)


def check_writable(path: str | None, option: str) -> None:
    """Refuse, before anything is measured, an output file that could not be written: its folder
    missing or not writable (a read-only mount, a full disk, /proc), or the path a folder."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"{option} {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise InputError(f"{option} {path}: is a folder, not a file")
    reason = _cannot_write_in(folder)
    if reason:
        raise InputError(f"{option} {path}: cannot write in folder {folder}: {reason}")


def check_writable_folder(path: str, option: str) -> None:
    """Refuse, before anything is measured, a report folder that cannot be created or written in.
    Folders created for the check are removed again: a run refused later leaves nothing behind."""
    created = _missing_folders(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise InputError(f"{option} {path}: cannot create the folder: {_why(err)}") from None
    try:
        reason = _cannot_write_in(path)
    finally:
        for folder in reversed(created):
            try:
                os.rmdir(folder)
            except OSError:
                pass
    if reason:
        raise InputError(f"{option} {path}: cannot write in the folder: {reason}")


def _missing_folders(path: str) -> list[str]:
    """The folders `os.makedirs(path)` would create, outermost first."""
    missing: list[str] = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.insert(0, path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _cannot_write_in(folder: str) -> str | None:
    """Why a file cannot be written in `folder`, or None: a small file is written, synced and
    removed, which finds read-only mounts, full disks and pseudo file systems alike (a permission
    test would not: root passes it everywhere)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".topoprof-check-") as probe:
            probe.write(b"topoprof\n")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        return _why(err)
    return None
