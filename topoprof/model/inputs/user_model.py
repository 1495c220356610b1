"""The user's own model (`--model PATH:CALLABLE`) and a preset, measured or traced for the
model's inputs: timed on this machine (`measure_here`, `measure_preset`, in the workers of
`topoprof.measure.user_model`), or read on the meta device only for a what-if (`trace_only`);
and what this machine's GPU is (NVML, no torch). What is made of their records, the layout and
the ready order, is `user_record`'s.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable

from topoprof.errors import InputError
from topoprof.measure.meta_trace import trace_model
from topoprof.measure.runner import visible_gpus
from topoprof.measure.user_model import measure_user_model
from topoprof.model.compute.measured import MeasuredCompute, scaled_compute
from topoprof.model.inputs.request import check_spec
from topoprof.model.inputs.user_record import ReadyOrder, gpu_key, registration_order, stated_shape, user_compute
from topoprof.probes.hardware.nvml import query_nvml
from topoprof.specs.messages import TraceFailure, UserModelRecord
from topoprof.specs.traced_pass import TraceTarget
from topoprof.topology.visible import job_gpus
from topoprof.workload.presets import MAX_SEQ_LEN, PRESET_DEPTH, get_preset, is_vision
from topoprof.workload.vision import DEFAULT_IMAGE_SIZE, check_image_size


def here_device() -> str:
    """Where `measure_here` times: this machine's first GPU when it has one, else the CPU."""
    return "cuda:0" if visible_gpus() else "cpu"


def here_gpu_name(device: str) -> str | None:
    """The name NVML gives the GPU `device` (cuda:i) is, e.g. 'NVIDIA H100 80GB HBM3', read without
    torch or a CUDA context (`nvml_gpu_of`); None on the CPU or when unknown."""
    gpu = nvml_gpu_of(device)
    return None if gpu is None else gpu.name


def names_this_gpu(gpu: str) -> bool:
    """Whether `gpu` (--gpu) names the GPU this machine times on (`here_device`): a prediction
    for it is no what-if. False without a GPU here, or where its name cannot be read. NVML alone
    answers (`here_gpu_name`): the command's own process never imports torch for it."""
    name = here_gpu_name("cuda:0")
    return name is not None and gpu_key(gpu) == gpu_key(name)


def measure_here(spec: str, precision: str = "bf16", optimizer: str = "adamw", trace: dict | None = None,
                 device: str | None = None, target: TraceTarget | None = None,
                 progress: Callable[[str], None] | None = None, ac: str = "none", unit: str | None = None,
                 stated: dict | None = None) -> UserModelRecord:
    """The user's model read and timed on this machine: its first GPU when it has one (under
    `precision`), else the CPU (fp32, as CPU ranks train), at `stated` (`stated_shape`; None: as
    its callable builds it). With `trace` (the stated shape, see
    `stated_shape`) the record also holds its pass on the meta device, `op_trace`, run for the
    `target` device (`topoprof/trace/op_trace.py`) when one is given. `progress` hears each stage;
    `ac`: its blocks (the children of `unit`, else the block list found) checkpointed so, timed and
    traced (`topoprof/zoo/user_blocks.py`)."""
    if optimizer not in ("adamw", "sgd"):
        raise InputError(f"--optimizer {optimizer!r}: your model is timed with adamw or sgd")
    return measure_user_model(check_spec(spec), device or here_device(), precision=precision,
                              optimizer=optimizer, trace=trace, target=target, progress=progress, ac=ac, unit=unit,
                              stated=stated)


def trace_only(spec: str, micro_batch: int | None, tokens: int | None, progress: Callable[[str], None] | None,
               ac: str, unit: str | None, target: TraceTarget) -> tuple[UserModelRecord, ReadyOrder]:
    """The user's model read for a what-if without running it here: its pass on the meta device
    for the GPU `target` (`topoprof.measure.meta_trace.trace_model`), whatever its size. (record,
    ready order): the record as `user_layout` reads it, with the trace as `op_trace`. Where only
    the pass failed, the parameters built on meta stand, in reverse registration order
    (`registration_order`); where the callable itself is wrong, or nothing could be built on meta,
    InputError (exit 2) says so: a what-if never runs the model here to find out. `ac`, `unit`: its
    blocks checkpointed so (`topoprof/zoo/user_blocks.py`)."""
    shape = stated_shape(micro_batch, tokens)
    trace = trace_model(check_spec(spec), None, shape, target, progress=progress, ac=ac, unit=unit)
    if isinstance(trace, TraceFailure):
        return _params_read_before(spec, trace)
    record = UserModelRecord(spec, "meta", trace.params or [], checkpointing=trace.checkpointing,
                             op_trace=trace)
    return record, ReadyOrder(trace.ready, "gradient-ready order: backward FLOPs per tensor (FlopCounterMode on "
                                           f"meta at {trace.shape}); a what-if traces the model, never runs it here")


