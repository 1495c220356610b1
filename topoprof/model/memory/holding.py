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
- activations: on a --gpu what-if, counted from the op trace (`topoprof/trace/op_trace.py`, `LiveBytes`:
  the tensors the forward allocated and the backward reads, in autocast's dtypes, less autocast's
  weight copies); without a trace, for the transformer presets, Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models" (2022), Eq. 1: s·b·h·(34 + 5·a·s/h) bytes per layer
  in 16-bit; PyTorch's scaled_dot_product_attention (flash or memory-efficient kernels) stores no
  a·s·s score matrix, so the 5·a·s/h term is left out, and an fp32 step stores twice the bytes.
  Given (`--activation-memory`) beats both; with none of them unknown: then `fits` says whether
  the states alone fit. From the trace also (`topoprof.model.memory.traced`): the logits and the
  loss, autocast's weight copies held for backward, the backward's transient above its start, the
  allocator's rounding; under FSDP with a 16-bit param_dtype the count of a pass with the weights
  cast (no autocast copies: the unsharded groups are the 16-bit weights);
- cuBLAS's workspace, one per thread that runs matmuls, allocated at the first and held for the
  process's life (`environment.cublas_workspace`): there throughout, as the weights are;
- the optimizer step's transient and what the process holds besides tensors (CUDA context, the
  driver's reserve, NCCL's buffers, the allocator's stranded blocks): `environment`.

The parts never coexist all at once: the peak is the one the step reaches (`peak`), followed over
the op trace's timeline (`topoprof.model.memory.timeline`). The weights, the optimizer state and
DDP's buckets are there throughout; FSDP's unsharded groups in the forward and backward. Then, of
the K micro-batches of an optimizer step:
- the first after `zero_grad(set_to_none=True)` (torch's default) starts with no gradient: at each
  point of its pass it holds what the pass holds there (the gradients it has written among it) and
  the gradients written before that point; under FSDP those are the reduce-scattered shards, and
  what a group writes unsharded is its working set's;
- each later one (and every one with `set_to_none=False`) holds the full gradients from its
  start, and its fresh gradients are temporaries added into them: the full gradients and, at each
  point, what the pass holds besides the gradients written so far;
- the optimizer step holds the weights, the gradients, the optimizer state, DDP's buckets and its
  transient; the micro-batch's tensors are freed by then.
Without a timeline (no trace: activations given or by formula) the count cannot follow the step
and adds its parts: a bound above the peak, and said so. What the caching allocator reserves
above the peak and the environment's ranges give the total as a range, and `fit` says fits (its
top fits), does not fit (its bottom does not) or may not fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from topoprof.model.memory import environment as env
from topoprof.model.memory.timeline import Timeline, where
from topoprof.model.memory.traced import MicroBatchBytes
from topoprof.workload.checkpointing import Checkpointing
from topoprof.workload.layout import Layout

GB = 1e9

# Optimizer state per parameter, in units of the parameter's own bytes (module docstring).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd_momentum": 1, "sgd": 0}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Korthikanti et al. 2022, Eq. 1: 34 bytes per token per hidden unit per layer in 16-bit.
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34


@dataclass(frozen=True)
class Peak:
    """Where the step's allocated peak falls and what it holds there, by part (bytes)."""

    bytes: float
    phase: str                 # "forward", "backward", "optimizer step"
    micro_batch: int           # 1..K; K at the optimizer step
    where: str = ""            # the segment of the pass (`timeline.where`)
    op: str = ""               # the op that reached it
    parts: tuple[tuple[str, float], ...] = ()
    followed: bool = True      # False: no timeline, the parts added (a bound)

    def text(self, accumulation: int) -> str:
        """'backward of micro-batch 2 of 4, block 12 of 12, at aten.mm'."""
        if self.phase == "optimizer step":
            return "the optimizer step"
        if not self.followed:
            return self.where
        of = f" of {accumulation}" if accumulation > 1 else ""
        at = f", at {self.op.replace('aten.', '').removesuffix('.default')}" if self.op else ""
        return f"{self.phase} of micro-batch {self.micro_batch}{of}, {self.where}{at}"


