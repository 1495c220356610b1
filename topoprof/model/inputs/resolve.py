"""The model's inputs (`ModelInputs`) from the request and what was gathered for it
(`evidence.Evidence`, filled by `gather.gather`): the workload from a parameter count, a preset
or the user's model; the links (`link_choice`); compute from a measurement, a calibration, a GPU
name or the model's own ops priced. Pure: it runs no process, reads no file and no hardware, and imports no torch."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from topoprof.errors import InputError
from topoprof.model.compute.measured import MeasuredCompute
from topoprof.model.compute.modelled import ModelledCompute
from topoprof.model.compute.timing import Compute
from topoprof.model.compute.traced import fallback_note, priced
from topoprof.model.inputs.evidence import Evidence, UserModelRun, what_if_priced
from topoprof.model.inputs.link_choice import job_cluster
from topoprof.model.inputs.request import ComputeRequest, MemoryRequest, WorkloadRequest
from topoprof.model.inputs.user_record import UserModelRead
from topoprof.model.memory.traced import TracedMemory
from topoprof.model.strategies.job import ModelInputs, Workload
from topoprof.specs.messages import TraceFailure, UserModelRecord
from topoprof.specs.traced_pass import TracedPass


def resolve(evidence: Evidence) -> tuple[ModelInputs, dict]:
    """(ModelInputs, what was described of the links and the sources) for the gathered request."""
    request = evidence.request
    done = _workload_and_compute(evidence)
    resolved = _compute(done.compute, done.memory, evidence.calibration, done.modelled)
    if done.origins:
        resolved = replace(resolved, origins=tuple(done.origins))
    workload, notes = done.workload, done.notes
    if workload.fsdp_unit is not None and isinstance(workload.fsdp, str):
        raise InputError(workload.fsdp)  # a unit that wraps nothing is a bad option, not a silent n/a
    if request.workload.rmsnorm != "eager":
        notes = [f"{request.workload.preset_name} with its RMSNorm {request.workload.rmsnorm}: each norm keeps its "
                 "input and the reciprocal RMS for backward, not its fp32 upcast (topoprof/zoo/llama.py)", *notes]
    cluster, described = job_cluster(evidence.links, request.cluster, request.compute.named, notes)
    return ModelInputs(workload, resolved, cluster, accumulation_steps=request.accum), described


def _workload_options(w: WorkloadRequest, memory: MemoryRequest) -> dict:
    return dict(grad_bytes=w.grad_bytes, micro_batch_size=w.micro_batch_size, tokens_per_micro_batch=w.tokens,
                bucket_cap_mb=w.bucket_cap_mb, activation_memory_gb=memory.activation_memory_gb,
                fsdp_param_bytes=w.fsdp_param_bytes, fsdp_reduce_bytes=w.fsdp_reduce_bytes, fsdp_unit=w.fsdp_unit,
                checkpointing=w.checkpointing)


@dataclass
class _Completed:
    """The workload, and the compute and memory requests completed with what was measured here or
    priced from the model's ops: where each measured value came from (`origins`), the notes for
    the user, and the compute priced from the model's ops (`modelled`, from the pass `to_price`
    where one is wanted: as the GPU's compute, or `beside` a time measured here)."""

    workload: Workload
    compute: ComputeRequest
    memory: MemoryRequest
    origins: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    to_price: PassToPrice | None = None
    beside: bool = False
    modelled: ModelledCompute | None = None


@dataclass(frozen=True)
class PassToPrice:
    """The pass a model's compute is priced from (`trace`; None: none was run), or why there is
    none (`why`), and how its stated shape was fitted to the model (`note`)."""

    trace: TracedPass | TraceFailure | None = None
    note: str | None = None
    why: str | None = None


def _workload_and_compute(evidence: Evidence) -> _Completed:
    work_kw = _workload_options(evidence.request.workload, evidence.request.memory)
    if evidence.user is not None:
        done = _user_model(evidence, evidence.user, work_kw)
    else:
        done = _preset_or_params(evidence, work_kw)
    if done.to_price is not None:
        _price(done, evidence)
    if done.compute.compiled and done.modelled is None:
        done.notes.append("--compiled applies to compute modelled from the model's ops; here the compute is "
                          "measured or given, as it ran")
    done.workload, note = _with_traced_memory(done.workload, evidence.traced_memory, user=evidence.user is not None)
    done.notes += [note] if note else []
    return done


def _user_model(evidence: Evidence, user: UserModelRun, work_kw: dict) -> _Completed:
    """`_workload_and_compute` for a user's model, timed here or traced on meta only."""
    w, compute, memory = evidence.request.workload, evidence.compute, evidence.request.memory
    record, read = user.record, user.read
    origins: list = []
    notes: list[str] = [user.order.note] if user.order.note else []
    if not w.micro_batch_stated:
        notes.append(read.micro_batch_note)
        if read.samples is not None:
            work_kw = {**work_kw, "micro_batch_source": "the samples its example batch holds"}
    stands = user.timed and user.timing_stands
    workload = Workload(read.layout, **{**work_kw, "fsdp_unit": w.fsdp_unit or read.block_list},
                        measured_memory=record.memory if stands else None)
    if w.fsdp_unit is None and isinstance(workload.fsdp, str):  # a frozen block list: FSDP shards what is trained
        workload = replace(workload, fsdp_unit=None)
    if record.checkpointing:
        notes.append(record.checkpointing.describe())
    # the GPU predicted prices the model's own ops, unless it was timed on that GPU; timed here on
    # a GPU, they are priced beside the measured time
    what_if = what_if_priced(compute) and not (compute.gpu is not None and user.timing_stands)
    beside = not what_if and user.timed and record.device.startswith("cuda")
    if stands:
        if not what_if:
            compute, origins = _measured(compute, _timing(read))
    elif user.timed:  # --time-here on a what-if: shown, never as the GPU predicted's compute
        notes.append(_timed_elsewhere_note(_timing(read), record, compute.gpu))
    memory = _memory_of_the_timed_gpu(memory, compute, read.measured, origins)
    return _Completed(workload, compute, memory, origins, notes,
                      PassToPrice(record.op_trace) if what_if or beside else None, beside)


