"""What `topoprof model` reads and runs before it predicts, as typed records (`Evidence`): the
device profile and calibration files, the user's model timed here or traced on meta, a preset
timed on this GPU, the main pass on meta, the passes its memory is counted from, and the links
(a bench fit, a topology file or this machine's). Every process, file and hardware read of the
command is here; `resolve.resolve` reads only these records. The search for the largest
micro-batch that fits is a second round: the memory predicted names its candidates, whose passes
`gather_candidates` runs for `search.fits_priced` to price.

What is gathered depends on what the request leaves open and on what was gathered before it (a
preset timed here needs no what-if pricing); those choices are pure functions of the request and
the earlier records, shared with `resolve` where it makes the same choice.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from topoprof.errors import InputError
from topoprof.jsonio import load_json
from topoprof.measure.runner import visible_gpus
from topoprof.model.comm import links
from topoprof.model.compute.datasheet import NamedGpu, named_gpu
from topoprof.model.compute.measured import MeasuredCompute
from topoprof.model.compute.profile import DeviceProfile, load_profile
from topoprof.model.compute.profile_choice import Pricing, gpu_target, pricing_for, target_for
from topoprof.model.compute.timing import CALIBRATION_KEYS
from topoprof.model.compute.traced import TraceRequest, params_request, preset_request
from topoprof.model.inputs.candidates import (
    CandidatePasses,
    ModelShape,
    UserShape,
    WholePass,
    by_blocks,
    traced_shape,
)
from topoprof.model.inputs.evidence import (
    Evidence,
    LinkEvidence,
    MainTrace,
    UserModelRun,
    what_if_priced,
)
from topoprof.model.inputs.request import ClusterRequest, ComputeRequest, ModelRequest, WorkloadRequest
from topoprof.model.inputs.sampled import SampledPasses
from topoprof.model.inputs.traces import (
    MemoryPasses,
    candidate_passes,
    main_and_memory,
    memory_set,
    trace_for_gpu,
    user_memory_set,
)
from topoprof.model.inputs.user_model import here_device, measure_here, measure_preset, names_this_gpu, trace_only
from topoprof.model.inputs.user_record import (
    ReadyOrder,
    choose_ready_order,
    planned_as_read,
    read_user_model,
    stated_shape,
    timed_on,
    trace_wanted,
)
from topoprof.specs.messages import UserModelRecord
from topoprof.specs.traced_pass import TracedPass, TraceTarget
from topoprof.topology.collect import collect_topology
from topoprof.topology.load import topology_from_file
from topoprof.workload.presets import context_sequences, is_vision

Progress = Callable[[str], None]  # hears what a long stage waits for (`topoprof model` shows it on a terminal)


def gather(request: ModelRequest, progress: Progress | None = None) -> Evidence:
    """The evidence for `request`, in the order the command shows its stages."""
    say = progress or (lambda text: None)
    profile = load_profile(request.compute.gpu_profile) if request.compute.gpu_profile is not None else None
    compute = named_by_profile(request.compute, profile)
    calibration = read_calibration(compute.calibration) if compute.calibration else None
    w = request.workload
    user = timed = None
    if w.user_model:
        user, w = _user_model_here(w, compute, profile, say)
        request = replace(request, workload=w)
    elif w.preset and not compute.given and this_gpu_predicted(compute):
        timed = _preset_on_this_gpu(w, compute, say)
    timed_gpu = _timed_gpu_priced(compute, user.record if user is not None else None)
    # the GPU predicted: named (--gpu, or a --gpu-profile's device), else the one a preset was timed on
    gpu = compute.named or named_gpu(timed.device_name if timed is not None else None)
    pricing = pricing_for(timed_gpu or gpu, compute.precision, compute.compiled, profile, compute.gpu_profile)
    memory_wanted = (gpu is not None and request.memory.activation_memory_gb is None
                     and not _measured_memory_stands(user, compute))
    memory_target = gpu_target(compute.precision, gpu) if memory_wanted else None
    shape = traced_shape(w)
    main, memory = None, None
    if not w.user_model:
        main, memory = _preset_passes(w, compute, profile, gpu, timed, memory_target, shape, say)
    elif memory_target is not None:
        say(f"tracing {w.user_model} at other micro-batch sizes and checkpointing modes on meta")
        assert isinstance(shape, UserShape)  # `traced_shape` of a --model
        memory = user_memory_set(shape, compute.precision, w.fsdp_casts_weights, memory_target, whole_pass(user, w))
    if memory is not None and memory.traced_as is not None:  # a user's model, its alike blocks where found
        shape = memory.traced_as
    return Evidence(request, compute, pricing, profile, calibration, user, timed, main,
                    memory.memory if memory is not None else None, shape,
                    gather_links(request.cluster, say), gpu, memory.sampled if memory is not None else None)


def _timed_gpu_priced(compute: ComputeRequest, record: UserModelRecord | None) -> NamedGpu | None:
    """The GPU the model's ops are priced for where it is not the GPU predicted: a user's model
    (`record`) timed on this machine's GPU, with no GPU named and no what-if priced, is priced
    beside its time for that GPU; else None."""
    if record is None or not (record.timed and record.device.startswith("cuda")) \
            or compute.named is not None or what_if_priced(compute):
        return None
    return named_gpu(record.device_name or "GPU0")


def _preset_passes(w: WorkloadRequest, compute: ComputeRequest, profile: DeviceProfile | None, gpu: NamedGpu | None,
                   timed: MeasuredCompute | None, memory_target: TraceTarget | None,
                   shape: ModelShape | UserShape | str, say: Progress) -> tuple[MainTrace | None, MemoryPasses | None]:
    """A preset's or `--params` model's main pass (`main_trace_wanted`) for the GPU predicted and
    the passes its memory is counted from at `shape` for `memory_target` (None: not wanted; none
    where `shape` says why it has no sequence to trace: the main pass alone then counts it), in one
    worker where both are run."""
    request = _main_request(w, compute, profile, gpu, timed)
    if isinstance(request, TraceRequest) and isinstance(shape, ModelShape) and memory_target is not None:
        say(f"tracing {w.what()} on the meta device for {_spoken(gpu, profile)}, and at 1 and 2 blocks for its "
            "memory (starting its worker: importing torch)")
        trace, memory = main_and_memory(request, target_for(compute.precision, profile, gpu), shape,
                                        compute.precision, w.fsdp_casts_weights, memory_target, say)
        return MainTrace(trace, request.note), memory
    main = _main_trace(request, w, compute, profile, gpu, say)
    if memory_target is None or not isinstance(shape, ModelShape):  # an image model, or no --tokens
        return main, None
    return main, memory_set(shape, compute.precision, w.fsdp_casts_weights, memory_target)


def _spoken(gpu: NamedGpu | None, profile: DeviceProfile | None) -> str:
    """The device a pass stands for, as the progress line names it."""
    return gpu.name if gpu is not None else profile.machine.device if profile is not None else "the GPU"


def whole_pass(user: UserModelRun | None, w: WorkloadRequest) -> WholePass | None:
    """The pass of the user's whole model its cut passes are checked against, where it ran."""
    trace = user.record.op_trace if user is not None else None
    return WholePass(trace, w.checkpointing.text) if isinstance(trace, TracedPass) else None