@dataclass(frozen=True)
class Holding:
    """What one GPU holds for one strategy, in bytes; `activations` None when unknown.
    `environment`: (part, low, high) bytes besides the tensors (module docstring). `timeline`:
    the micro-batch's pass, point by point, where a trace followed it; `accumulation` micro-batches
    per optimizer step; `set_to_none`: `zero_grad(set_to_none=True)` before the first;
    `sharded_grads`: FSDP's, its unsharded gradients in `unsharded`."""

    params: float
    grads: float
    optimizer: float
    buckets: float = 0.0
    unsharded: float = 0.0
    activations: float | None = None
    logits: float = 0.0
    param_copies: float = 0.0
    backward_transient: float = 0.0
    optimizer_transient: float = 0.0
    workspace: float = 0.0
    environment: tuple[tuple[str, float, float], ...] = ()
    timeline: Timeline | None = None
    accumulation: int = 1
    set_to_none: bool = True
    sharded_grads: bool = False

    @property
    def states(self) -> float:
        return self.params + self.grads + self.optimizer + self.buckets + self.unsharded

    @cached_property  # read by every figure of the row: the timeline walked once
    def peak(self) -> Peak:
        """The most the step holds at once, and where (module docstring)."""
        always = (("params", self.params), ("optimizer", self.optimizer), ("buckets", self.buckets),
                  ("workspace", self.workspace))
        k = self.accumulation
        best = Peak(sum(v for _, v in always) + self.grads + self.optimizer_transient,
                    "optimizer step", k, parts=(*always, ("grads", self.grads),
                                                ("optimizer step's transient", self.optimizer_transient)))
        if self.timeline is None:
            bound = (self.states + self.workspace + (self.activations or 0.0) + self.logits + self.param_copies
                     + self.backward_transient)
            said = ("the sum of its parts (no op trace to follow the step by: a bound above its peak)"
                    if self.activations is not None else "its states alone (the activations unknown)")
            summed = Peak(bound, "backward", 1, said, followed=False, parts=(
                *always, ("grads", self.grads), ("unsharded", self.unsharded), ("activations", self.activations or 0.0),
                ("logits", self.logits), ("autocast copies", self.param_copies),
                ("backward transient", self.backward_transient)))
            return summed if summed.bytes > best.bytes else best
        fixed = sum(v for _, v in always) + self.unsharded
        line = self.timeline
        first = 1 if self.set_to_none else 0           # micro-batches that start without gradients
        for p in line.points:
            if first:
                written = self.grads * line.grads_share(p)
                held, op = (p.fresh, p.fresh_op) if self.sharded_grads else (p.live, p.op)
                best = self._higher(best, Peak(fixed + written + held, p.phase, 1, where(p, line.blocks), op, (
                    *always, ("unsharded", self.unsharded), ("grads written before", written), ("micro-batch", held))))
            if k > first:
                best = self._higher(best, Peak(fixed + self.grads + p.fresh, p.phase, first + 1, where(p, line.blocks),
                                               p.fresh_op, (*always, ("unsharded", self.unsharded),
                                                            ("grads", self.grads), ("micro-batch", p.fresh))))
        return best

    @staticmethod
    def _higher(a: Peak, b: Peak) -> Peak:
        return b if b.bytes > a.bytes else a

    @property
    def allocated(self) -> float:
        return self.peak.bytes

    @property
    def reserved_range(self) -> tuple[float, float]:
        """The peak and what the caching allocator reserves above it (its rounding and the split
        blocks it cannot hand out: the environment's `allocator` part)."""
        lo, hi = next(((lo, hi) for name, lo, hi in self.environment if name == "allocator"), (0.0, 0.0))
        return self.allocated + lo, self.allocated + hi

    @property
    def total_range(self) -> tuple[float, float]:
        return (self.allocated + sum(lo for _, lo, _ in self.environment),
                self.allocated + sum(hi for _, _, hi in self.environment))

    @property
    def total(self) -> float:
        """The top of the range: what must be free for it to fit whatever the environment takes."""
        return self.total_range[1]


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
    # the rest of a micro-batch (`traced.MicroBatchBytes`; activations above), and the same under
    # FSDP's 16-bit param_dtype where a pass counted it (None: as the others)
    micro_batch: MicroBatchBytes | None = None
    fsdp_micro_batch: MicroBatchBytes | None = None
    # the environment (`environment`): NCCL's rings, whether it is counted at all (False: the
    # states and the micro-batch alone, as before a count of the environment)
    rings: int = 1
    environment: bool = True
    # where the optimizer runs its for-loop implementation (torch's default off CUDA: CPU ranks),
    # the parameters' numels in the optimizer's order (its transient, `environment.single_tensor_
    # transient`); empty: foreach, one list of the parameters' size
    single_tensor_optimizer_numels: tuple[int, ...] = ()
    # micro-batches per optimizer step, and whether zero_grad sets the gradients to None (torch's default)
    accumulation: int = 1
    set_to_none: bool = True
    workspace: float = 0.0  # cuBLAS's, on a GPU (`environment.cublas_workspace`)
    extra: tuple[tuple[str, float, float], ...] = field(default=())


