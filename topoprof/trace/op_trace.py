"""One forward and backward of a model on the meta device, op by op: what each aten op computes
and moves, and the backward FLOPs done before each trainable gradient is ready, as a `TracedPass`
(topoprof/specs/traced_pass.py).

Meta tensors carry shapes and dtypes but no data, so the pass costs no compute and no memory,
whatever the model's size and wherever it runs: its result does not depend on the machine. The
same pass gives

- every aten op the dispatcher runs, in order, with its phase ("forward": the forward and the
  loss; "backward"), its FLOPs by the rules of `torch.utils.flop_counter` and the bytes it reads
  (its input tensors' sizes) and writes (its outputs' sizes): the op trace a roofline compute
  model reads;
- the gradient-ready order by FLOPs: a post-accumulate-grad hook per trainable parameter (where
  DDP's reducer hook fires, see `probes/ranks/model_timing.py`) records the backward FLOPs counted so
  far; that over the backward's total is the share of backward done when the gradient is ready,
  in the format of the timed record's "ready".

FLOPs are counted as `FlopCounterMode` counts them (torch/utils/flop_counter.py,
`_FlopCounterMode.__torch_dispatch__`): an op first tries `func.decompose` (a CompositeImplicit
op becomes the ops it is made of, each counted), else it runs and its overload packet's formula
in `flop_registry` gives its FLOPs (matmuls, convolutions, attention); ops without a formula
count 0, as there.

Bytes: views and aliases (`OpOverload.is_view`: the schema returns an alias of an input and
writes none, torch/_ops.py; and `_unsafe_view`, a view the schema does not mark) stay in the
trace with 0 bytes, since they move no data; `empty*` allocations write nothing. Read bytes
count each tensor argument's numel x element size: an expanded (stride-0) input counts at its
expanded size, an upper bound on what the kernel fetches. The trace runs in each tensor's own
dtype: autocast has no meta backend, so a bf16 run's bytes are not what this counts.

The device the trace stands for (`target`, a `TraceTarget`: CUDA or a CPU, at a precision) decides
the attention kernel and, on CUDA in 16-bit, autocast's casts (`topoprof/trace/target_lens.py`).
Where a 16-bit pass fails (a composite the policy by name does not reach), the pass runs again in
fp32 and says why (`autocast_failure`): its FLOPs still order the
gradients; its bytes are not a 16-bit step's.
Each op with FLOPs also records its inputs' shapes (a matmul's dimensions, for its efficiency
by shape), an attention op whether it is causal, and every non-view op its outputs' sizes and
whether it writes in place (a fresh allocation's pages cost a CPU extra, `topoprof.model.compute.roofline`),
and the storages it reads and writes (`reads`, `writes`: [key, bytes], a key per storage for as
long as it lives), which tell a chain of ops whose intermediates never leave it (what
torch.compile fuses, `topoprof.model.compute.fusion`). The pass also counts the nodes of the
autograd graph its backward runs (`autograd_nodes`: each costs the engine's host time, whether
or not it launches a kernel; a view's backward launches none) and, among them, the parameters'
AccumulateGrad nodes (`autograd_leaves`).

Two FLOP rules differ from FlopCounterMode's, where it is wrong or silent: a grouped convolution's
weight gradient counts once, not `groups` times (its backward formula passes the transposed
input as the batch, so `conv_flop_count` multiplies all input channels by the whole grad
output: 2 x C_in x C_out x ..., where the weight gradient is 2 x C_in/groups x C_out x ...);
the CPU's fused attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward) counts
as the CUDA flash kernels' formulas do (the same attention, which `flop_registry` leaves out).

Activation checkpointing runs as torch runs it (`torch.utils.checkpoint`, reentrant or not, with
or without `create_selective_checkpoint_contexts`; `topoprof/zoo/checkpoint_wrap.py` applies the modes
the tool names, to a user's model through `topoprof/zoo/user_blocks.py`): the forward keeps what checkpointing keeps,
and the backward recomputes inside the engine. Recomputed ops stay in the backward phase (they take backward time, and
they come before the gradients they feed) and carry `recompute` set; `totals.recompute` sums them.

Memory (`memory`): `activations_bytes` is what stays in memory from the end of the forward to
the start of the backward, of what the pass itself allocated: autograd's saved tensors, the
outputs checkpointing keeps (its saved inputs; selective checkpointing's cache), and the loss;
each storage once, a view counted as the storage it looks at; not the parameters, not the
batch (both there before the forward and after the backward), and not autocast's copies of the
weights (`param_copies_bytes`: they scale with the parameters, not the batch). That is what a
memory plan adds per micro-batch; on a CPU it equals, within the loss, the bytes
`topoprof/trace/activation_bytes.py` hooks as saved for backward (`tests/test_activation_bytes.py`).
`peak_bytes` is the most the pass held at once, copies included.

The user's model is built under `torch.device("meta")` at the stated micro-batch and sequence
length when its callable takes `micro_batch` (or `batch_size`) / `seq_len` (as
`topoprof/zoo/preset_modules.py:build` does), else with its example batch as it is, or resized
along its first dimension to the stated micro-batch where the caller says at which it was built
(`resized`); a device its code names stays meta
(`topoprof/trace/meta_device.py`), and a module or batch it built on meta itself is used as it is. Nothing
of the model runs for real: `topoprof/measure/meta_trace.py` runs this pass alone in a worker, for a
model that is never to be timed on this machine. Anything that cannot run on meta (an op without a
meta kernel, `.item()` or a data-dependent shape) gives its `TraceFailure` instead of raising,
with the parameter list where the model was built: the caller then keeps the measured order, or
for a model it never times, the datasheet's range, and says why. A callable that is itself wrong
(its import, its return value, its loss) says so (`TraceFailure.users_to_fix`): that is the
user's to fix.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import sys
import weakref
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from topoprof.specs.messages import (
    USER_ERRORS,
    OpTraceJob,
    OpTraceResult,
    OpTracesResult,
    TraceFailure,
    TraceVariant,
)
from topoprof.specs.traced_pass import (
    AttentionChoices,
    KeptByPlace,
    KeptTensor,
    MemorySegment,
    PassMemory,
    TracedOp,
    TracedPass,
    TraceTarget,
    aggregate,
    totals,
)
from topoprof.trace.fused_kernels import FUSED_OPS
from topoprof.trace.live_bytes import LiveBytes
from topoprof.trace.meta_device import on_meta
from topoprof.trace.selective_cost import selective_checkpoint_cost
from topoprof.trace.target_lens import AUTOCAST_DTYPES, DEFAULT_CAPABILITY, TargetLens, check_target
from topoprof.zoo.checkpoint_wrap import children_of, selective_modules
from topoprof.zoo.hf_models import install_meta_patches
from topoprof.zoo.user_blocks import checkpoint_user_model, find_block_list, keep_first_blocks
from topoprof.zoo.user_callable import (
    UserModelError,
    batch_samples,
    call_user_callable,
    load_callable,
    parameter_list,
    resize_batch,
    to_device,
    user_loss,
)

aten = torch.ops.aten

# What a user's callable may take to build its model and batch at the stated shape; `batch_size`
# takes the stated micro-batch where the callable names it so.
SHAPE_KWARGS = ("micro_batch", "seq_len", "batch_size")
_STATED_AS = {"batch_size": "micro_batch"}

# A view the schema does not annotate as one (native_functions.yaml: `_unsafe_view(Tensor self,
# SymInt[] size) -> Tensor`); matmul reshapes its result with it, without a copy.
_UNMARKED_VIEWS = frozenset({aten._unsafe_view.default})
# Allocations whose contents are left undefined: nothing is written.
_UNINITIALIZED = frozenset({aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                            aten.new_empty.default, aten.new_empty_strided.default})


# The CPU's fused attention is the flash algorithm the CUDA formulas count (flop_registry has no
# entry for it); the shape wrappers take (query, key, value, ...) and (grad_out, query, key,
# value, ...), which its schemas begin with too.
_FLOP_ALIASES = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: flop_registry[aten._scaled_dot_product_flash_attention],
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
        flop_registry[aten._scaled_dot_product_flash_attention_backward],
}
_ATTENTION = frozenset({aten._scaled_dot_product_flash_attention.default,
                        aten._scaled_dot_product_cudnn_attention.default,
                        aten._scaled_dot_product_cudnn_attention_backward.default,
                        aten._scaled_dot_product_flash_attention_backward.default,
                        aten._scaled_dot_product_efficient_attention.default,
                        aten._scaled_dot_product_efficient_attention_backward.default,
                        aten._scaled_dot_product_flash_attention_for_cpu.default,
                        aten._scaled_dot_product_flash_attention_for_cpu_backward.default})


def _nbytes(values) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(values) if isinstance(t, torch.Tensor))


def _flops(func, args, kwargs, out) -> int:
    """FLOPs by flop_counter's formula for `func`, with its grouped-convolution weight gradient
    counted once (see the module docstring); 0 where no formula exists."""
    formula = _FLOP_ALIASES.get(func) or flop_registry.get(func._overloadpacket)
    if formula is None:
        return 0
    if func in _ATTENTION:
        args = _kv_at_query_heads(func, args)
    if func is aten.convolution_backward.default and args[9] > 1 and args[10][1]:
        groups, mask = args[9], list(args[10])
        rest = formula(*args[:10], [mask[0], False, mask[2]], *args[11:], **kwargs, out_val=out)
        weight = formula(*args[:10], [False, True, False], *args[11:], **kwargs, out_val=out)
        return int(rest + weight // groups)
    return int(formula(*args, **kwargs, out_val=out))


def _kv_at_query_heads(func, args: tuple) -> tuple:
    """Grouped-query attention's key and value given the query's heads, as the fused kernels
    broadcast them: the FLOPs are the query's heads'. torch 2.12 and later count them so
    (flop_counter.sdpa_flop_count); torch up to 2.11 asserts on fewer key/value heads than query
    heads. The formulas read shapes, so a shape stands in for each tensor."""
    q = 1 if func._schema.name.endswith("_backward") else 0  # backward: (grad_out, query, key, value, ...)
    query, key, value = args[q:q + 3]
    if key.shape[1] == query.shape[1]:
        return args
    b, heads = query.shape[:2]
    broadcast = [torch.Size((b, heads, *t.shape[2:])) for t in (key, value)]
    return (*args[:q + 1], *broadcast, *args[q + 3:])


def _is_parameter(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad


def _is_causal(func, args, kwargs) -> bool:
    """The is_causal argument of a fused attention op (forward or backward)."""
    schema = func._schema
    for i, arg in enumerate(schema.arguments):
        if arg.name == "is_causal":
            return bool(kwargs["is_causal"] if "is_causal" in kwargs else args[i] if i < len(args) else False)
    return False


def _recomputing() -> bool:
    """Whether an op in backward is activation checkpointing's recompute: the autograd engine runs
    backward nodes with grad mode off (a backward that builds no graph), and checkpointing runs
    its recompute inside the engine with grad mode on (torch/utils/checkpoint.py: `enable_grad`
    in CheckpointFunction.backward and in the non-reentrant unpack hook). The gradient seed
    `backward()` makes before the engine starts is not one (no graph task yet)."""
    return torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1


class StorageKeys:
    """A small integer per storage, the same for as long as the storage lives (a view shares its
    base's): a weak reference tells a live storage from a new one that got a freed one's id()."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple[weakref.ref, int]] = {}
        self._next = 0

    def key(self, t) -> int | None:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without a storage (a subclass)
            return None
        held = self._keys.get(id(storage))
        if held is not None and held[0]() is storage:
            return held[1]
        self._next += 1
        self._keys[id(storage)] = (weakref.ref(storage), self._next)
        return self._next

    def touched(self, values) -> list[list[int]]:
        """[key, bytes] of each storage among `values`' tensors, once each (the most bytes read of it)."""
        out: dict[int, int] = {}
        for t in tree_leaves(values):
            if isinstance(t, torch.Tensor):
                key = self.key(t)
                if key is not None:
                    out[key] = max(out.get(key, 0), t.numel() * t.element_size())
        return [[k, b] for k, b in out.items()]


def autograd_nodes(root) -> tuple[int, int]:
    """(nodes, leaves) of the autograd graph below `root` (a grad_fn): what the engine runs in
    backward, views' included; leaves: its AccumulateGrad nodes, one per parameter it reaches."""
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(nxt for nxt, _ in node.next_functions)
    return len(seen), sum(1 for node in seen if type(node).__name__ == "AccumulateGrad")


def _has_kernel(func) -> bool:
    """Whether `func` runs as its own kernel on a device, though it decomposes too (a
    CompositeImplicitAutograd form beside a backend kernel, as `silu_backward`'s `math_silu_backward`
    beside its structured kernel in native_functions.yaml): its FLOPs are its parts', its memory
    its outputs' alone, without the parts' temporaries. Read from the CPU's registration: a CPU
    build registers no CUDA kernel, and native_functions.yaml gives such ops both."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CPU")


class OpTracer(TorchDispatchMode):
    """Records each aten op with its phase, FLOPs and bytes; `phase` is set by the caller. With
    the target's lens, each op first lets the lens drop casts whose autocast region has ended."""

    def __init__(self, lens: TargetLens | None = None) -> None:
        super().__init__()
        self.phase = "forward"
        self.ops: list[TracedOp] = []
        self.flops = {"forward": 0, "backward": 0}
        self.memory = LiveBytes()
        self.lens = lens
        self.storages = StorageKeys()
        self.selective = 0  # depth of the modules `op` mode checkpoints now running (`_selective_marks`)
        self._inside_kernel = 0  # decomposing an op that runs as one kernel on the target (`_has_kernel`)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.lens is not None:
            self.lens.leave_ended_region()
        # As FlopCounterMode does: decompose what can be, so that its parts are what is counted; not
        # a fused kernel the lens ran for the target (`fused_kernels`): it is that one kernel
        if func is not torch.ops.prim.device.default and func not in FUSED_OPS:
            kernel = self.lens is not None and _has_kernel(func)
            self._inside_kernel += kernel
            try:
                with self:
                    decomposed = func.decompose(*args, **kwargs)
            finally:
                self._inside_kernel -= kernel
            if decomposed is not NotImplemented:
                if kernel and not self._inside_kernel:  # its kernel allocates its outputs alone
                    self.memory.allocated(decomposed, written=(args, kwargs) if func._schema.is_mutable else (),
                                          op_index=len(self.ops), op=str(func))
                return decomposed
        out = func(*args, **kwargs)
        flops = _flops(func, args, kwargs, out)
        view = func.is_view or func in _UNMARKED_VIEWS
        name, recompute, inplace = str(func), self.phase == "backward" and _recomputing(), func._schema.is_mutable
        op = TracedOp(
            name, self.phase, flops, view, bytes_read=0 if view else _nbytes((args, kwargs)),
            bytes_written=0 if view or func in _UNINITIALIZED else _nbytes(out),
            shapes=[list(t.shape) for t in tree_leaves(args) if isinstance(t, torch.Tensor)] if flops else None,
            causal=_is_causal(func, args, kwargs) if func in _ATTENTION else None, recompute=recompute,
            selective=bool(self.selective) and (self.phase == "forward" or recompute),
            **({} if view else {
                "outputs": [t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor)],
                "inplace": inplace, "reads": self.storages.touched((args, kwargs)),
                "writes": [] if func in _UNINITIALIZED and not inplace else self.storages.touched(out)}))
        if not view and not self._inside_kernel:
            self.memory.allocated(out, param_copy=func is aten._to_copy.default and _is_parameter(args[0]),
                                  written=(args, kwargs) if inplace else (), op_index=len(self.ops), op=name)
        self.ops.append(op)
        self.flops[self.phase] += flops
        return out