def named_by_profile(compute: ComputeRequest, profile: DeviceProfile | None) -> ComputeRequest:
    """No --gpu with a --gpu-profile: the profile's GPU is the one predicted (its memory, its optimizer)."""
    if compute.gpu is not None or profile is None:
        return compute
    named = profile.gpu.row
    return replace(compute, gpu=named.name) if named is not None else compute


def this_gpu_predicted(compute: ComputeRequest) -> bool:
    """No --gpu, or --gpu naming this machine's GPU: what is timed here is the device predicted.
    A --gpu of another GPU (or any --gpu on a machine without one) is a what-if, which never runs
    the model here."""
    if compute.gpu is None:
        return True

    return names_this_gpu(compute.gpu)


def _measured_memory_stands(user: UserModelRun | None, compute: ComputeRequest) -> bool:
    """A user's model timed on the GPU predicted: its memory as measured, at its own size."""
    return (user is not None and user.timed and user.timing_stands
            and bool(user.record.memory))


def _user_model_here(w: WorkloadRequest, compute: ComputeRequest, profile: DeviceProfile | None,
                     say: Progress) -> tuple[UserModelRun, WorkloadRequest]:
    """The user's model's run (`_run`), with the gradient-ready order that fits the device
    predicted, and `w` planned as it reads. A what-if (`this_gpu_predicted` false) traces it on the
    meta device only, unless --time-here asks for a timing here too: its order is the backward
    FLOPs per tensor. Otherwise it is timed here, and its order is the timed one on this GPU, else
    the backward FLOPs per tensor from a pass on the meta device at the stated shape. The same
    pass, for the GPU predicted (or timed), prices its ops: one pass in the same worker, run where
    either may be needed."""
    assert w.user_model is not None
    if not (w.time_here or this_gpu_predicted(compute)):
        say(f"tracing {w.user_model} on the meta device for {compute.gpu} (starting its worker: importing torch)")
        record, order = trace_only(w.user_model, _stated_micro_batch(w), w.tokens, say, w.checkpointing.text,
                                   w.fsdp_unit, gpu_target(compute.precision, compute.named))
        return _run(record, order, w, compute)
    device = here_device()
    priced_for = compute.gpu or compute.gpu_profile or device.startswith("cuda")
    target = target_for(compute.precision, profile, compute.named) if priced_for else None
    wanted = trace_wanted(device, compute.gpu, compute.micro_batch_time_s) or target is not None
    say(f"timing {w.user_model} on {device} (starting its worker: importing torch)")
    stated = stated_shape(_stated_micro_batch(w), w.tokens)  # timed and traced at the same shape
    record = measure_here(w.user_model, compute.precision, compute.optimizer, device=device,
                          trace=stated if wanted else None, target=target,
                          progress=say, ac=w.checkpointing.text, unit=w.fsdp_unit, stated=stated)
    return _run(record, choose_ready_order(record, compute.gpu, compute.micro_batch_time_s), w, compute)


