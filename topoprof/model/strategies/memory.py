"""Memory per GPU for each strategy from a job's inputs: the activations (given, counted from
the op trace, or by formula), the GPU's memory, and what a timed GPU measured, put to
`topoprof.model.memory.holding`'s counts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from topoprof.model.compute.timing import Compute
from topoprof.model.memory import environment, holding
from topoprof.model.memory.holding import OPTIMIZER_STATES
from topoprof.model.memory.traced import MicroBatchBytes, from_trace
from topoprof.model.strategies.job import BLOCKING_BACKENDS, ModelInputs, Workload
from topoprof.model.strategies.results import Memory
from topoprof.workload.presets import PRESET_DEPTH


@dataclass(frozen=True)
class MicroBatchCount:
    """What one micro-batch adds per GPU, and where each figure comes from."""

    activations: float | None
    source: str
    micro_batch: MicroBatchBytes | None = None       # the rest of it, where a trace counted it
    fsdp_micro_batch: MicroBatchBytes | None = None  # the same under FSDP's 16-bit param_dtype
    fsdp_source: str = ""


NOT_TRACED = "not counted: only the op trace counts it (a --gpu what-if with --tokens, or a --model)"


def micro_batch_count(inputs: ModelInputs) -> MicroBatchCount:
    """Activation bytes per micro-batch on one GPU (and the rest a trace counts), and the source."""
    work = inputs.workload
    ac = work.checkpointing
    if work.activation_memory_gb is not None:
        return MicroBatchCount(work.activation_memory_gb * holding.GB, "given (--activation-memory)")
    traced_set = work.traced_memory
    samples = _samples(inputs)
    if traced_set is not None and samples is not None and traced_set.has("autocast", ac):
        mb = traced_set.count(ac, samples, "autocast")
        cast = None
        if work.fsdp_bytes[0] == 2 and traced_set.has("cast", ac):
            cast = traced_set.count(ac, samples, "cast")
        return MicroBatchCount(mb.activations, f"counted from the op trace ({ac.text}: "
                                               f"{traced_set.per_block(ac, samples)}): {traced_set.source}", mb, cast,
                               "the same passes with the weights cast to 16 bits, as FSDP2's MixedPrecisionPolicy "
                               f"(param_dtype) runs the blocks ({traced_set.per_block(ac, samples, 'cast')}): no "
                               "autocast copies" if cast is not None else "")
    detail = inputs.compute.modelled.detail if inputs.compute.modelled is not None else None
    if detail is not None and detail.memory is not None:  # the model's own autograd graph, at the shape priced
        mb = from_trace(detail.memory)
        shape = detail.shape
        # FSDP's 16-bit param_dtype gathers 16-bit weights: nothing for autocast to copy
        cast = replace(mb, param_copies=0.0) if work.fsdp_bytes[0] == 2 else None
        return MicroBatchCount(mb.activations, f"counted from the op trace at {shape} ({ac.text}): the tensors "
                                               "the embedding and the blocks keep for backward", mb, cast,
                               "FSDP2's MixedPrecisionPolicy (param_dtype) gathers 16-bit weights: no autocast "
                               "copies; its blocks' activations as the autocast pass keeps them")
    counted, source = holding.formula_activations(PRESET_DEPTH.get(work.layout.name), work.layout,
                                                  work.tokens_per_micro_batch, inputs.compute.precision, ac)
    return MicroBatchCount(counted, source)


def _samples(inputs: ModelInputs) -> float | None:
    """The micro-batch in the traced passes' sequences: its tokens over theirs where a sample was
    traced as several sequences of a preset's context (each token keeps the same), else its samples."""
    work = inputs.workload
    traced = work.traced_memory
    if traced is not None and work.tokens_per_micro_batch and traced.seq_len:
        return work.tokens_per_micro_batch / traced.seq_len
    return work.micro_batch_size