def backward_with_modes_on(loss) -> None:
    """`loss.backward()`, with the torch function modes now on (the target's lens, the meta
    device's) still on in the engine, for checkpointing's recompute, which must build, cast and
    attend as the forward did. `Tensor.backward` and `torch.autograd.backward` are torch functions:
    each hands itself to the innermost mode first, and a mode is off while its own handler runs,
    so either would start the engine without it. The engine is started here as
    `torch.autograd.backward` starts it (torch/autograd/__init__.py: a seed of ones, then
    `_engine_run_backward`), past that hand-off."""
    seed = torch.ones_like(loss)
    torch.autograd.graph._engine_run_backward((loss,), (seed,), False, False, (),
                                              allow_unreachable=True, accumulate_grad=True)


def _block_marks(module, blocks: list[str] | None, tracer: OpTracer):
    """Hooks that note, per block (qualified names, in forward order), the forward ops it ran:
    [first op, end) in the trace; a recompute in backward is not its forward. Each block's forward
    is a segment of the pass's memory (`LiveBytes.enter`), the ops after the last one another.
    (marks, handles)."""
    marks: dict[str, list[int]] = {}
    handles = []
    for index, name in enumerate(blocks or ()):
        block = module.get_submodule(name)

        def before(_m, _args, name=name, index=index):
            if tracer.phase == "forward" and name not in marks:
                marks[name] = [len(tracer.ops), len(tracer.ops)]
                tracer.memory.enter(("forward", "block", index))

        def after(_m, _args, _out, name=name, index=index):
            if tracer.phase == "forward" and name in marks:
                marks[name][1] = len(tracer.ops)
                if index == len(blocks) - 1:
                    tracer.memory.enter(("forward", "after", None))

        handles += [block.register_forward_pre_hook(before), block.register_forward_hook(after)]
    return marks, handles