def _states(m: MemoryModel, shards: int, micro_batch: MicroBatchBytes | None) -> Holding:
    """Weights, gradients and optimizer state, each split over `shards` GPUs; what a micro-batch
    holds beside them; the optimizer step's transient on this GPU's share."""
    per_param = (m.optimizer_state_bytes if m.optimizer_state_bytes is not None
                 else OPTIMIZER_STATES[m.optimizer] * m.param_bytes)
    optimizer = per_param * m.params
    mb = micro_batch or MicroBatchBytes(0.0)
    activations = m.activations if micro_batch is None or m.activations is None else micro_batch.activations
    if m.single_tensor_optimizer_numels:
        transient = m.param_bytes * env.single_tensor_transient(m.optimizer, m.single_tensor_optimizer_numels)
    else:
        transient = env.OPTIMIZER_TRANSIENT_LISTS.get(m.optimizer, 0) * m.param_bytes * m.params / shards
    return Holding(m.param_bytes * m.params / shards, m.grad_bytes * m.params / shards, optimizer / shards,
                   activations=activations, logits=mb.logits, param_copies=mb.param_copies,
                   backward_transient=mb.backward_transient, optimizer_transient=transient, workspace=m.workspace,
                   timeline=mb.timeline,
                   accumulation=m.accumulation, set_to_none=m.set_to_none)


def _environment(strategy: str, m: MemoryModel, held: Holding, rounding: float) -> tuple:
    """(part, low, high) bytes besides the tensors (`environment`), for `held`."""
    if not m.environment:
        return ()
    comms = env.communicators(strategy, m.world_size)
    nccl_low, nccl_high = env.nccl_bytes(m.rings)
    stranded = [share * held.allocated for share in env.FRAGMENTATION_SHARE]
    return (("cuda_context", *map(float, env.CUDA_CONTEXT_BYTES)),
            ("driver_reserve", float(env.DRIVER_RESERVE_BYTES), float(env.DRIVER_RESERVE_BYTES)),
            ("nccl_buffers", comms * nccl_low, comms * nccl_high),
            ("allocator", rounding + stranded[0], rounding + stranded[1]), *m.extra)


def holding(strategy: str, m: MemoryModel) -> Holding | None:
    """What one GPU holds under `strategy` (the strategies of topoprof.model.strategies); None for
    a strategy whose memory this module does not count."""
    held = _tensors(strategy, m)
    if held is None:
        return None
    mb = _micro_batch_of(strategy, m)
    return replace(held, environment=_environment(strategy, m, held, mb.rounding if mb else 0.0))


def _micro_batch_of(strategy: str, m: MemoryModel) -> MicroBatchBytes | None:
    if strategy.startswith(("fsdp_", "hsdp")) and m.fsdp_micro_batch is not None:
        return m.fsdp_micro_batch
    return m.micro_batch


def _tensors(strategy: str, m: MemoryModel) -> Holding | None:
    if strategy in ("single", "dp") or strategy.startswith("ddp_"):
        states = _states(m, 1, m.micro_batch)
        if strategy.startswith("ddp_") and not m.gradient_as_bucket_view:
            states = replace(states, buckets=m.grad_bytes * m.params)
        elif strategy.startswith("ddp_"):  # the gradients are views into the buckets, allocated for the
            states = replace(states, set_to_none=False)  # whole job: zero_grad frees nothing
        return states
    if not strategy.startswith(("fsdp_", "hsdp")):
        return None
    shards = m.gpus_per_node if strategy.startswith("hsdp") else m.world_size
    states = replace(_states(m, shards, _micro_batch_of(strategy, m)), sharded_grads=True)
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


# Korthikanti et al. 2022 §4: full recomputation keeps each layer's input, 2 bytes per token per
# hidden unit in 16-bit.
CHECKPOINTED_BYTES_PER_TOKEN_HIDDEN = 2


def checkpointed_activations(layers: int, hidden: int, tokens: int, precision: str) -> float:
    """What `layers` checkpointed layers keep: their inputs (Korthikanti et al. 2022 §4)."""
    scale = 2 if precision == "fp32" else 1
    return scale * CHECKPOINTED_BYTES_PER_TOKEN_HIDDEN * tokens * hidden * layers