def gpu_memory_of(comp: Compute) -> tuple[float | None, str]:
    """The GPU's memory, GB, and where it comes from: given or measured, else the GPU's name or
    datasheet row; None where neither says."""
    if comp.gpu_memory_gb is not None:
        return comp.gpu_memory_gb, comp.origin("gpu_memory_gb")
    found = comp.named.memory_gb if comp.named is not None else None
    return found if found else (None, "unknown: give --gpu NAME or --gpu-memory GB")


@dataclass(frozen=True)
class JobMemory:
    """What every strategy's memory is counted from for one job, derived once (`job_memory`):
    what a micro-batch adds, the GPU's memory, the counts `holding` takes (a GPU's measured bytes
    in place of the counted ones where it measured them) and their basis."""

    count: MicroBatchCount
    capacity_gb: float | None
    capacity_source: str
    model: holding.MemoryModel
    basis: str
    measured: bool
    workspace_source: str


def job_memory(inputs: ModelInputs) -> JobMemory:
    """What every strategy's memory is counted from for `inputs` (`JobMemory`)."""
    work, cl = inputs.workload, inputs.cluster
    capacity, capacity_source = gpu_memory_of(inputs.compute)
    measured = _measured_memory(work)
    count = micro_batch_count(inputs)
    named = inputs.compute.named  # cuBLAS's workspace by the GPU's compute capability
    workspace, workspace_source = environment.cublas_workspace(named.capability if named is not None else None)
    environment_counted = cl.backend not in BLOCKING_BACKENDS  # CPU ranks (gloo) hold none of it
    optimizer = inputs.compute.optimizer if inputs.compute.optimizer in OPTIMIZER_STATES else "adamw"
    intra = getattr(cl.comm, "intra", None) or cl.comm
    model = holding.MemoryModel(
        work.layout.params, param_bytes=work.grad_bytes, grad_bytes=work.grad_bytes, optimizer=optimizer,
        world_size=cl.gpus, gpus_per_node=cl.gpus_per_node, gradient_as_bucket_view=work.gradient_as_bucket_view,
        largest_group_params=work.largest_fsdp_group_params,
        fsdp_param_bytes=work.fsdp_bytes[0], fsdp_reduce_bytes=work.fsdp_bytes[1],
        activations=count.activations, micro_batch=count.micro_batch, fsdp_micro_batch=count.fsdp_micro_batch,
        rings=int(getattr(intra, "rings", 1) or 1), environment=environment_counted,
        single_tensor_optimizer_numels=(() if environment_counted else tuple(t.numel for t in work.layout.tensors)),
        accumulation=inputs.accumulation_steps, workspace=workspace if environment_counted else 0.0)
    if measured is None:
        return JobMemory(count, capacity, capacity_source, model, "counted", False, workspace_source)
    fields, basis = measured
    return JobMemory(count, capacity, capacity_source, replace(model, **fields), basis, True, workspace_source)


def memory_by_strategy(job: JobMemory, names) -> dict[str, Memory]:
    """Each strategy's memory per GPU, counted (topoprof.model.memory.holding), and whether it fits."""
    capacity, model = job.capacity_gb, job.model
    out = {}
    for name in names:
        held = holding.holding(name, model)
        if held is None:
            continue
        sources = part_sources(name, job.count, model, job.measured, job.workspace_source)
        f = holding.fit(held, None if capacity is None else capacity * holding.GB)
        low, high = held.total_range
        reserved = held.reserved_range
        out[name] = Memory({k: None if v is None else v / holding.GB for k, v in holding.parts(held).items()},
                           held.total / holding.GB, job.basis, capacity, f.fits, f.reason,
                           (low / holding.GB, high / holding.GB),
                           sources,
                           held.allocated / holding.GB,
                           held.peak.text(held.accumulation), (reserved[0] / holding.GB, reserved[1] / holding.GB),
                           {part: value / holding.GB for part, value in held.peak.parts})
    return out