def _selective_marks(module, tracer: OpTracer) -> list:
    """Hooks that mark the ops of the modules `op` mode checkpoints (`selective_modules`), in their
    forward and in their recompute: the ops its policy's modes see (`topoprof/trace/selective_cost.py`).
    A recompute stops once it has what the backward needs (torch/utils/checkpoint.py,
    `_StopRecomputationError`), before its module's forward hook: in the backward, the count only
    says that such a module's recompute has begun, and its recompute ops are the ones marked."""
    def enter(_m, _args):
        tracer.selective += 1

    def leave(_m, _args, _out):
        tracer.selective -= 1

    handles = []
    for inner in selective_modules(module):
        handles += [inner.register_forward_pre_hook(enter), inner.register_forward_hook(leave)]
    return handles


def _memory(tracer: OpTracer, activations: int, param_copies: int, kept: KeptByPlace | None) -> PassMemory:
    """The pass's memory (module docstring), after its backward; what stays for the backward
    (`activations`, `param_copies`, `kept`) as its forward ended."""
    m = tracer.memory
    return PassMemory(activations, param_copies, kept, peak_bytes=m.peak, rounded_peak_bytes=m.rounded_peak,
                      forward_peak_bytes=m.forward_peak, forward_transient_bytes=m.forward_peak - m.backward_start,
                      backward_start_bytes=m.backward_start, backward_peak_bytes=m.backward_peak,
                      backward_transient_bytes=m.backward_peak - m.backward_start, grads_bytes=m.grads,
                      segments=[MemorySegment(**row) for row in m.segments.values()])


