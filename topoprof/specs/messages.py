"""The messages that cross the process boundary between the launcher and a rank worker, and the one
codec that writes and reads them.

Each message is a frozen dataclass with a `KIND` (its `type` on the wire) and a `VERSION`: a job
the launcher hands a worker (`UserModelJob`, `OpTraceJob`, `ProfileJob`), a result a worker sends
back (`UserModelResult`, `OpTraceResult`, `OpTracesResult`, `DeviceProfileResult`,
`ProfileProgress`), or the worker's failure (`WorkerFailure`: the stage that failed and why, typed,
never a bare string). `encode` gives the JSON-able dict written to the rank's job file or result
pipe; `decode` reads one back and refuses a type it does not know, a version other than its own, or
fields that do not match, naming both sides: the launcher and its ranks may come from different
installs. Both the CLI side (topoprof.measure) and the rank side (topoprof.probes, topoprof.trace)
import this module, so it sits below both and imports nothing of torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

# Keys a message carries beside its fields: its kind, its version, and the phase a rank adds when
# it runs several workers in one launch (topoprof.probes.ranks.rank_main._PhaseContext).
ENVELOPE = ("type", "version", "phase")


class MessageError(ValueError):
    """A message this topoprof cannot read: unknown type, other version, or fields that differ."""


class Message:
    """The base of every message: its kind and version, set by each class."""

    KIND: ClassVar[str]
    VERSION: ClassVar[int]
    # every message class is a dataclass: this says so to the type checker (dataclasses.fields)
    __dataclass_fields__: ClassVar[dict[str, Any]]


M = TypeVar("M", bound=type[Message])

_REGISTRY: dict[str, type[Message]] = {}


def message(cls: M) -> M:
    """Register a message class with the codec under its KIND (one class a kind)."""
    if cls.KIND in _REGISTRY:
        raise TypeError(f"message kind {cls.KIND!r} is registered twice ({_REGISTRY[cls.KIND].__name__}, "
                        f"{cls.__name__})")
    _REGISTRY[cls.KIND] = cls
    return cls


def registered() -> dict[str, type[Message]]:
    """Every message class by its kind."""
    return dict(_REGISTRY)


def encode(msg: Message) -> dict:
    """The message as a JSON-able dict: its type and version, then its fields (shallow: a field
    holding a dict or list is written as it is)."""
    fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    return {"type": msg.KIND, "version": msg.VERSION, **fields}


def decode(wire: dict) -> Message:
    """The message a dict from `encode` holds; MessageError when it cannot be read here."""
    cls = _class_of(wire)
    body = {key: value for key, value in wire.items() if key not in ENVELOPE}
    _check_fields(cls, body)
    return cls(**body)


def kind_of(wire: dict) -> object:
    """The type a message on the wire says it is (None without one)."""
    return wire.get("type")


def _class_of(wire: dict) -> type[Message]:
    kind, version = kind_of(wire), wire.get("version")
    cls = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown message type {kind!r} (this topoprof reads {', '.join(sorted(_REGISTRY))})")
    if version != cls.VERSION:
        raise MessageError(f"message {kind!r} is version {version!r}; this topoprof reads version {cls.VERSION}")
    return cls


def _check_fields(cls: type[Message], body: dict) -> None:
    fields = dataclasses.fields(cls)
    required = {f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown, missing = sorted(body.keys() - {f.name for f in fields}), sorted(required - body.keys())
    if unknown or missing:
        raise MessageError(f"message {cls.KIND!r} (version {cls.VERSION}) does not match this topoprof's: "
                           f"unknown fields {unknown}, missing fields {missing}")


# Jobs: what the launcher hands a worker (topoprof.measure.launch.JobSpec.config).

@message
@dataclass(frozen=True)
class UserModelJob(Message):
    """Time the user's `module:callable` model (probes/ranks/model_timing.py); with `trace` (the
    stated shape) also trace it on meta for `target`; `ac`, `unit`: its blocks checkpointed so."""

    KIND: ClassVar[str] = "user_model_job"
    VERSION: ClassVar[int] = 1

    spec: str
    device: str = "cpu"
    repeats: int = 3
    cwd: str = ""
    precision: str = "bf16"
    optimizer: str = "adamw"
    kwargs: dict | None = None
    trace: dict | None = None
    target: dict | None = None
    ac: str | None = None
    unit: str | None = None


@message
@dataclass(frozen=True)
class OpTraceJob(Message):
    """Trace a model on the meta device (topoprof/trace/op_trace.py): once, with `stated` and
    `kwargs`, or once per entry of `variants`; `blocks`, `ac`: which blocks are checkpointed how."""

    KIND: ClassVar[str] = "op_trace_job"
    VERSION: ClassVar[int] = 1

    spec: str
    kwargs: dict | None = None
    stated: dict | None = None
    target: dict | None = None
    cwd: str = ""
    ac: str | None = None
    blocks: str | None = None
    variants: list[dict] | None = None
    resize_from: int | None = None


@message
@dataclass(frozen=True)
class ProfileJob(Message):
    """Measure the device profile (probes/device_profile/profile_worker.py) of `device` (None:
    the default one), the quick way or in full, within `budget_s`."""

    KIND: ClassVar[str] = "profile_job"
    VERSION: ClassVar[int] = 1

    device: str | None = None
    quick: bool = False
    budget_s: float | None = None


# Results: what a worker sends back.

@message
@dataclass(frozen=True)
class UserModelResult(Message):
    """The user's model as timed and read (its parameters, times, memory; `op_trace` when asked)."""

    KIND: ClassVar[str] = "user_model"
    VERSION: ClassVar[int] = 1

    record: dict


@message
@dataclass(frozen=True)
class OpTraceResult(Message):
    """One pass on meta; a model that cannot be traced gives a trace with its `failure`, which
    the model reads beside what was found (its parameters)."""

    KIND: ClassVar[str] = "op_trace"
    VERSION: ClassVar[int] = 1

    trace: dict


@message
@dataclass(frozen=True)
class OpTracesResult(Message):
    """The passes of an OpTraceJob's variants, in their order."""

    KIND: ClassVar[str] = "op_traces"
    VERSION: ClassVar[int] = 1

    traces: list[dict]


@message
@dataclass(frozen=True)
class DeviceProfileResult(Message):
    """The measured device profile document (topoprof.specs.profile_schema)."""

    KIND: ClassVar[str] = "profile"
    VERSION: ClassVar[int] = 1

    profile: dict


@message
@dataclass(frozen=True)
class ProfileProgress(Message):
    """One section's progress line while the device profile is measured."""

    KIND: ClassVar[str] = "profile_progress"
    VERSION: ClassVar[int] = 1

    line: str


@message
@dataclass(frozen=True)
class WorkerFailure(Message):
    """A worker that could not do its job, and said why: the `stage` that failed (a user model's
    import, build or step; the device profile's device), the one-line `reason`, and the traceback
    when there is one to show."""

    KIND: ClassVar[str] = "worker_failure"
    VERSION: ClassVar[int] = 1

    stage: str
    reason: str
    trace: str = ""