def part_sources(strategy: str, count: MicroBatchCount, model: holding.MemoryModel, measured: bool,
                 workspace_source: str) -> dict[str, str]:
    """Where each part beyond the states comes from, or why it is not counted."""
    fsdp = strategy.startswith(("fsdp_", "hsdp")) and count.fsdp_micro_batch is not None
    mb = count.fsdp_micro_batch if fsdp else count.micro_batch
    traced = "counted from the op trace"
    if measured:
        rest = "measured with the activations (memory_allocated after the forward)"
        sources = {"activations": model_source(measured), "logits": rest, "param_copies": rest,
                   "backward_transient": "measured in the step's peak, not apart"}
    elif mb is None:
        sources = {"activations": count.source, "logits": NOT_TRACED, "param_copies": NOT_TRACED,
                   "backward_transient": NOT_TRACED}
    else:
        sources = {"activations": count.source + (f"; {count.fsdp_source}" if fsdp else ""),
                   "logits": f"{traced}: what the layers after the last block and the loss keep (a language model's "
                             f"final norm and the logits' log-probabilities; {mb.logits_detail})",
                   "param_copies": (f"none: {count.fsdp_source}" if fsdp else
                                    f"{traced}: autocast's 16-bit weights the backward reads (its cache is cleared "
                                    "when the forward's autocast region ends, the tensors saved for backward keep "
                                    "theirs)"),
                   "backward_transient": f"{traced}: the most the pass holds above what its forward ends with: in "
                                         "backward, the parameters' gradients apart (the loss's gradient, a recompute, "
                                         "activation gradients), or in the forward (the loss's fp32 upcast), the "
                                         "larger"}
    sources["optimizer_transient"] = (
        (environment.OPTIMIZER_TRANSIENT_BASIS.get(model.optimizer, "not counted") if model.environment else
         "the for-loop optimizer, torch's default on CPU ranks: one tensor's state at a time (torch/optim/adam.py "
         "_single_tensor_adam)") + "; at the optimizer step, when the activations are freed")
    if not model.environment:
        cpu = "none: CPU ranks (gloo), no CUDA context, NCCL or CUDA caching allocator"
        sources.update(cuda_context=cpu, driver_reserve=cpu, nccl_buffers=cpu, allocator=cpu, cublas_workspace=cpu)
        return sources
    sources["cublas_workspace"] = workspace_source
    sources.update(cuda_context=environment.CUDA_CONTEXT_BASIS, driver_reserve=environment.DRIVER_RESERVE_BASIS,
                   nccl_buffers=environment.NCCL_BASIS, allocator=environment.ALLOCATOR_BASIS
                   + ("" if mb is not None else "; its rounding not counted without the op trace"))
    return sources


def model_source(measured: bool) -> str:
    return "measured on the GPU (torch.cuda.memory_allocated after the forward)" if measured else "counted"


def _measured_memory(work: Workload) -> tuple[dict[str, Any], str] | None:
    """The bytes one GPU measured per phase, as the `holding.MemoryModel` fields they replace of
    the counted ones, and their basis: weights, gradients and optimizer state as bytes per
    parameter (so that sharding and DDP's buckets apply to them as to counted ones), the
    activations as measured; None without a measurement."""
    m = work.measured_memory
    if m is None or work.layout.params <= 0:
        return None
    n = work.layout.params

    def per(nbytes: int) -> float:
        return max(0.0, nbytes) / n

    # the measured activations hold the logits and autocast's copies: nothing of a count beside them
    fields = dict(param_bytes=per(m.params_bytes), grad_bytes=per(m.grads_bytes),
                  optimizer_state_bytes=per(m.optimizer_bytes), activations=max(0.0, m.activations_bytes),
                  micro_batch=None, fsdp_micro_batch=None)
    return fields, (f"measured on {m.device} (torch.cuda.memory_allocated before and after each phase of a timed "
                    f"step; its peak {m.peak_bytes / holding.GB:.1f} GB)")