def _price(done: _Completed, evidence: Evidence) -> None:
    """The compute priced from the model's own ops (`done.to_price`), or, where they cannot be, why
    in a note: as the GPU's compute, the datasheet's range stands in; beside a measured time, the
    time stands alone."""
    to_price = done.to_price
    assert to_price is not None  # wanted
    why = to_price.why
    if why is None:
        done.modelled, why = priced(to_price.trace, evidence.pricing, to_price.note)
    if why is None:
        return
    if done.beside:
        done.notes.append(f"compute: the model's own ops could not be priced beside the measured time ({why})")
        return
    w, compute = evidence.request.workload, done.compute
    # a user's model's datasheet range prices tokens: a text model's what-if without them cannot stand in
    if evidence.user is not None and w.tokens is None and not compute.given and compute.utilization is None:
        raise InputError(f"--model {w.user_model}: its own ops could not be priced ({why}), and the datasheet range "
                         "that stands in needs --tokens N (tokens per GPU per micro-batch); or give --micro-batch-time")
    done.notes.append(fallback_note(why))


def _timing(read: UserModelRead) -> MeasuredCompute:
    """The timing of a model timed here (its record has one)."""
    assert read.measured is not None
    return read.measured


def _preset_or_params(evidence: Evidence, work_kw: dict) -> _Completed:
    """`_workload_and_compute` for a preset (timed on this GPU where it has one) or `--params`."""
    w, compute, memory = evidence.request.workload, evidence.compute, evidence.request.memory
    origins: list = []
    notes: list[str] = []
    timed = evidence.preset_timed
    if timed is not None:
        compute, origins = _measured(compute, timed)
        memory = _memory_of_the_timed_gpu(memory, compute, timed, origins)
        if timed.memory:  # timed whole on this GPU: its memory too
            work_kw = {**work_kw, "measured_memory": timed.memory}
    layout = w.layout
    assert layout is not None  # a preset or --params: the request names one of them, or a --model
    workload = Workload(layout, **work_kw)
    main = evidence.main_trace
    to_price = PassToPrice(main.trace, main.note, main.why) if main is not None else None
    return _Completed(workload, compute, memory, origins, notes, to_price,
                      beside=timed is not None and timed.device_name is not None)


def _with_traced_memory(workload: Workload, traced: TracedMemory | str | None, user: bool):
    """(`workload` with the memory its passes counted, a note or None): a user's model keeps why
    its passes failed for the search to say; a preset's failure is a note, and its main pass
    alone counts it."""
    if traced is None:
        return workload, None
    if isinstance(traced, TracedMemory):
        return replace(workload, traced_memory=traced), None
    if user:
        return replace(workload, traced_memory_failure=traced), None
    return workload, f"memory: the passes at 1 and 2 blocks failed ({traced}); counted from the main pass only"


def _timed_elsewhere_note(measured: MeasuredCompute, record: UserModelRecord, gpu: str | None) -> str:
    return (f"timed here (--time-here): {measured.micro_batch_time_s * 1e3:,.1f} ms per micro-batch on "
            f"{record.device_name or record.device}, this machine, not the {gpu} predicted: not used")


def _measured(compute: ComputeRequest, measured: MeasuredCompute) -> tuple[ComputeRequest, list]:
    """The compute request completed with measured values where the user gave none, and where
    each came from."""
    origins, filled = [], {}
    for key in ("micro_batch_time_s", "backward_fraction", "optimizer_time_s"):
        if getattr(compute, key) is None and not compute.calibration:
            filled[key] = getattr(measured, key)
            origins.append((key, measured.source))
    return replace(compute, **filled), origins


def _memory_of_the_timed_gpu(memory: MemoryRequest, compute: ComputeRequest, timed: MeasuredCompute | None,
                             origins: list) -> MemoryRequest:
    """The GPU the compute was timed on, when no other is named: its memory (as CUDA saw it in the
    worker that timed it) is what the strategies must fit in, unless --gpu-memory says otherwise."""
    if timed is None or not timed.device_memory_bytes or memory.gpu_memory_gb is not None or compute.gpu is not None:
        return memory
    origins.append(("gpu_memory_gb", f"{timed.device_name or 'the GPU'}'s memory as CUDA reported it "
                                     "where the compute was timed"))
    return replace(memory, gpu_memory_gb=timed.device_memory_bytes / 1e9)


def _compute(compute: ComputeRequest, memory: MemoryRequest, calibration: dict | None,
             modelled: ModelledCompute | None = None) -> Compute:
    common: dict[str, Any] = dict(
        gpu=compute.gpu, precision=compute.precision, utilization=compute.utilization,
        gpu_memory_gb=memory.gpu_memory_gb, optimizer=compute.optimizer, optimizer_time_s=compute.optimizer_time_s,
        backward_fraction=compute.backward_fraction, modelled=modelled)
    if calibration is not None:
        return Compute.from_calibration(calibration, **{k: v for k, v in common.items()
                                                        if v is not None and k not in calibration})
    if compute.micro_batch_time_s is None and compute.gpu is None and modelled is None:
        raise InputError("compute per micro-batch is unknown: give --micro-batch-time SECONDS (measured), "
                         "--calibration FILE (from `topoprof validate`), or --gpu NAME with --tokens N")
    return Compute(micro_batch_time_s=compute.micro_batch_time_s, **common)