def _kept(tracer: OpTracer, marks: dict, blocks: list[str] | None) -> KeptByPlace | None:
    """What the forward keeps by where it was allocated, where every block was marked."""
    if not blocks or len(marks) != len(blocks):
        return None
    kept = tracer.memory.kept([tuple(marks[b]) for b in blocks])
    return KeptByPlace(len(marks), kept["before_blocks_bytes"], kept["blocks_bytes"], kept["after_blocks_bytes"],
                       [KeptTensor(**row) for row in kept["after_blocks_tensors"]])


def _block_of_params(module, params: list, blocks: list[str] | None) -> dict[int, int]:
    """The index in `params` of each parameter a repeated block holds -> that block's index."""
    where = {id(p): b for b, name in enumerate(blocks or ()) for p in module.get_submodule(name).parameters()}
    return {i: where[id(p)] for i, p in enumerate(params) if id(p) in where}


def trace_pass(module, batch, loss_fn, params: list, target: TraceTarget | None = None,
               blocks: list[str] | None = None) -> TracedPass:
    """One forward and backward of `module` under the tracer; `params` is the parameter list
    whose indices "ready" uses (`list(module.parameters())`, DDP's order). `target` (see
    `check_target`) runs it as that device would (`TargetLens`); None: as meta runs it. `blocks`:
    the repeated blocks' qualified names, to say what each keeps for backward (`memory.kept`)."""
    target = check_target(target)
    autocast = None if target is None or target.weights == "cast" else AUTOCAST_DTYPES.get(target.precision)
    lens = None if target is None else TargetLens(target.device, autocast, target.capability or DEFAULT_CAPABILITY,
                                                  target.attention)
    tracer = OpTracer(lens)
    ready: list[tuple[int, int]] = []

    owner = _block_of_params(module, params, blocks)

    def grad_ready(p, i):
        if owner.get(i) is not None:  # the backward's segments (`LiveBytes`): each block from its first gradient
            tracer.memory.enter(("backward", "block", owner[i]))
        elif tracer.memory.segment[1] in ("block", "tail"):
            tracer.memory.enter(("backward", "tail", None))
        tracer.memory.mark_grad(p.grad)
        ready.append((i, tracer.flops["backward"]))

    handles = [p.register_post_accumulate_grad_hook(lambda p, i=i: grad_ready(p, i)) for i, p in enumerate(params)
               if p.requires_grad]
    marks, block_handles = _block_marks(module, blocks, tracer)
    block_handles += _selective_marks(module, tracer)
    try:
        with lens if lens is not None else contextlib.nullcontext(), tracer:
            with lens.region() if lens is not None else contextlib.nullcontext():
                loss = user_loss(module, batch, loss_fn)
            if lens is not None:
                lens.clear_cache()  # autocast's cached casts go when its region ends
            # what stays for the backward (module docstring), less the parameters' copies
            held = (tracer.memory.live - tracer.memory.param_copies, tracer.memory.param_copies,
                    _kept(tracer, marks, blocks))
            nodes, leaves = autograd_nodes(loss.grad_fn)
            tracer.phase = "backward"
            tracer.selective = 0
            tracer.memory.start_backward()
            tracer.memory.enter(("backward", "head", None))
            backward_with_modes_on(loss)
    finally:
        for h in handles + block_handles:
            h.remove()
    total = tracer.flops["backward"]
    return TracedPass(tracer.ops, totals(tracer.ops), _memory(tracer, *held),
                      ready=[[i, f / total] for i, f in ready] if total > 0 else [],
                      ready_flops=[[i, f] for i, f in ready], autograd_nodes=nodes, autograd_leaves=leaves,
                      by_name=aggregate(tracer.ops), target=target,
                      attention=AttentionChoices(lens.attention, lens.attention_reasons)
                      if lens and lens.attention else None)