def formula_activations(layers: int | None, layout: Layout, tokens: int | None, precision: str,
                        ac: Checkpointing) -> tuple[float | None, str]:
    """A transformer preset's activations per micro-batch by Korthikanti et al. 2022 (Eq. 1 per
    layer without checkpointing, the layer's input for a checkpointed one, §4's full
    recomputation), and how they were counted; None, with why, where the formula does not know
    the model (`layers`, its depth, None) or the mode."""
    if not (layers and tokens):
        return None, "unknown: give --activation-memory GB"
    if ac.mode == "op":
        return None, ("unknown: torchtitan's op policy is counted from the op trace only (give --gpu NAME with "
                      "--tokens), or give --activation-memory GB")
    hidden = layout.tensors[0].shape[-1]  # the token embedding's width
    wrapped = layers if ac.mode == "full" else layers // ac.every if ac.mode == "layer" else 0
    counted = (transformer_activations(layers - wrapped, hidden, tokens, precision)
               + checkpointed_activations(wrapped, hidden, tokens, precision))
    how = (f"34 B x {tokens} tokens x {hidden} hidden x {layers} layers" if not wrapped else
           f"{layers - wrapped} layers x 34 B and {wrapped} checkpointed x 2 B (their input) x {tokens} tokens x "
           f"{hidden} hidden")
    return counted, (f"counted: {how} (Korthikanti et al. 2022 Eq. 1 and §4, no stored attention scores); the "
                     "logits, autocast's copies and the backward's transient not counted without the op trace")


@dataclass(frozen=True)
class Fit:
    fits: bool | None
    reason: str | None


def fit(h: Holding, gpu_memory_bytes: float | None) -> Fit:
    """Whether `h` fits on a GPU of that memory; None when the memory is unknown or when only the
    top of its range does not fit (`reason` says "may not fit"). With unknown activations,
    whether the states alone fit (and the reason says so)."""
    if gpu_memory_bytes is None:
        return Fit(None, "GPU memory unknown (give --gpu NAME or --gpu-memory GB)")
    cap = f"{gpu_memory_bytes / GB:.1f} GB"
    if h.activations is None:
        need = h.states
        if need > gpu_memory_bytes:
            return Fit(False, f"does not fit: its weights, gradients and optimizer state alone need {need / GB:.1f} GB "
                              f"of {cap} ({_arithmetic(h)})")
        return Fit(True, f"its states take {need / GB:.1f} GB of {cap}; activations unknown "
                         "(give --activation-memory GB)")
    low, high = h.total_range
    if low > gpu_memory_bytes:
        return Fit(False, f"does not fit: needs {_span(low, high)} GB of {cap} ({_arithmetic(h)})")
    if high > gpu_memory_bytes:
        return Fit(None, f"may not fit: needs {_span(low, high)} GB of {cap}, over it at the top of the "
                         f"environment's range ({_arithmetic(h)})")
    return Fit(True, None)


def _span(low: float, high: float) -> str:
    return f"{low / GB:.1f}" if f"{low / GB:.1f}" == f"{high / GB:.1f}" else f"{low / GB:.1f}-{high / GB:.1f}"


def parts(h: Holding) -> dict[str, float | None]:
    """Every part by name, in bytes (the environment's at the top of its range); `optimizer_transient`
    only counts at the optimizer step, the rest of a micro-batch only at the backward's peak."""
    out = {"params": h.params, "grads": h.grads, "optimizer": h.optimizer, "buckets": h.buckets,
           "unsharded": h.unsharded, "activations": h.activations, "logits": h.logits,
           "param_copies": h.param_copies, "backward_transient": h.backward_transient,
           "optimizer_transient": h.optimizer_transient, "cublas_workspace": h.workspace}
    return {**out, **{name: high for name, _, high in h.environment}}


def _arithmetic(h: Holding) -> str:
    """What the peak holds where it falls, and the environment: 'params 1.2 + ... at the optimizer step + ...'."""
    peak = h.peak
    text = " + ".join(f"{name} {value / GB:.1f}" for name, value in peak.parts if value)
    rest = " + ".join(f"{name.replace('_', ' ')} {_span(lo, hi)}" for name, lo, hi in h.environment if hi)
    return f"{text} at {peak.text(h.accumulation)}" + (f" + {rest}" if rest else "")
