"""The user's own model (`--model PATH:CALLABLE`) as the model's inputs, from what
`probes/ranks/model_timing.py` measured: its parameter list, gradient-ready order and times.

- The layout holds the trainable parameters in registration order (DDP's parameter list: frozen
  ones are never bucketed, a shared tensor counts once). Its uses are the measured ready events
  in reverse, one tensor each, weighted by the share of backward that passed before each
  gradient was ready, so that `Layout.ready_schedule()` returns the measured ready order and
  moments: the order DDP rebuilds its buckets in after its first iteration. The weights are
  scaled to 4 FLOPs per trainable parameter per token (the matmul convention of `presets`) so
  that FLOP-based what-ifs stay comparable; the measured times are what the prediction uses.
- Compute: forward + backward per micro-batch, the backward share and the optimizer step, each
  the median of the timed repeats.
- Which ready order: the timed one only where the model was timed on the device predicted. A
  backward timed on a CPU (or given as --micro-batch-time, or for another GPU than this one)
  spreads its work unlike the GPU's, so the order then comes from the backward FLOPs per tensor,
  counted on the meta device at the stated shape (`topoprof/trace/op_trace.py`); where that pass fails,
  the timed order stands in and a note says why.
- A what-if (--gpu naming a GPU that is not here) is never timed here unless asked
  (`trace_only`): the meta pass alone gives the parameters, the order and the ops to price;
  where it fails after the model was built, the parameters stand in reverse registration order
  (`registration_order`).
"""
from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from typing import Callable

from topoprof.errors import InputError
from topoprof.measure.meta_trace import trace_model
from topoprof.measure.runner import visible_gpus
from topoprof.measure.user_model import measure_user_model
from topoprof.model.compute.datasheet import lookup_gpu_quietly, normalize_gpu_name
from topoprof.model.compute.scaled import scaled_compute
from topoprof.model.compute.traced import gpu_target
from topoprof.probes.hardware.nvml import query_nvml
from topoprof.topology.visible import job_gpus
from topoprof.workload.layout import MATMUL_BACKWARD_FLOPS_PER_PARAM, Layout, TensorSpec, Use
from topoprof.workload.presets import MAX_SEQ_LEN, PRESET_DEPTH, get_preset, is_vision
from topoprof.workload.vision import DEFAULT_IMAGE_SIZE, check_image_size
from topoprof.zoo.hf_spec import HFModelError, check_installed, config_path, is_hf_spec


def check_spec(spec: str) -> str:
    """`PATH.py:CALLABLE`, `package.module:CALLABLE` or `hf:PATH[#ATTN]`; a path must exist (and
    an `hf:` config name its architecture, with transformers installed). One line otherwise."""
    if is_hf_spec(spec):
        try:
            config_path(spec)
            check_installed()
        except HFModelError as err:
            raise InputError(f"--model {spec}: {err}") from None
        return spec
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise InputError(f"--model {spec!r}: expected PATH.py:CALLABLE, package.module:CALLABLE "
                         "(e.g. train.py:build) or hf:PATH (a Hugging Face config.json or its folder)")
    if (target.endswith(".py") or os.sep in target) and not os.path.isfile(target):
        raise InputError(f"--model {spec!r}: no such file: {target}")
    return spec


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
    return name is not None and _gpu_key(gpu) == _gpu_key(name)


def measure_here(spec: str, precision: str = "bf16", optimizer: str = "adamw", trace: dict | None = None,
                 device: str | None = None, target: dict | None = None,
                 progress: Callable[[str], None] | None = None, ac: str = "none", unit: str | None = None) -> dict:
    """The user's model read and timed on this machine: its first GPU when it has one (under
    `precision`), else the CPU (fp32, as CPU ranks train). With `trace` (the stated shape, see
    `stated_shape`) the record also holds its pass on the meta device, "op_trace", run for the
    `target` device (`topoprof/trace/op_trace.py`) when one is given. `progress` hears each stage;
    `ac`: its blocks (the children of `unit`, else the block list found) checkpointed so, timed and
    traced (`topoprof/zoo/user_blocks.py`)."""
    if optimizer not in ("adamw", "sgd"):
        raise InputError(f"--optimizer {optimizer!r}: your model is timed with adamw or sgd")
    return measure_user_model(check_spec(spec), device or here_device(), precision=precision,
                              optimizer=optimizer, trace=trace, target=target, progress=progress, ac=ac, unit=unit)