def _run(record: UserModelRecord, order: ReadyOrder, w: WorkloadRequest,
         compute: ComputeRequest) -> tuple[UserModelRun, WorkloadRequest]:
    """The user's model's run as its `record` reads, and `w` planned at the micro-batch it reads
    (`planned_as_read`)."""
    planned = planned_as_read(w, record)
    return UserModelRun(record, order, timed_on(record, compute.gpu),
                        read_user_model(record, order, planned.micro_batch_size)), planned


def _stated_micro_batch(w: WorkloadRequest) -> int | None:
    """The micro-batch a user's callable is first built at: --micro-batch-size, else its own."""
    return w.micro_batch_size if w.micro_batch_stated else None


def _preset_on_this_gpu(w: WorkloadRequest, compute: ComputeRequest, say: Progress) -> MeasuredCompute | None:
    """A preset timed at its real size on this machine's first GPU; None without a GPU (the
    datasheet estimate, or the user's own figures, then stand in)."""
    if not visible_gpus():
        return None

    batch, preset, ac = w.micro_batch_size, w.preset_name, w.checkpointing.text
    assert preset is not None  # timed only for a preset
    say(f"timing {preset} on cuda:0 (starting its worker: importing torch)")
    more: dict[str, Any] = {"progress": say, **({"sizes": w.preset_sizes} if w.preset_sizes else {})}
    if is_vision(preset):
        return measure_preset(preset, batch, None, "cuda:0", compute.precision, compute.optimizer,
                              image_size=w.image_size, ac=ac, **more)
    # a sample past the context as sequences of it, as the op trace runs it
    sequences, seq_len = context_sequences(preset, batch, w.tokens)[:2] if w.tokens else (batch, None)
    return measure_preset(preset, sequences, seq_len, "cuda:0", compute.precision, compute.optimizer, ac=ac, **more)


def main_trace_wanted(compute: ComputeRequest, timed: MeasuredCompute | None) -> bool:
    """A preset's or `--params` compute is priced from its own ops as the compute where nothing
    measured it on a --gpu what-if, or beside the time measured on this GPU; not where the compute
    is given, calibrated, timed here or a utilization is given."""
    timed_gpu = timed.device_name if timed is not None else None
    what_if = (timed is None and not compute.given and compute.utilization is None  # a timing here fills it
               and (compute.gpu is not None or compute.gpu_profile is not None))
    return not (compute.gpu is None and timed_gpu is None and compute.gpu_profile is None) and \
        (what_if or timed_gpu is not None)


