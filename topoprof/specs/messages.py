"""The messages that cross the process boundary between the launcher and a rank worker, and the one
codec that writes and reads them.

Each message is a frozen dataclass with a `KIND` (its `type` on the wire) and a `VERSION`: a job
the launcher hands a worker (`UserModelJob`, `OpTraceJob`, `ProfileJob`, `CollectivesJob`,
`TrainingJob` and its `ValidationJob` and `NumericsJob`, `NodesJob`, `PhasesJob` of `phase`s,
`SleepJob`), what a worker sends back (`Progress`, `PhaseStarted`; `UserModelResult`,
`OpTraceResult`, `OpTracesResult` or a `TraceFailure`, `DeviceProfileResult`, `ProfileProgress`; the collectives'
`CollectivesMeta`, `CollectiveRow`, `CollectiveStopped`; `TrainingCalibration`, `TrainingResult`,
`NumericsResult`, `ValidationRotations`, `NodesResult`, `SleepStep`), or the worker's failure
(`WorkerFailure`: the stage that failed and why, typed, never a bare string). `encode` gives the
JSON-able dict written to the rank's job file or result pipe; `decode` reads one back and refuses a
type it does not know, a version other than its own, or fields that do not match, naming both
sides: the launcher and its ranks may come from different installs. Both the CLI side
(topoprof.measure) and the rank side (topoprof.probes, topoprof.trace) import this module, so it
sits below both and imports nothing of torch.
"""
from __future__ import annotations

import dataclasses
import operator
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypeVar

from topoprof.specs.traced_pass import ParamEntry, TracedPass, TraceTarget, WrappedBlocks

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
    """The message as a JSON-able dict: its type and version, then its fields. A record (a
    dataclass that is no message) is written as its fields, a message inside one encoded, each
    wherever it sits in a list; a dict is written as it is."""
    return {"type": msg.KIND, "version": msg.VERSION, **_fields_written(msg)}


def _fields_written(record: Any) -> dict:
    """A record's fields, a record or a list holding records among them written as such (by what
    they hold, not what they are declared: writing reads no type hints); the rest as they are."""
    plan = _plan(type(record))
    return {name: _write(value) if isinstance(value, list) or _is_dataclass(value) else value
            for name, value in zip(plan.names, plan.values(record))}


def _write(value: Any) -> Any:
    if isinstance(value, list):
        return [_write(v) for v in value] if any(map(_is_dataclass, value)) else value
    if isinstance(value, Message):
        return encode(value)
    return _fields_written(value) if _is_dataclass(value) else value


def _is_dataclass(value: object) -> bool:
    return hasattr(type(value), "__dataclass_fields__")


def decode(wire: dict) -> Message:
    """The message a dict from `encode` holds; MessageError when it cannot be read here."""
    cls = _class_of(wire)
    body = {key: value for key, value in wire.items() if key not in ENVELOPE}
    return _read_record(cls, body, f"message {cls.KIND!r} (version {cls.VERSION})")


Reader = Callable[[Any, str], Any]


@dataclass(frozen=True)
class _Plan:
    """How a record class is written and read: its fields in order and those it requires (read
    once a class)."""

    names: tuple[str, ...]
    name_set: frozenset[str]
    required: frozenset[str]
    values: Callable[[Any], tuple]      # a record's field values, in `names`' order


_PLANS: dict[type, _Plan] = {}
_READERS: dict[type, dict[str, Reader]] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        fields = dataclasses.fields(cls)
        names = tuple(f.name for f in fields)
        plan = _PLANS[cls] = _Plan(names, frozenset(names), frozenset(
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING),
            _getter(names))
    return plan


