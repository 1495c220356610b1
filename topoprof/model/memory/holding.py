"""Memory per GPU for each strategy: what it holds, part by part, and whether that fits.

Counted, and labelled counted, unless a GPU measured it. Bytes per parameter:
- parameters: 4 B (fp32 weights, as torch.autocast trains) or 2 B (a model cast to bf16/fp16);
- gradients: `grad_bytes` (the parameters' dtype);
- optimizer: AdamW/Adam keep exp_avg and exp_avg_sq in the parameter's dtype (torch/optim/adamw.py
  `_init_group`: `torch.zeros_like(p, memory_format=torch.preserve_format)`), SGD with momentum
  one momentum_buffer (torch/optim/sgd.py), plain SGD none. With fp32 parameters AdamW is 4 + 4 +
  8 = 16 B per parameter before any activation: the same 16 B as the 2 + 2 + 12 of mixed-precision
  Adam in Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models" (SC'20, §3.1), held in other dtypes;
- DDP's buckets: one flat buffer per bucket, as large as the gradients (reducer.cpp
  `initialize_buckets` allocates `bucket.gradients` of each bucket's numel in the gradients'
  dtype); none with gradient_as_bucket_view, where the gradients are views into them;
- FSDP2 (torch/distributed/fsdp/_fully_shard/): parameters, gradients and optimizer state sharded
  over the shard group; while a group runs, its parameters unsharded in `param_dtype`, and the next
  group's too (all-gathered one ahead, `_fsdp_state.py` prefetching), and its unsharded gradients
  in `reduce_dtype` until they are reduce-scattered. Without resharding after forward
  (`reshard_after_forward=False`) every group stays unsharded from its forward to its backward.
  With `set_requires_gradient_sync(False)` every group keeps its unsharded gradient until the
  micro-batch that syncs: full-size gradients, as DDP holds.
- activations: on a --gpu what-if, counted from the op trace (`probes/op_trace.py`, `LiveBytes`:
  the tensors the forward allocated and the backward reads, in autocast's dtypes, less autocast's
  weight copies); without a trace, for the transformer presets, Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models" (2022), Eq. 1: s·b·h·(34 + 5·a·s/h) bytes per layer
  in 16-bit; PyTorch's scaled_dot_product_attention (flash or memory-efficient kernels) stores no
  a·s·s score matrix, so the 5·a·s/h term is left out, and an fp32 step stores twice the bytes.
  Given (`--activation-memory`) beats both; with none of them unknown: then `fits` says whether
  the states alone fit.
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9

# Optimizer state per parameter, in units of the parameter's own bytes (module docstring).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd_momentum": 1, "sgd": 0}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Korthikanti et al. 2022, Eq. 1: 34 bytes per token per hidden unit per layer in 16-bit.
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34


@dataclass(frozen=True)
class Holding:
    """What one GPU holds for one strategy, in bytes; `activations` None when unknown."""

    params: float
    grads: float
    optimizer: float
    buckets: float = 0.0
    unsharded: float = 0.0
    activations: float | None = None

    @property
    def states(self) -> float:
        return self.params + self.grads + self.optimizer + self.buckets + self.unsharded

    @property
    def total(self) -> float:
        return self.states + (self.activations or 0.0)


@dataclass(frozen=True)
class MemoryModel:
    """Everything the count needs about the model and the job."""

    params: int
    param_bytes: float = 4
    grad_bytes: float = 4
    optimizer: str = "adamw"
    world_size: int = 1
    gpus_per_node: int = 1
    gradient_as_bucket_view: bool = False
    largest_group_params: int = 0     # FSDP: the largest group's parameters
    fsdp_param_bytes: int = 4         # MixedPrecisionPolicy.param_dtype (default: the parameters' own)
    fsdp_reduce_bytes: int = 4        # MixedPrecisionPolicy.reduce_dtype (default: param_dtype's)
    activations: float | None = None  # bytes per micro-batch, when known
    # bytes of optimizer state per parameter where a GPU measured them; None: by `optimizer`
    optimizer_state_bytes: float | None = None


def _states(m: MemoryModel, shards: int) -> Holding:
    """Weights, gradients and optimizer state, each split over `shards` GPUs."""
    per_param = (m.optimizer_state_bytes if m.optimizer_state_bytes is not None
                 else OPTIMIZER_STATES[m.optimizer] * m.param_bytes)
    optimizer = per_param * m.params
    return Holding(m.param_bytes * m.params / shards, m.grad_bytes * m.params / shards, optimizer / shards,
                   activations=m.activations)


def holding(strategy: str, m: MemoryModel) -> Holding | None:
    """What one GPU holds under `strategy` (the strategies of topoprof.model.strategies); None for
    a strategy whose memory this module does not count."""
    from dataclasses import replace

    if strategy in ("single", "dp") or strategy.startswith("ddp_"):
        states = _states(m, 1)
        if strategy.startswith("ddp_") and not m.gradient_as_bucket_view:
            states = replace(states, buckets=m.grad_bytes * m.params)
        return states
    if not strategy.startswith(("fsdp_", "hsdp")):
        return None
    shards = m.gpus_per_node if strategy.startswith("hsdp") else m.world_size
    states = _states(m, shards)
    group = m.largest_group_params
    if "shard_grad_op" in strategy:  # every group unsharded from its forward to its backward
        working = m.fsdp_param_bytes * m.params + m.fsdp_reduce_bytes * group
    else:  # the running group and the one prefetched, and the running group's gradient
        working = 2 * m.fsdp_param_bytes * group + m.fsdp_reduce_bytes * group
    if strategy.endswith("_no_sync"):  # every group's unsharded gradient, until the sync
        working += m.fsdp_reduce_bytes * (m.params - group)
    return replace(states, unsharded=working)


def transformer_activations(layers: int, hidden: int, tokens: int, precision: str) -> float:
    """Korthikanti et al. 2022 Eq. 1 without the attention-score term (module docstring)."""
    scale = 2 if precision == "fp32" else 1
    return scale * ACTIVATION_BYTES_PER_TOKEN_HIDDEN * tokens * hidden * layers


@dataclass(frozen=True)
class Fit:
    fits: bool | None
    reason: str | None


def fit(h: Holding, gpu_memory_bytes: float | None) -> Fit:
    """Whether `h` fits on a GPU of that memory; None when the memory is unknown. With unknown
    activations, whether the states alone fit (and the reason says so)."""
    if gpu_memory_bytes is None:
        return Fit(None, "GPU memory unknown (give --gpu NAME or --gpu-memory GB)")
    need, states_only = (h.total, False) if h.activations is not None else (h.states, True)
    what = "its weights, gradients and optimizer state alone need" if states_only else "needs"
    if need > gpu_memory_bytes:
        return Fit(False, f"does not fit: {what} {need / GB:.1f} GB of {gpu_memory_bytes / GB:.1f} GB "
                          f"({_arithmetic(h)})")
    if states_only:
        return Fit(True, f"its states take {need / GB:.1f} GB of {gpu_memory_bytes / GB:.1f} GB; activations unknown "
                         "(give --activation-memory GB)")
    return Fit(True, None)


def _arithmetic(h: Holding) -> str:
    parts = [("params", h.params), ("grads", h.grads), ("optimizer", h.optimizer), ("buckets", h.buckets),
             ("unsharded", h.unsharded), ("activations", h.activations)]
    return " + ".join(f"{name} {value / GB:.1f}" for name, value in parts if value)
