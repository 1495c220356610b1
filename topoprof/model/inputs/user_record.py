"""The user's own model (`--model PATH:CALLABLE`) as the model's inputs, from the record of what
`probes/ranks/model_timing.py` measured or the pass on meta read (`user_model`): its parameter list,
gradient-ready order and times. Pure: it reads the records alone.

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

import statistics
from dataclasses import dataclass, replace

from topoprof.errors import InputError
from topoprof.model.compute.datasheet import lookup_gpu_quietly, normalize_gpu_name
from topoprof.model.compute.measured import MeasuredCompute
from topoprof.model.inputs.request import WorkloadRequest
from topoprof.specs.messages import TraceFailure, UserModelRecord
from topoprof.specs.traced_pass import TracedPass
from topoprof.workload.layout import MATMUL_BACKWARD_FLOPS_PER_PARAM, Layout, TensorSpec, Use


def registration_order(record: UserModelRecord, why: str) -> ReadyOrder:
    """Gradients ready in reverse registration order, each after its share of the parameters: what
    stands in where the pass on meta failed and nothing weighs them by their backward FLOPs."""
    params = record.params
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    sizes = [params[i].numel for i in reversed(trainable)]
    total, done, ready = max(1, sum(sizes)), 0, []
    for i, size in zip(reversed(trainable), sizes):
        done += size
        ready.append([i, done / total])
    text = "gradient-ready order: reverse registration order, each tensor after its share of the parameters"
    return ReadyOrder(ready, f"{text}, since the pass on the meta device failed",
                      f"{text}: the pass on the meta device failed ({why})")


def stated_shape(micro_batch: int | None, tokens: int | None) -> dict:
    """The shape a prediction is for, as a `--model` callable may take it (`micro_batch`,
    `seq_len` = tokens per sequence, as the presets are built). A micro-batch of None is not
    stated: the callable builds its example batch at its own size (`example_batch_of`)."""
    return {"micro_batch": micro_batch, "seq_len": max(1, tokens // (micro_batch or 1)) if tokens else None}


@dataclass(frozen=True)
class BatchRead:
    """What a user's model showed of its example batch when it was read (`batch_read`)."""

    read: bool                  # False: its pass on meta failed before its batch was read
    samples: int | None = None  # the first dimension its tensors share; None where they share none
    seq_len: int | None = None  # the `seq_len` its callable took, if it took one
    block_list: str | None = None


def batch_read(record: UserModelRecord) -> BatchRead:
    """Its pass on meta's where that ran, else its timing's; nothing where it was only traced and
    the pass failed."""
    trace = record.op_trace
    if isinstance(trace, TracedPass):
        return BatchRead(True, trace.samples, trace.kwargs.get("seq_len"), trace.block_list)
    return BatchRead(record.timed, record.samples, None, record.block_list)


def example_batch_of(record: UserModelRecord) -> tuple[int | None, int | None]:
    """(samples, sequence length stated) of the example batch a user's model was read at. The
    samples are the first dimension its tensors share (`topoprof/zoo/user_callable.py:
    batch_samples`; None where they share none); the sequence length is the `seq_len` its callable
    took, if it took one."""
    read = batch_read(record)
    return read.samples, read.seq_len


def trained_micro_batch(record: UserModelRecord) -> int:
    """The micro-batch a user's model trains at, on the example batch its callable returns: the
    samples that batch holds, or 1 where its tensors share no first dimension to count them by."""
    return example_batch_of(record)[0] or 1


def block_list_of(record: UserModelRecord) -> str | None:
    """The module whose children are a user's model's repeated blocks, as --fsdp-unit named it or
    its checkpointing finds it (`topoprof/zoo/user_blocks.py:find_block_list`); None where it has none."""
    return batch_read(record).block_list


def micro_batch_note(micro_batch: int, record: UserModelRecord) -> str:
    """What a user's model with no --micro-batch-size is planned at, and why."""
    read = batch_read(record)
    if read.samples is not None:
        return f"micro-batch {micro_batch}: the samples its example batch holds (no --micro-batch-size given)"
    if not read.read:
        return f"micro-batch {micro_batch}: its example batch was not read; give --micro-batch-size"
    return (f"micro-batch {micro_batch}: the tensors of its example batch share no first dimension to count its "
            "samples by; give --micro-batch-size")


def gpu_key(name: str) -> str:
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
    if gpu is not None and (device_name is None or gpu_key(gpu) != gpu_key(device_name)):
        return f"it was timed on {device_name or 'an unnamed GPU'} ({device}), not on the {gpu} predicted (--gpu)"
    return None


def timed_on(record: UserModelRecord, gpu: str | None) -> bool:
    """Whether a model's timing here is the compute of `gpu`: no GPU is named, or it names the GPU
    the model was timed on; never another device's."""
    return gpu is None or flop_order_reason(record.device, record.device_name, gpu, None) is None


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


