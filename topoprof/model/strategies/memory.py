"""Memory per GPU for each strategy from a job's inputs: the activations (given, counted from
the op trace, or by formula), the GPU's memory, and what a timed GPU measured, put to
`topoprof.model.memory.holding`'s counts.
"""
from __future__ import annotations

from typing import Any

from topoprof.errors import InputError
from topoprof.model.compute.timing import Compute
from topoprof.model.fsdp.plan import fsdp_plan
from topoprof.model.memory import holding
from topoprof.model.strategies.job import ModelInputs, Workload
from topoprof.model.strategies.results import Memory


def _activations(inputs: ModelInputs) -> tuple[float | None, str]:
    """Activation bytes per micro-batch on one GPU, and where the figure comes from."""
    from topoprof.model.workload.presets import PRESET_DEPTH

    work = inputs.workload
    if work.activation_memory_gb is not None:
        return work.activation_memory_gb * holding.GB, "given (--activation-memory)"
    traced = ((inputs.compute.modelled_detail or {}).get("memory") or {}).get("activations_bytes")
    if traced is not None:  # the model's own autograd graph, at the shape and dtypes priced
        shape = inputs.compute.modelled_detail.get("shape", "the traced shape")
        return traced, (f"counted from the op trace at {shape}: the tensors alive after its forward, "
                        "which the backward reads (autocast's weight copies not included)")
    layers = PRESET_DEPTH.get(work.layout.name)
    if layers and work.tokens_per_micro_batch:
        hidden = work.layout.tensors[0].shape[-1]  # the token embedding's width
        counted = holding.transformer_activations(layers, hidden, work.tokens_per_micro_batch,
                                                 inputs.compute.precision)
        return counted, (f"counted: 34 B x {work.tokens_per_micro_batch} tokens x {hidden} hidden x {layers} layers"
                         " (Korthikanti et al. 2022 Eq. 1, no stored attention scores)")
    return None, "unknown: give --activation-memory GB"


def _gpu_memory(comp: Compute) -> tuple[float | None, str]:
    from topoprof.model.compute.datasheet import gpu_memory_gb

    if comp.gpu_memory_gb is not None:
        return comp.gpu_memory_gb, comp.origin("gpu_memory_gb")
    found = gpu_memory_gb(comp.gpu) if comp.gpu else None
    return found if found else (None, "unknown: give --gpu NAME or --gpu-memory GB")


def memory_echo(inputs: ModelInputs) -> dict[str, tuple[Any, str]]:
    """The memory inputs (activations, the GPU's memory) as every input is echoed."""
    activations, act_source = _activations(inputs)
    return {"activation_memory_gb": (None if activations is None else activations / 1e9, act_source),
            "gpu_memory_gb": _gpu_memory(inputs.compute)}


def memory_by_strategy(inputs: ModelInputs, names) -> dict[str, Memory]:
    """Each strategy's memory per GPU, counted (topoprof.model.memory.holding), and whether it fits."""

    work, cl = inputs.workload, inputs.cluster
    activations, _ = _activations(inputs)
    capacity, _ = _gpu_memory(inputs.compute)
    model = holding.MemoryModel(
        work.layout.params, param_bytes=work.grad_bytes, grad_bytes=work.grad_bytes, optimizer=_optimizer_name(inputs.compute.optimizer),
        world_size=cl.world_size, gpus_per_node=cl.gpus_per_node,
        gradient_as_bucket_view=work.gradient_as_bucket_view,
        largest_group_params=largest_group_params(work.layout, work.fsdp_unit),
        fsdp_param_bytes=work.fsdp_bytes[0], fsdp_reduce_bytes=work.fsdp_bytes[1],
        activations=activations)
    measured, basis = _measured_memory(work, model), "counted"
    if measured is not None:
        model, basis = measured
    out = {}
    for name in names:
        held = holding.holding(name, model)
        if held is None:
            continue
        f = holding.fit(held, None if capacity is None else capacity * holding.GB)
        parts = {"params": held.params, "grads": held.grads, "optimizer": held.optimizer, "buckets": held.buckets,
                 "unsharded": held.unsharded, "activations": held.activations}
        out[name] = Memory({k: None if v is None else v / holding.GB for k, v in parts.items()},
                           held.total / holding.GB, basis, capacity, f.fits, f.reason)
    return out


def _measured_memory(work: Workload, counted):
    """`counted` with the bytes one GPU measured per phase in place of the counted ones: weights,
    gradients and optimizer state as bytes per parameter (so that sharding and DDP's buckets apply
    to them as to counted ones), the activations as measured; None without a measurement."""
    from dataclasses import replace as changed


    m = work.measured_memory
    if not m or work.layout.params <= 0:
        return None
    n = work.layout.params
    per = lambda key: max(0.0, m[key]) / n  # noqa: E731
    model = changed(counted, param_bytes=per("params_bytes"), grad_bytes=per("grads_bytes"),
                    optimizer_state_bytes=per("optimizer_bytes"), activations=max(0.0, m["activations_bytes"]))
    return model, (f"measured on {m['device']} (torch.cuda.memory_allocated before and after each phase of a "
                   f"timed step; its peak {m['peak_bytes'] / holding.GB:.1f} GB)")


def _optimizer_name(name: str) -> str:
    from topoprof.model.memory.holding import OPTIMIZER_STATES

    return name if name in OPTIMIZER_STATES else "adamw"


def largest_group_params(layout, unit: str | None = None) -> int:
    """The largest FSDP group's parameters (`fsdp_plan`: one group per block, the rest in
    the root group); the whole model where no block is found."""
    try:
        return max(g.numel for g in fsdp_plan(layout, unit).groups)
    except InputError:
        return layout.params