def shape_kwargs(build, stated: dict | None) -> dict:
    """The stated shape (`micro_batch`, `seq_len`) that the user's callable takes by name."""
    try:
        accepted = inspect.signature(build).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return {}
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    stated = stated or {}
    out = {k: stated.get(_STATED_AS.get(k, k)) for k in SHAPE_KWARGS}
    if "micro_batch" in accepted:  # both named: micro_batch is the stated one, batch_size the callable's own
        out.pop("batch_size")
    return {k: v for k, v in out.items() if v is not None and k in accepted and accepted[k].kind in named}


def describe_batch(batch) -> str:
    """'4x32' for a tensor; '(4x3x224x224, 4)' for a tuple; 'input_ids 4x128, labels 4x128' for a dict."""
    if isinstance(batch, torch.Tensor):
        return "x".join(str(n) for n in batch.shape) or "scalar"
    if isinstance(batch, dict):
        return ", ".join(f"{k} {describe_batch(v)}" for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return "(" + ", ".join(describe_batch(v) for v in batch) + ")"
    return type(batch).__name__


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def build_on_meta(spec: str, stated: dict | None = None, kwargs: dict | None = None):
    """(module, batch, loss_fn, the shape kwargs given) of the user's callable, all on meta; to be
    called, and the pass run, inside `topoprof.trace.meta_device.on_meta()` (module docstring)."""
    shape = shape_kwargs(load_callable(spec), stated)
    module, batch, loss_fn = call_user_callable(spec, {**(kwargs or {}), **shape})
    return module.to("meta"), to_device(batch, "meta"), loss_fn, shape


def repeated_blocks(module, container: str | None = None) -> list[str] | None:
    """The qualified names of a model's repeated blocks: the children of `container` (a module
    name, as --fsdp-unit gives it), else those its class names in `BLOCKS` (the presets, the
    synthetic model), else the block list found in it (`topoprof/zoo/user_blocks.py`); None where
    none is."""
    containers = [container] if container else list(getattr(type(module), "BLOCKS", ()))
    if not containers:
        found = find_block_list(module)
        containers = [found] if found is not None else []
    try:
        return [name for c in containers for name in children_of(module, c)] or None
    except AttributeError:  # no such module: the blocks are not known
        return None


def _import_before_tracing_checkpoints() -> None:
    """torch.utils.checkpoint imports torch._dynamo at its first call (torch/_compile.py
    `_disable_dynamo`); imported under the trace's modes, its start-up runs ops on meta tensors
    (torch 2.6 fails on one's item()) that the tracer would count. Imported first, outside them,
    where the model may checkpoint: under the tool's modes, or a user's own model."""
    # lazy: torch._dynamo's start-up must run here, before the trace's modes are on
    import torch._dynamo  # noqa: F401 - imported for its start-up, run here


def resized(batch, shape: dict, stated: dict | None, resize_from: int | None):
    """The batch at the stated micro-batch where the callable did not build it so (`shape` holds no
    micro-batch) and it was built at `resize_from` samples, else at the samples it holds
    (`batch_samples`), by `resize_batch`; UserModelError("batch") where it cannot be resized."""
    wanted = (stated or {}).get("micro_batch")
    if wanted is None or "micro_batch" in shape or "batch_size" in shape:
        return batch
    resize_from = resize_from or batch_samples(batch)
    if resize_from is None:  # run as built, it would stand for a micro-batch it is not
        raise UserModelError("batch", f"its example batch ({describe_batch(batch)}) cannot be resized to micro-batch "
                             f"{wanted}: its tensors share no first dimension to count its samples by; let its "
                             "callable take micro_batch or batch_size")
    if wanted == resize_from:
        return batch
    try:
        return resize_batch(batch, resize_from, wanted)
    except ValueError as err:
        raise UserModelError("batch", f"its example batch ({describe_batch(batch)}) cannot be resized from "
                             f"micro-batch {resize_from} to {wanted}: {err}; let its callable take micro_batch or "
                             "batch_size") from None


def trace_user_model(spec: str, stated: dict | None = None, kwargs: dict | None = None,
                     target: TraceTarget | None = None, progress=None, blocks: str | None = None,
                     ac: str | None = None, resize_from: int | None = None,
                     depth: int | None = None) -> TracedPass | TraceFailure:
    """The op trace of the user's `--model` callable on meta, or its `TraceFailure`. `stated`:
    the shape the prediction is for, given to the callable where it takes it; `kwargs`: passed
    as they are (a preset's name, as `measure` takes them); `target`: the device it stands for;
    `progress`: called with each stage's text; `blocks`: the module whose children are the
    repeated blocks (`repeated_blocks`); `ac`: a user's model's blocks checkpointed so
    (`topoprof/zoo/user_blocks.py`, said in "checkpointing"; a preset takes it in `kwargs`);
    `resize_from`: the micro-batch its example batch was built at, resized to the stated one
    (`resized`); `depth`: a user's model cut to its first `depth` blocks (`keep_first_blocks`; the
    trace says how many it had, "blocks_of"). A failure says where (`TraceFailure.stage`): one of
    USER_ERRORS, with its `traceback`, when the callable itself is wrong; "pass", with `params`
    (its parameter list, read on meta), when the model was built and only its pass failed."""
    built: dict = {}
    say = progress or (lambda text: None)
    if (kwargs or {}).get("ac", "none") != "none" or not spec.startswith("topoprof.zoo."):
        _import_before_tracing_checkpoints()

    def one_pass(for_target: TraceTarget | None):
        with on_meta():
            say(f"building {spec} on meta")
            module, batch, loss_fn, shape = build_on_meta(spec, stated, kwargs)
            if "transformers" in sys.modules:  # a Hugging Face model, built by the tool or by the user's code

                install_meta_patches()
            hf = getattr(module, "topoprof_hf", None)
            if for_target is not None and hf is not None and hf.price_as_flash:  # flash_attention_2, built as sdpa
                for_target = replace(for_target, attention="flash")
            batch = resized(batch, shape, stated, resize_from)
            unit = blocks
            built["block_list"] = blocks or find_block_list(module)  # what FSDP wraps block by block
            if depth is not None:  # its block list named from here on: one block is no list to find
                unit, built["blocks_of"] = keep_first_blocks(module, blocks, depth)
            if for_target is not None and for_target.weights == "cast":  # as MixedPrecisionPolicy casts them;
                module = module.to(AUTOCAST_DTYPES[for_target.precision])  # once cut, only the blocks kept
            built["params"] = parameter_list(module)
            done = checkpoint_user_model(module, ac, unit) if ac else None
            blocks_run: list[str] | None  # the blocks the pass marks as repeated
            if done is not None:
                built["checkpointing"], blocks_run = done
            else:
                blocks_run = repeated_blocks(module, unit)
            say(f"tracing the forward and backward of {len(built['params'])} parameter tensors on meta")
            return shape, module, batch, trace_pass(module, batch, loss_fn, list(module.parameters()), for_target,
                                                    blocks_run)

    target = check_target(target)
    autocast_failure = None
    try:
        try:
            shape, module, batch, traced = one_pass(target)
        except UserModelError:
            raise
        except Exception as err:  # noqa: BLE001 - autocast's casts may be what fails: the pass in fp32 still orders
            if target is None or target.precision == "fp32":
                raise
            autocast_failure = f"in {target.precision}, {_first_line(err)}"
            shape, module, batch, traced = one_pass(check_target(replace(target, precision="fp32")))
    except Exception as err:  # noqa: BLE001 - the measured order stands in, with this reason
        if isinstance(err, UserModelError) and err.kind in (*USER_ERRORS, "batch", "cut"):
            return TraceFailure(str(err), err.kind, err.trace)
        return TraceFailure(f"on meta, {_first_line(err)}", params=built.get("params"))
    if not traced.ready:
        return TraceFailure("FlopCounterMode's rules count no backward FLOPs here (no matmul, convolution or "
                            "attention to weigh the gradients by)")
    described = describe_batch(batch) + (f" ({', '.join(f'{k}={v}' for k, v in shape.items())})" if shape else "")
    return replace(traced, spec=spec, shape=described, kwargs=shape, samples=batch_samples(batch),
                   params=parameter_list(module), checkpointing=built.get("checkpointing"),
                   blocks_of=built.get("blocks_of"), block_list=built.get("block_list") or None,
                   autocast_failure=autocast_failure)


def run_rank(ctx, job: OpTraceJob) -> None:
    """Worker `op_trace`: the pass alone, for a model nothing times here (a preset, `--params` or a
    user's `--model` predicted for a GPU that is not here, or built on meta); sends an
    `OpTraceResult` with the trace or its failure (an `OpTracesResult` for the job's variants).
    Nothing of the model runs for real."""
    if ctx.rank != 0:
        return
    if job.cwd:
        os.chdir(job.cwd)
    if job.variants is not None:
        passes = with_selective_cost([_variant(ctx, job, v) for v in job.variants])
        ctx.send(OpTracesResult(traces=passes))
        return
    ctx.progress(f"tracing {job.spec} on meta")
    traced = with_selective_cost([trace_user_model(job.spec, job.stated, job.kwargs, job.target, ctx.progress,
                                                   job.blocks, job.ac)])[0]
    ctx.send(traced if isinstance(traced, TraceFailure) else OpTraceResult(trace=traced))


def with_selective_cost(traces: list[TracedPass | TraceFailure]) -> list[TracedPass | TraceFailure]:
    """The traces, those with ops `op` mode checkpoints given what its modes cost per op on this
    machine (`selective_cost`, under 0.1 s, once for them all) as `selective_checkpoint`."""
    def selective(t: TracedPass | TraceFailure) -> bool:
        return isinstance(t, TracedPass) and any(op.selective for op in t.ops)

    if not any(selective(t) for t in traces):
        return traces

    cost = selective_checkpoint_cost()
    return [replace(t, selective_checkpoint=cost) if isinstance(t, TracedPass) and selective(t) else t
            for t in traces]


def _variant(ctx, job: OpTraceJob, variant: TraceVariant) -> TracedPass | TraceFailure:
    """One of several passes of one model (another depth, micro-batch, checkpointing mode or
    target), without what only the main pass needs (the ops summed by name, the parameters),
    unless it is the main pass (`whole`)."""
    kwargs, stated = {**(job.kwargs or {}), **variant.kwargs}, variant.stated
    ctx.progress(f"tracing {job.spec} {kwargs} {stated} on meta")
    traced = trace_user_model(job.spec, stated, kwargs, variant.target or job.target,
                              ctx.progress if variant.whole else None, blocks=job.blocks, ac=variant.ac or job.ac,
                              depth=variant.depth)
    if isinstance(traced, TraceFailure) or variant.whole:
        return traced
    return replace(traced, by_name=None, params=None)