def trace_only(spec: str, micro_batch: int, tokens: int | None, precision: str,
               progress: Callable[[str], None] | None = None, ac: str = "none",
               unit: str | None = None, gpu: str | None = None) -> tuple[dict, ReadyOrder]:
    """The user's model read for a what-if without running it here: its pass on the meta device
    for a GPU in `precision` (`topoprof.measure.meta_trace.trace_model`), whatever its size. (record,
    ready order): the record as `user_layout` reads it, with the trace as "op_trace". Where only
    the pass failed, the parameters built on meta stand, in reverse registration order
    (`registration_order`); where the callable itself is wrong, or nothing could be built on meta,
    InputError (exit 2) says so: a what-if never runs the model here to find out. `ac`, `unit`: its
    blocks checkpointed so (`topoprof/zoo/user_blocks.py`)."""
    shape = stated_shape(micro_batch, tokens)
    trace = trace_model(check_spec(spec), None, shape, gpu_target(precision, gpu), progress=progress, ac=ac, unit=unit)
    if trace.get("user_error"):
        error = InputError(f"--model {spec}: {trace['failure']}")
        error.detail_text = trace.get("traceback") or ""
        raise error
    if trace.get("failure") and not trace.get("params"):
        raise InputError(f"--model {spec}: it could not be built on the meta device, or its pass there failed "
                         f"before any parameter was read ({trace['failure']}); a --gpu what-if never runs it on this "
                         "machine: give --time-here to time it here")
    record = {"spec": spec, "device": "meta", "params": trace["params"], "op_trace": trace,
              **({"checkpointing": trace["checkpointing"]} if trace.get("checkpointing") else {})}
    if trace.get("failure"):
        return record, registration_order(record, trace["failure"])
    return record, ReadyOrder(trace["ready"], "gradient-ready order: backward FLOPs per tensor (FlopCounterMode on "
                                              f"meta at {trace['shape']}); a what-if traces the model, never runs it "
                                              f"here")


def registration_order(record: dict, why: str) -> ReadyOrder:
    """Gradients ready in reverse registration order, each after its share of the parameters: what
    stands in where the pass on meta failed and nothing weighs them by their backward FLOPs."""
    params = record["params"]
    trainable = [i for i, p in enumerate(params) if p["requires_grad"]]
    sizes = [math.prod(params[i]["shape"]) for i in reversed(trainable)]
    total, done, ready = max(1, sum(sizes)), 0, []
    for i, size in zip(reversed(trainable), sizes):
        done += size
        ready.append([i, done / total])
    text = "gradient-ready order: reverse registration order, each tensor after its share of the parameters"
    return ReadyOrder(ready, f"{text}, since the pass on the meta device failed",
                      f"{text}: the pass on the meta device failed ({why})")


