"""JSON output: dataclasses to plain data, and the envelope every `--json` document carries."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import tempfile
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

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


T = TypeVar("T")


class SchemaError(ValueError):
    """JSON data that does not have the shape its typed record declares, located by its key path."""


def from_jsonable(cls: type[T], data: Any, where: str = "") -> T:
    """The typed record `cls` (a dataclass) read back from what `to_jsonable` made of it, checked
    against its fields' types; `SchemaError` names the key path where it differs.

    A field missing from the data takes its default (documents written before it existed); a key
    no field names is left unread (documents written after). Values are kept as they are (an int
    stays an int where a float is declared): what a renderer prints of them does not change.
    Where a field's type is a union of dataclasses, the first whose fields without a default are
    all present is read."""
    return _read(cls, data, where or cls.__name__)


def read_document(cls: type[T], doc: dict, where: str) -> T:
    """`from_jsonable` of a topoprof document, or of a part of one written without the envelope:
    refused, naming where, when it carries a schema version other than this topoprof's."""
    version = doc.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise SchemaError(f"{where}: schema_version {version!r}; this topoprof reads {SCHEMA_VERSION}")
    return from_jsonable(cls, doc, where)


def _read(tp: Any, data: Any, where: str) -> Any:
    if tp is Any or tp is object:
        return data
    if dataclasses.is_dataclass(tp):
        return _read_dataclass(tp, data, where)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _read_union(args, data, where)
    if origin is typing.Literal:
        if data not in args:
            raise SchemaError(f"{where}: {data!r} is none of {', '.join(map(repr, args))}")
        return data
    if tp in (dict, list):  # declared without what it holds: kept as written
        _expect(isinstance(data, tp), "an object" if tp is dict else "an array", data, where)
        return data
    if origin in (dict, Mapping):
        _expect(isinstance(data, dict), "an object", data, where)
        return {k: _read(args[1] if args else Any, v, f"{where}.{k}") for k, v in data.items()}
    if origin in (list, tuple):
        _expect(isinstance(data, (list, tuple)), "an array", data, where)
        if origin is tuple and args and args[-1] is not Ellipsis:
            _expect(len(data) == len(args), f"an array of {len(args)}", data, where)
            return tuple(_read(t, v, f"{where}[{i}]") for i, (t, v) in enumerate(zip(args, data)))
        item = args[0] if args else Any
        values = [_read(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return tuple(values) if origin is tuple else values
    return _read_scalar(tp, data, where)


def _read_dataclass(cls: Any, data: Any, where: str) -> Any:
    _expect(isinstance(data, dict), "an object", data, where)
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = _read(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif not _has_default(f):
            raise SchemaError(f"{where}: no {f.name!r}")
    return cls(**values)


def _read_union(members: tuple, data: Any, where: str) -> Any:
    if data is None:
        _expect(type(None) in members, "a value", data, where)
        return None
    others = [m for m in members if m is not type(None)]
    if len(others) == 1:  # an optional value: its own reading says what is wrong
        return _read(others[0], data, where)
    for member in others:
        if dataclasses.is_dataclass(member):
            if isinstance(data, dict) and all(f.name in data for f in dataclasses.fields(member)
                                              if not _has_default(f)):
                return _read_dataclass(member, data, where)
            continue
        try:
            return _read(member, data, where)
        except SchemaError:
            continue
    raise SchemaError(f"{where}: {_shown(data)} is none of {' | '.join(_name(m) for m in members)}")


def _read_scalar(tp: Any, data: Any, where: str) -> Any:
    if tp is float:
        _expect(isinstance(data, (int, float)) and not isinstance(data, bool), "a number", data, where)
    elif tp is int:
        _expect(isinstance(data, int) and not isinstance(data, bool), "an integer", data, where)
    elif tp in (str, bool):
        _expect(isinstance(data, tp), "a string" if tp is str else "true or false", data, where)
    elif tp is type(None):
        _expect(data is None, "null", data, where)
    else:
        raise TypeError(f"{where}: no JSON reading of {tp!r}")
    return data


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _expect(ok: bool, what: str, data: Any, where: str) -> None:
    if not ok:
        raise SchemaError(f"{where}: expected {what}, got {_shown(data)}")


def _shown(data: Any) -> str:
    text = json.dumps(data) if not isinstance(data, (dict, list)) else type(data).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


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