def _main_request(w: WorkloadRequest, compute: ComputeRequest, profile: DeviceProfile | None,
                  gpu: NamedGpu | None, timed: MeasuredCompute | None) -> TraceRequest | MainTrace | None:
    """What the main pass `main_trace_wanted` asks for traces, why it cannot be run, or None."""
    if not main_trace_wanted(compute, timed):
        return None
    if timed is not None and timed.device_name is not None and profile is None and gpu is not None and gpu.row is None:
        return MainTrace(why=f"{gpu.name} is not in the datasheet table")
    ac = w.checkpointing.text
    request: TraceRequest | str = (
        preset_request(w.preset, w.micro_batch_size, w.tokens, w.image_size, ac, w.preset_sizes) if w.preset
        else params_request(param_count(w), w.micro_batch_size, w.tokens, ac))
    return MainTrace(why=request) if isinstance(request, str) else request


def _main_trace(request: TraceRequest | MainTrace | None, w: WorkloadRequest, compute: ComputeRequest,
                profile: DeviceProfile | None, gpu: NamedGpu | None, say: Progress) -> MainTrace | None:
    """The main pass alone, where `_main_request` asks for one."""
    if not isinstance(request, TraceRequest):
        return request
    say(f"tracing {w.what()} on the meta device for {_spoken(gpu, profile)} (starting its worker: importing torch)")
    return MainTrace(trace_for_gpu(request, target_for(compute.precision, profile, gpu), say), request.note)


def gather_candidates(shape: ModelShape | UserShape | None, wanted: tuple[tuple[str, int], ...], pricing: Pricing,
                      progress: Progress | None = None, whole: WholePass | None = None,
                      sampled: SampledPasses | None = None) -> CandidatePasses | str | None:
    """The second round, once the memory has named the search's candidates (`wanted`): their
    passes on meta (`search.candidate_shape`; None: their compute is not priced here) for the
    device `pricing` prices them for, extended from the memory's passes (`sampled`) where they
    stand for them (`traces.candidate_passes`), or why they failed."""
    if shape is None:
        return None
    if progress is not None:
        how = ("passes at 1 and 2 blocks" if by_blocks(shape) else
               "passes of the model, cut to 1 and 2 blocks where they are alike" if whole is not None else
               "passes of the whole model")
        progress(f"pricing {len(wanted)} micro-batch size(s) and checkpointing mode(s) from {how} on meta")
    return candidate_passes(shape, list(wanted), pricing.target, whole, sampled)


def param_count(w: WorkloadRequest) -> int:
    """--params, where the request names no preset (it names one or the other)."""
    count = w.param_count
    assert count is not None
    return count


def gather_links(cluster: ClusterRequest, progress: Progress | None = None) -> LinkEvidence:
    """The file or hardware the links are read from, where the request does not give them
    (`link_choice.comm_of` reads the first source given: a bench, explicit numbers, a topology file,
    this machine's topology). One GPU per node needs no intra-node link: nothing is read."""
    if cluster.bench:
        return LinkEvidence(bench_fit=links.load_bench_fit(cluster.bench))
    if cluster.needs_no_link or cluster.link_bandwidth_gbps is not None:
        return LinkEvidence()
    if cluster.topology:
        return LinkEvidence(topology=topology_from_file(cluster.topology))
    if progress is not None:
        progress("reading this machine's topology (NVML, nvidia-smi)")
    return LinkEvidence(topology=collect_topology(), read_here=True)


def read_calibration(path: str) -> dict:
    doc = load_json(path)
    calibration = doc.get("calibration", doc)
    found = {k: calibration[k] for k in CALIBRATION_KEYS if calibration.get(k) is not None}
    if "micro_batch_time_s" not in found:
        raise InputError(f"{path}: no micro_batch_time_s in its calibration (expected `topoprof validate --json` "
                         f"output)")
    return found