def stated_shape(micro_batch: int, tokens: int | None) -> dict:
    """The shape a prediction is for, as a `--model` callable may take it (`micro_batch`,
    `seq_len` = tokens per sequence, as the presets are built)."""
    return {"micro_batch": micro_batch, "seq_len": max(1, tokens // micro_batch) if tokens else None}


def _gpu_key(name: str) -> str:
    """The datasheet table's key for a GPU name, so that 'H100 SXM' and 'NVIDIA H100 80GB HBM3'
    compare equal; the normalized name where the table does not know it."""
    spec = lookup_gpu_quietly(name)  # an unknown name is compared as written, not warned about
    return spec.name if spec is not None else normalize_gpu_name(name)


def flop_order_reason(device: str, device_name: str | None, gpu: str | None,
                      micro_batch_time: float | None) -> str | None:
    """Why the timed ready order does not describe the device predicted; None where it does:
    timed on a GPU, with no --gpu or --gpu naming that same GPU, and the compute not given."""
    if micro_batch_time is not None:
        return "the compute is given (--micro-batch-time), not timed here"
    if not device.startswith("cuda"):
        return f"it was timed on {device}, not on " + (f"the {gpu} predicted (--gpu)" if gpu else "a GPU")
    if gpu is not None and (device_name is None or _gpu_key(gpu) != _gpu_key(device_name)):
        return f"it was timed on {device_name or 'an unnamed GPU'} ({device}), not on the {gpu} predicted (--gpu)"
    return None


def trace_wanted(device: str, gpu: str | None, micro_batch_time: float | None) -> bool:
    """Whether the FLOP order may be needed, before the timed GPU's name is known."""
    return micro_batch_time is not None or not device.startswith("cuda") or gpu is not None


@dataclass(frozen=True)
class ReadyOrder:
    """The gradient-ready events a layout is built from, what they are, and a note where the
    order wanted could not be had."""

    ready: list  # [[param_index, share of backward done], ...] in ready order
    text: str    # "gradient-ready order: ..."
    note: str | None = None


def measured_order(record: dict) -> ReadyOrder:
    return ReadyOrder(record["ready"], f"gradient-ready order: measured on {record['device']}")


def choose_ready_order(record: dict, gpu: str | None = None, micro_batch_time: float | None = None) -> ReadyOrder:
    """The timed order where the model was timed on the device predicted; else the backward
    FLOPs per tensor from the record's meta pass, or the timed order with a note where that failed."""
    why = flop_order_reason(record["device"], record.get("device_name"), gpu, micro_batch_time)
    if why is None:
        return measured_order(record)
    trace = record.get("op_trace") or {"failure": "no pass on meta was run"}
    failure = trace.get("failure") or _other_parameters(record, trace)
    if failure:
        measured = measured_order(record)
        return ReadyOrder(measured.ready, f"{measured.text}, although {why}: counting the backward FLOPs per "
                                          f"tensor failed ({failure})",
                          f"{measured.text} although {why}: counting the backward FLOPs per tensor on the meta "
                          f"device failed ({failure})")
    return ReadyOrder(trace["ready"], "gradient-ready order: backward FLOPs per tensor (FlopCounterMode on meta "
                                      f"at {trace['shape']}), since {why}")


def _other_parameters(record: dict, trace: dict) -> str | None:
    """The meta pass's indices mean the timed record's only where both list the same parameters."""
    if [p["name"] for p in trace["params"]] == [p["name"] for p in record["params"]]:
        return None
    return f"the model built at {trace['shape']} has other parameters than the one timed"


def user_layout(record: dict, order: ReadyOrder | None = None) -> Layout:
    """The trainable parameters as a Layout whose ready schedule is `order` (the timed one unless given)."""
    order = order or measured_order(record)
    params = record["params"]
    trainable = [i for i, p in enumerate(params) if p["requires_grad"]]
    position = {i: k for k, i in enumerate(trainable)}
    tensors = tuple(TensorSpec(params[i]["name"], tuple(params[i]["shape"])) for i in trainable)
    ready = [(position[i], fraction) for i, fraction in order.ready if i in position]
    missing = sorted(set(range(len(trainable))) - {k for k, _ in ready})
    if missing:
        raise InputError(f"--model {record['spec']}: no gradient reached "
                         f"{', '.join(tensors[k].name for k in missing[:4])} in backward (unused "
                         "parameters: DDP would need find_unused_parameters=True, which topoprof does not model)")
    total_flops = MATMUL_BACKWARD_FLOPS_PER_PARAM * sum(t.numel for t in tensors)
    end = max(ready[-1][1], 1e-12)
    uses, before = [], 0.0
    for k, fraction in ready:
        share = max(fraction, before)  # hooks fire in order; clock jitter never runs backwards
        uses.append(Use((k,), total_flops * (share - before) / end))
        before = share
    if sum(u.backward_flops_per_token for u in uses) <= 0:  # every hook at the same instant
        uses = [Use((k,), total_flops / len(ready)) for k, _ in ready]
    frozen = len(params) - len(trainable)
    shared = sum(1 for p in params if p["aliases"])
    return Layout(f"user:{record['spec']}", tensors, tuple(reversed(uses)),
                  f"{record['spec']}: {len(tensors)} trainable tensors ({frozen} frozen, {shared} shared); "
                  f"{order.text}")


def user_compute(record: dict) -> dict:
    """Measured forward+backward, backward share and optimizer step: medians of the repeats."""
    passes = record["passes"]
    total = [p["forward_s"] + p["backward_s"] for p in passes]
    where = (f"measured on {record['device']} ({record.get('precision', 'fp32')}, {record.get('optimizer', 'AdamW')}), "
             f"{len(passes)} repeats, median")
    return {"memory": record.get("memory"), "micro_batch_time_s": statistics.median(total),
            "backward_fraction": statistics.median(p["backward_s"] / t for p, t in zip(passes, total)),
            "optimizer_time_s": statistics.median(record["optimizer_s"]),
            "source": f"{record['spec']}: {where} (spread {min(total) * 1e3:.1f}..{max(total) * 1e3:.1f} ms)",
            "device_name": record.get("device_name"), "device_memory_bytes": record.get("device_memory_bytes")}


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
                   progress: Callable[[str], None] | None = None, sizes: dict | None = None) -> dict:
    """A preset built at its real size and timed on `device`; when it does not fit, timed at
    SCALED_DEPTHS blocks and extended to its depth (`topoprof.model.compute.scaled`), and said so.
    A vision preset reads `micro_batch` images of `image_size` (default 224) and no sequence; it
    is always timed whole (the largest, 88.8M parameters, fits any GPU's training state). `sizes`:
    the module's arguments changed (`WorkloadRequest.preset_sizes`)."""
    def timed(**more):  # `ac`: its blocks checkpointed as the job runs them (topoprof/zoo/checkpoint_wrap.py)
        record = measure_user_model(PRESET_SPEC, device, precision=precision, optimizer=optimizer,
                                    kwargs={**kwargs, **more, **({"ac": ac} if ac != "none" else {}),
                                            **({"sizes": sizes} if sizes else {})},
                                    progress=progress)
        return user_compute({**record, "spec": preset})

    if is_vision(preset):
        if seq_len is not None:
            raise InputError(f"--tokens: {preset} is an image model: it reads --micro-batch-size images, not tokens")

        image_size = DEFAULT_IMAGE_SIZE if image_size is None else check_image_size(image_size)
        kwargs = {"preset": preset, "micro_batch": micro_batch, "image_size": image_size}
        return {**timed(), "scaled": None}
    if image_size is not None:
        get_preset(preset, image_size)  # a text preset: refused, naming --image-size
    seq_len = seq_len or min(1024, MAX_SEQ_LEN[preset])
    if seq_len > MAX_SEQ_LEN[preset]:
        raise InputError(f"--tokens: {preset} reads at most {MAX_SEQ_LEN[preset]} tokens per sequence, "
                         f"got {seq_len} (tokens / micro-batch size)")
    kwargs = {"preset": preset, "micro_batch": micro_batch, "seq_len": seq_len}

    if not _cannot_fit(preset, optimizer, gpu_memory_bytes(device)):
        try:
            return {**timed(), "scaled": None}
        except InputError as err:
            if not _out_of_memory(err):
                raise
    shallow, deep = (timed(n_layer=n) for n in SCALED_DEPTHS)
    return {**scaled_compute(shallow, deep, SCALED_DEPTHS, PRESET_DEPTH[preset]), "scaled": list(SCALED_DEPTHS)}