def measured_order(record: UserModelRecord) -> ReadyOrder:
    assert record.ready is not None, "a record timed here: only a timed record is read in its own order"
    return ReadyOrder(record.ready, f"gradient-ready order: measured on {record.device}")


def choose_ready_order(record: UserModelRecord, gpu: str | None = None,
                       micro_batch_time: float | None = None) -> ReadyOrder:
    """The timed order where the model was timed on the device predicted; else the backward
    FLOPs per tensor from the record's meta pass, or the timed order with a note where that failed."""
    why = flop_order_reason(record.device, record.device_name, gpu, micro_batch_time)
    if why is None:
        return measured_order(record)
    trace = record.op_trace
    failure = ("no pass on meta was run" if not trace else trace.reason if isinstance(trace, TraceFailure)
               else _other_parameters(record, trace))
    if failure or not isinstance(trace, TracedPass):
        measured = measured_order(record)
        return ReadyOrder(measured.ready, f"{measured.text}, although {why}: counting the backward FLOPs per "
                                          f"tensor failed ({failure})",
                          f"{measured.text} although {why}: counting the backward FLOPs per tensor on the meta "
                          f"device failed ({failure})")
    return ReadyOrder(trace.ready, "gradient-ready order: backward FLOPs per tensor (FlopCounterMode on meta "
                                   f"at {trace.shape}), since {why}")


def _other_parameters(record: UserModelRecord, trace: TracedPass) -> str | None:
    """The meta pass's indices mean the timed record's only where both list the same parameters."""
    if [p.name for p in trace.params or ()] == [p.name for p in record.params]:
        return None
    return f"the model built at {trace.shape} has other parameters than the one timed"


def user_layout(record: UserModelRecord, order: ReadyOrder | None = None) -> Layout:
    """The trainable parameters as a Layout whose ready schedule is `order` (the timed one unless given)."""
    order = order or measured_order(record)
    params = record.params
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    position = {i: k for k, i in enumerate(trainable)}
    tensors = tuple(TensorSpec(params[i].name, tuple(params[i].shape)) for i in trainable)
    ready = [(position[i], fraction) for i, fraction in order.ready if i in position]
    missing = sorted(set(range(len(trainable))) - {k for k, _ in ready})
    if missing:
        raise InputError(f"--model {record.spec}: no gradient reached "
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
    shared = sum(1 for p in params if p.aliases)
    return Layout(f"user:{record.spec}", tensors, tuple(reversed(uses)),
                  f"{record.spec}: {len(tensors)} trainable tensors ({frozen} frozen, {shared} shared); "
                  f"{order.text}")


@dataclass(frozen=True)
class UserModelRead:
    """What the model's inputs take from a user's model's record, read at once (`read_user_model`)."""

    layout: Layout            # its trainable parameters, ready in the order chosen (`user_layout`)
    block_list: str | None    # the module whose children are its blocks (`block_list_of`)
    samples: int | None       # its example batch's (`example_batch_of`)
    micro_batch_note: str     # what it is planned at where no --micro-batch-size was given
    measured: MeasuredCompute | None  # its timing's medians (`user_compute`), where it was timed here


def planned_as_read(w: WorkloadRequest, record: UserModelRecord) -> WorkloadRequest:
    """A user's model's `WorkloadRequest` `w` with no --micro-batch-size, planned at the samples
    its example batch holds as its callable built it (`example_batch_of`; 1 where they cannot be
    counted), with the tokens of that batch where its callable took the sequence length: every
    later pass states that size, or resizes the batch from it."""
    samples, seq_len = example_batch_of(record)
    if w.micro_batch_stated or samples is None:
        return w
    return replace(w, micro_batch_size=samples, tokens=samples * seq_len if seq_len and w.tokens else w.tokens)


def read_user_model(record: UserModelRecord, order: ReadyOrder, micro_batch: int) -> UserModelRead:
    """`record` read for the model's inputs, planned at `micro_batch`."""
    measured = user_compute(record) if record.passes else None
    return UserModelRead(user_layout(record, order), block_list_of(record), example_batch_of(record)[0],
                         micro_batch_note(micro_batch, record), measured)


def user_compute(record: UserModelRecord) -> MeasuredCompute:
    """Measured forward+backward, backward share and optimizer step: medians of the repeats."""
    passes, optimizer_s = record.passes, record.optimizer_s
    assert passes and optimizer_s, "a record timed here: only a timed record has a measured compute"
    total = [p.forward_s + p.backward_s for p in passes]
    where = (f"measured on {record.device} ({record.precision or 'fp32'}, {record.optimizer or 'AdamW'}), "
             f"{len(passes)} repeats, median")
    return MeasuredCompute(statistics.median(total),
                           statistics.median(p.backward_s / t for p, t in zip(passes, total)),
                           statistics.median(optimizer_s),
                           f"{record.spec}: {where} (spread {min(total) * 1e3:.1f}..{max(total) * 1e3:.1f} ms)",
                           record.device_name, record.device_memory_bytes, record.memory)