def _readers(cls: type) -> dict[str, Reader]:
    """A reader for each field of a record class declared a record, a message or a list of them
    (from its type hints, read once a class)."""
    readers = _READERS.get(cls)
    if readers is None:
        hints = typing.get_type_hints(cls)
        readers = _READERS[cls] = {f.name: reader for f in dataclasses.fields(cls)
                                   if (reader := _reader(hints[f.name])) is not None}
    return readers


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    """A record's values of `names`, as a tuple (attrgetter's, which gives one name's value bare)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    return lambda record: tuple(getattr(record, name) for name in names)


def _read_record(cls: type, body: dict, what: str) -> Any:
    """A record of `cls` (a message's body, or a record inside one) from its fields as written."""
    plan = _plan(cls)
    if body.keys() != plan.name_set:  # some field left at its default, or not ours
        unknown, missing = sorted(body.keys() - plan.name_set), sorted(plan.required - body.keys())
        if unknown or missing:
            raise MessageError(f"{what} does not match this topoprof's: unknown fields {unknown}, "
                               f"missing fields {missing}")
    readers = _readers(cls)
    if not readers:
        return cls(**body)
    return cls(**{name: readers[name](value, f"{what}'s {name}") if name in readers and value is not None else value
                  for name, value in body.items()})


def _reader(hint: Any) -> Reader | None:
    """How a field declared `hint` is read: a record (or a message) where it is declared one,
    alone or with None, and lists of them; None where it is read as written."""
    record, message_too = _record_in(hint), _message_in(hint)
    if record is not None or message_too:
        def one(value: Any, what: str) -> Any:
            if not isinstance(value, dict):
                return value
            if message_too and kind_of(value) is not None and (record is None or "type" not in _plan(record).name_set):
                return decode(value)
            return value if record is None else _read_record(record, value, what)
        return one
    item = _list_item(hint)
    each = _reader(item) if item is not None else None
    if each is None:
        return None
    return lambda value, what: [each(v, what) for v in value] if isinstance(value, list) else value


def _members(hint: Any) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _record_in(hint: Any) -> type | None:
    """The record class a field is declared as (alone, or beside None or a message), else None."""
    records = [m for m in _members(hint) if isinstance(m, type) and dataclasses.is_dataclass(m)
               and not issubclass(m, Message)]
    return records[0] if len(records) == 1 else None


def _message_in(hint: Any) -> bool:
    return any(isinstance(m, type) and issubclass(m, Message) for m in _members(hint))


def _list_item(hint: Any) -> Any:
    """What a list field holds, where it is declared `list[X]` (alone, or with None)."""
    for m in _members(hint):
        if typing.get_origin(m) is list and typing.get_args(m):
            return typing.get_args(m)[0]
    return None


def fields_of(msg: Any) -> dict:
    """A message's (or a record's) fields by name, in their order, without its type and version (shallow)."""
    return {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}


def kind_of(wire: dict) -> object:
    """The type a message on the wire says it is (None without one)."""
    return wire.get("type")


def phase_of(wire: dict) -> str | None:
    """The phase a message on the wire belongs to (None outside a run of phases)."""
    return wire.get("phase")


def phase(name: str, worker: str, job: Message) -> dict:
    """One phase of a PhasesJob: the worker that runs it and its typed job, encoded."""
    return {"name": name, "worker": worker, "config": encode(job)}


def _class_of(wire: dict) -> type[Message]:
    kind, version = kind_of(wire), wire.get("version")
    cls = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MessageError(f"unknown message type {kind!r} (this topoprof reads {', '.join(sorted(_REGISTRY))})")
    if version != cls.VERSION:
        raise MessageError(f"message {kind!r} is version {version!r}; this topoprof reads version {cls.VERSION}")
    return cls


# Jobs: what the launcher hands a worker (topoprof.measure.launch.JobSpec.config).

@message
@dataclass(frozen=True)
class UserModelJob(Message):
    """Time the user's `module:callable` model (probes/ranks/model_timing.py) at `stated` (the
    shape stated, as its pass on meta is built at it; None: as its callable builds it); with
    `trace` (the stated shape) also trace it on meta for `target`; `ac`, `unit`: its blocks
    checkpointed so."""

    KIND: ClassVar[str] = "user_model_job"
    VERSION: ClassVar[int] = 3  # 3: its target a TraceTarget

    spec: str
    device: str = "cpu"
    repeats: int = 3
    cwd: str = ""
    precision: str = "bf16"
    optimizer: str = "adamw"
    kwargs: dict | None = None
    trace: dict | None = None
    target: TraceTarget | None = None
    ac: str | None = None
    unit: str | None = None
    stated: dict | None = None


@dataclass(frozen=True)
class TraceVariant:
    """One of the passes an `OpTraceJob` asks of its model: `kwargs` over the job's, the shape
    `stated`, and its `target` and checkpointing (`ac`) where they are not the job's; `depth`: its
    first blocks kept (None: all); `whole`: the whole trace kept, as the job's single pass keeps it."""

    kwargs: dict = field(default_factory=dict)
    stated: dict | None = None
    target: TraceTarget | None = None
    ac: str | None = None
    depth: int | None = None
    whole: bool = False


@message
@dataclass(frozen=True)
class OpTraceJob(Message):
    """Trace a model on the meta device (topoprof/trace/op_trace.py): once, with `stated` and
    `kwargs`, or once per entry of `variants`; `blocks`, `ac`: which blocks are checkpointed how."""

    KIND: ClassVar[str] = "op_trace_job"
    VERSION: ClassVar[int] = 4  # 2: a variant may ask for the whole trace; 3: no resize_from (the batch's own
    # samples); 4: its target a TraceTarget, its variants TraceVariants

    spec: str
    kwargs: dict | None = None
    stated: dict | None = None
    target: TraceTarget | None = None
    cwd: str = ""
    ac: str | None = None
    blocks: str | None = None
    variants: list[TraceVariant] | None = None


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


@message
@dataclass(frozen=True)
class CollectivesJob(Message):
    """Sweep `collectives` over `sizes` (probes/ranks/collective_timing.py), at each of `levels`;
    `corrupt_rank`: a test hook, the rank whose checked result is flipped."""

    KIND: ClassVar[str] = "collectives_job"
    VERSION: ClassVar[int] = 1

    collectives: list[str]
    sizes: list[int]
    iters: int
    warmup: int
    dtype: str
    combine: str
    check: bool = True
    corrupt_rank: int | None = None
    levels: list[str] = field(default_factory=lambda: ["job"])


@message
@dataclass(frozen=True)
class TrainingJob(Message):
    """Train the synthetic model (or `user_model`) in `mode` and time its steps
    (probes/ranks/training.py); topoprof.workload.synthetic.parse_config checks the fields, and
    each default here is the one it takes for a missing key."""

    KIND: ClassVar[str] = "training_job"
    VERSION: ClassVar[int] = 1

    spec: dict
    mode: str
    micro_batch: int
    steps: int
    warmup_steps: int
    accum: int = 1
    bucket_cap_mb: float | None = None
    seed: int = 0
    optimizer: str = "adamw"
    lr: float | None = None
    amp: str = "none"
    threads: int | None = None
    count_comm_hook_calls: bool = False
    numerics_dtype: str = "float64"
    ac: str | None = None
    user_model: str | None = None


def training_config(job: TrainingJob) -> dict:
    """A training job's fields as topoprof.workload.synthetic.parse_config reads them."""
    return {f.name: getattr(job, f.name) for f in dataclasses.fields(TrainingJob)}


@message
@dataclass(frozen=True)
class ValidationJob(TrainingJob):
    """Rotations of calibration and timed steps (probes/ranks/validation.py): a training job, plus
    the DDP and FSDP `modes` to time (None: every DDP mode) and whether to measure `interference`."""

    KIND: ClassVar[str] = "validation_job"
    VERSION: ClassVar[int] = 1

    modes: list[str] | None = None
    interference: bool = True


@message
@dataclass(frozen=True)
class NumericsJob(TrainingJob):
    """The numerics check (probes/ranks/numerics.py): a training job, plus the FSDP modes whose
    step is compared with the single-process reference too."""

    KIND: ClassVar[str] = "numerics_job"
    VERSION: ClassVar[int] = 1

    fsdp_modes: list[str] | None = None


@message
@dataclass(frozen=True)
class NodesJob(Message):
    """Every node probes its own topology (probes/ranks/nodes.py)."""

    KIND: ClassVar[str] = "nodes_job"
    VERSION: ClassVar[int] = 1


@message
@dataclass(frozen=True)
class PhasesJob(Message):
    """Several workers one after the other in one launch (probes/ranks/rank_main._phases_worker);
    each phase is written by `phase`."""

    KIND: ClassVar[str] = "phases_job"
    VERSION: ClassVar[int] = 1

    phases: list[dict]


@message
@dataclass(frozen=True)
class SleepJob(Message):
    """The launcher's test worker: `steps` steps of `sleep_s`; on `fail_rank` at `fail_step` it
    fails `how` ("raise", "exit" or "hang")."""

    KIND: ClassVar[str] = "sleep_job"
    VERSION: ClassVar[int] = 1

    steps: int = 3
    sleep_s: float = 0.05
    fail_rank: int | None = None
    fail_step: int = 1
    how: str = "raise"


# Results: what a worker sends back.

@dataclass(frozen=True)
class TimedPass:
    """One timed forward and backward, in seconds; `ready`: [parameter index, share of the backward
    done] as each gradient was ready, where the pass hooked them."""

    forward_s: float
    backward_s: float
    ready: list = field(default_factory=list)


@dataclass(frozen=True)
class StepMemory:
    """One GPU's memory over a timed step, bytes (torch.cuda.memory_allocated before and after each
    phase): the weights, the optimizer's state, what the forward added, what the backward left (the
    gradients), and the step's peak (torch.cuda.max_memory_allocated)."""

    device: str
    params_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    grads_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class UserModelRecord:
    """A user's model (or a preset's module) as read: timed by the `user_model` worker
    (probes/ranks/model_timing.py) on `device`, or, for a what-if, only traced (`device` "meta":
    its parameters and its pass, nothing timed)."""

    spec: str
    device: str                         # "cpu", "cuda:N", or "meta" where it was only traced
    params: list[ParamEntry]
    device_name: str | None = None      # the timed GPU's name, as CUDA gives it
    device_memory_bytes: int | None = None
    samples: int | None = None          # its example batch's (None: its tensors share no first dimension)
    block_list: str | None = None       # the module whose children are its repeated blocks
    ready: list | None = None           # [[param_index, share of backward done], ...] as its gradients were ready
    passes: list[TimedPass] | None = None
    optimizer_s: list | None = None     # each timed optimizer step, seconds
    optimizer: str | None = None
    precision: str | None = None
    memory: StepMemory | None = None    # what its timed step held on a GPU, part by part
    checkpointing: WrappedBlocks | None = None  # its blocks as checkpointed, where they were
    # its pass on meta, where one was asked for: the trace, or why it could not be had
    op_trace: TracedPass | TraceFailure | None = None

    @property
    def timed(self) -> bool:
        return self.passes is not None


@message
@dataclass(frozen=True)
class UserModelResult(Message):
    """The user's model as timed and read (its parameters, times, memory; `op_trace` when asked)."""

    KIND: ClassVar[str] = "user_model"
    VERSION: ClassVar[int] = 5  # 3: its pass on meta is a TracedPass; 4: its timed passes and memory typed; 5: the
    # pass's target a TraceTarget, the parameters ParamEntries, its checkpointed blocks WrappedBlocks

    record: UserModelRecord


@message
@dataclass(frozen=True)
class OpTraceResult(Message):
    """One pass on meta; a model that cannot be traced sends its `TraceFailure` instead."""

    KIND: ClassVar[str] = "op_trace"
    VERSION: ClassVar[int] = 3  # 2: a TracedPass; 3: its target, parameters and checkpointed blocks typed

    trace: TracedPass


@message
@dataclass(frozen=True)
class OpTracesResult(Message):
    """The passes of an OpTraceJob's variants, in their order: each a trace, or its `TraceFailure`."""

    KIND: ClassVar[str] = "op_traces"
    VERSION: ClassVar[int] = 3  # 2: TracedPasses; 3: their targets, parameters and checkpointed blocks typed

    traces: list[TracedPass | TraceFailure]


# What is wrong with a user's callable itself (topoprof/zoo/user_callable.py's stages), or with it
# under the checkpointing asked (topoprof/zoo/user_blocks.py): the user's to fix, whichever device
# it is read on.
USER_ERRORS = ("import", "callable", "return", "loss", "blocks", "checkpointing")


@message
@dataclass(frozen=True)
class TraceFailure(Message):
    """A pass on meta that could not be had, and why: `stage` one of USER_ERRORS (the callable is
    the user's to fix, with its `traceback`), "batch" (its example batch cannot be resized),
    "cut" (it cannot be cut to its first blocks), "pass" (the pass itself failed; `params`: its
    parameters where it was built) or "worker" (the trace worker gave nothing)."""

    KIND: ClassVar[str] = "trace_failure"
    VERSION: ClassVar[int] = 2  # 2: its parameters ParamEntries

    reason: str
    stage: str = "pass"
    traceback: str = ""
    params: list[ParamEntry] | None = None

    @property
    def users_to_fix(self) -> bool:
        return self.stage in USER_ERRORS


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


@message
@dataclass(frozen=True)
class Progress(Message):
    """The step a rank is at: the launcher shows it and names it when the rank stalls."""

    KIND: ClassVar[str] = "progress"
    VERSION: ClassVar[int] = 1

    step: str


@message
@dataclass(frozen=True)
class RankDone(Message):
    """The rank ran its worker to the end, and every rank had (probes/ranks/rank_main.py)."""

    KIND: ClassVar[str] = "done"
    VERSION: ClassVar[int] = 1


@message
@dataclass(frozen=True)
class RankError(Message):
    """The rank's worker raised: the first line of the error, before the rank exits non-zero (the
    launcher blames it, and stops its peers)."""

    KIND: ClassVar[str] = "error"
    VERSION: ClassVar[int] = 1

    message: str


@message
@dataclass(frozen=True)
class PhaseStarted(Message):
    """A PhasesJob's phase has begun on this rank."""

    KIND: ClassVar[str] = "phase"
    VERSION: ClassVar[int] = 1

    name: str


@message
@dataclass(frozen=True)
class CollectivesMeta(Message):
    """Who the collectives ran on: every rank's host, node and device, and the versions."""

    KIND: ClassVar[str] = "meta"
    VERSION: ClassVar[int] = 1

    ranks: list[dict]
    torch_version: str
    nccl_version: str | None
    cuda_version: str | None
    backend: str


@message
@dataclass(frozen=True)
class CollectiveRow(Message):
    """One measured size of one collective (topoprof.specs.collective_spec.BenchRow, as a dict)."""

    KIND: ClassVar[str] = "row"
    VERSION: ClassVar[int] = 1

    row: dict


@message
@dataclass(frozen=True)
class CollectiveStopped(Message):
    """A collective's sweep that stopped at a level before its last size, and why."""

    KIND: ClassVar[str] = "stopped"
    VERSION: ClassVar[int] = 1

    collective: str
    level: str
    reason: str


@message
@dataclass(frozen=True)
class TrainingCalibration(Message):
    """The single mode's calibration: `calibration` holds the measured times (their keys depend
    on what was measured), beside the setup they were measured with."""

    KIND: ClassVar[str] = "calibration"
    VERSION: ClassVar[int] = 1

    calibration: dict
    micro_batch: int
    accum: int
    params: int
    tokens_per_micro_batch: int


@message
@dataclass(frozen=True)
class TrainingResult(Message):
    """A timed mode's steps (the max over ranks, the median over steps) and its setup; the comm
    hook's calls and DDP's buckets when they were counted."""

    KIND: ClassVar[str] = "result"
    VERSION: ClassVar[int] = 1

    mode: str
    step_time_s: float
    step_times_s: list[float]
    rank_step_times_s: list[list[float]]
    combine: str
    world_size: int
    processes: int
    micro_batch: int
    accum: int
    params: int
    global_batch_samples: int
    tokens_per_micro_batch: int
    spec: dict
    warmup_steps: int
    bucket_cap_mb: float | None
    optimizer: str
    lr: float
    amp: str
    threads: int
    device: str
    comm_hook_calls_per_step: list[int] | None = None
    ddp_bucket_numels: list[int] | None = None


@message
@dataclass(frozen=True)
class NumericsResult(Message):
    """Each mode's final parameters against the single-process reference: `comparisons` by mode
    (and the control that forgets 1/K), beside the tolerance and setup they were checked with."""

    KIND: ClassVar[str] = "numerics"
    VERSION: ClassVar[int] = 1

    comparisons: dict
    dtype: str
    rtol: float
    atol: float
    lr: float
    world_size: int
    accum: int
    micro_batch: int
    params: int
    ac: str

    def report(self) -> dict:
        """The comparisons by mode, then the setup: the numerics as the validate report shows them."""
        return {**self.comparisons, **{k: v for k, v in fields_of(self).items() if k != "comparisons"}}


@message
@dataclass(frozen=True)
class ValidationRotations(Message):
    """Every rank's records, rotation by rotation (`rotations[i][rank]`), the modes they timed,
    and the setup."""

    KIND: ClassVar[str] = "validation"
    VERSION: ClassVar[int] = 1

    rotations: list[list[dict]]
    modes: list[str]
    world_size: int
    micro_batch: int
    accum: int
    params: int
    tokens_per_micro_batch: int
    spec: dict
    threads: int
    device: str
    optimizer: str
    amp: str
    bucket_cap_mb: float | None
    memory_bandwidth_gbps: float | None


@message
@dataclass(frozen=True)
class NodesResult(Message):
    """Every rank's host, node, CPU binding and (the first rank on each node) its topology."""

    KIND: ClassVar[str] = "nodes"
    VERSION: ClassVar[int] = 1

    ranks: list[dict]


@message
@dataclass(frozen=True)
class SleepStep(Message):
    """The test worker's step: which rank, process and install ran it, and where it ran as the rank
    saw it (a rank may be gone before its message is read, and its /proc with it)."""

    KIND: ClassVar[str] = "sleep_step"
    VERSION: ClassVar[int] = 2

    rank: int
    step: int
    pid: int
    probes: str
    parent: int = 0
    session: int = 0
    group: int = 0
    cwd: str = ""