def _params_read_before(spec: str, failure: TraceFailure) -> tuple[UserModelRecord, ReadyOrder]:
    """A what-if whose pass on meta failed: the parameters read before it, in reverse registration
    order; InputError where the callable is the user's to fix, or nothing of it was read."""
    if failure.users_to_fix:
        error = InputError(f"--model {spec}: {failure.reason}")
        error.detail_text = failure.traceback
        raise error
    if not failure.params:
        raise InputError(f"--model {spec}: it could not be built on the meta device, or its pass there failed "
                         f"before any parameter was read ({failure.reason}); a --gpu what-if never runs it on this "
                         "machine: give --time-here to time it here")
    record = UserModelRecord(spec, "meta", failure.params, op_trace=failure)
    return record, registration_order(record, failure.reason)


PRESET_SPEC = "topoprof.zoo.preset_modules:build"
SCALED_DEPTHS = (2, 4)  # blocks of the two reduced models a too-large preset is timed at


# Training state per parameter, before any activation: fp32 weight and gradient (4 + 4 B), plus
# AdamW's exp_avg and exp_avg_sq (2 x 4 B; torch/optim/adamw.py keeps them in the parameter's
# dtype); plain SGD without momentum keeps no state (torch/optim/sgd.py).
TRAIN_STATE_BYTES_PER_PARAM = {"adamw": 16, "sgd": 8}


def nvml_gpu_of(device: str):
    """NVML's record of the GPU that `device` (cuda:i) is (no torch, no CUDA context in this
    process): cuda:i is the i-th GPU CUDA_VISIBLE_DEVICES gives the job, not NVML's GPU i. None
    when unknown, and for a MIG device (a slice of its GPU)."""
    if not device.startswith("cuda"):
        return None
    try:
        gpus = query_nvml().gpus
        ordinal = int(device.split(":")[1]) if ":" in device else 0
        devices = job_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus, os.environ.get("CUDA_DEVICE_ORDER")).devices
        seen = devices[ordinal] if ordinal < len(devices) else None
        if seen is None or seen.gpu is None or seen.mig:
            return None
        return next(g for g in gpus if g.index == seen.gpu)
    except Exception:  # noqa: BLE001 - unknown: callers say what that means for them
        return None


def gpu_memory_bytes(device: str) -> int | None:
    """The total memory of the GPU that `device` (cuda:i) is, from NVML (`nvml_gpu_of`); None when
    unknown (the whole model is then tried, and an OOM scales it)."""
    gpu = nvml_gpu_of(device)
    return None if gpu is None else gpu.memory_total_bytes


def _cannot_fit(preset: str, optimizer: str, memory_bytes: int | None) -> bool:
    """True when the training state alone exceeds the GPU's memory: building the whole model
    (tens of GB of random weights on the host) only to run out of memory would waste the scan's time."""
    if memory_bytes is None:
        return False
    return get_preset(preset).params * TRAIN_STATE_BYTES_PER_PARAM.get(optimizer, 16) > memory_bytes


def _out_of_memory(err: Exception) -> bool:
    return "OutOfMemory" in str(err) or "out of memory" in str(err).lower()


def measure_preset(preset: str, micro_batch: int, seq_len: int | None, device: str, precision: str = "bf16",
                   optimizer: str = "adamw", image_size: int | None = None, ac: str = "none",
                   progress: Callable[[str], None] | None = None, sizes: dict | None = None) -> MeasuredCompute:
    """A preset built at its real size and timed on `device`; when it does not fit, timed at
    SCALED_DEPTHS blocks and extended to its depth (`topoprof.model.compute.measured`), and said so.
    A vision preset reads `micro_batch` images of `image_size` (default 224) and no sequence; it
    is always timed whole (the largest, 88.8M parameters, fits any GPU's training state). `sizes`:
    the module's arguments changed (`WorkloadRequest.preset_sizes`)."""
    def timed(**more):  # `ac`: its blocks checkpointed as the job runs them (topoprof/zoo/checkpoint_wrap.py)
        record = measure_user_model(PRESET_SPEC, device, precision=precision, optimizer=optimizer,
                                    kwargs={**kwargs, **more, **({"ac": ac} if ac != "none" else {}),
                                            **({"sizes": sizes} if sizes else {})},
                                    progress=progress)
        return user_compute(replace(record, spec=preset))

    if is_vision(preset):
        if seq_len is not None:
            raise InputError(f"--tokens: {preset} is an image model: it reads --micro-batch-size images, not tokens")

        image_size = DEFAULT_IMAGE_SIZE if image_size is None else check_image_size(image_size)
        kwargs = {"preset": preset, "micro_batch": micro_batch, "image_size": image_size}
        return timed()
    if image_size is not None:
        get_preset(preset, image_size)  # a text preset: refused, naming --image-size
    seq_len = seq_len or min(1024, MAX_SEQ_LEN[preset])
    if seq_len > MAX_SEQ_LEN[preset]:
        raise InputError(f"--tokens: {preset} reads at most {MAX_SEQ_LEN[preset]} tokens per sequence, "
                         f"got {seq_len} (tokens / micro-batch size)")
    kwargs = {"preset": preset, "micro_batch": micro_batch, "seq_len": seq_len}

    if not _cannot_fit(preset, optimizer, gpu_memory_bytes(device)):
        try:
            return timed()
        except InputError as err:
            if not _out_of_memory(err):
                raise
    shallow, deep = (timed(n_layer=n) for n in SCALED_DEPTHS)
    return scaled_compute(shallow, deep, SCALED_DEPTHS, PRESET_DEPTH[preset])
