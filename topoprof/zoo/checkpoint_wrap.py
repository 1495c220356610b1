"""Activation checkpointing applied to a model's repeated blocks, in the modes torchtitan offers
(torchtitan/models/llama3/parallelize_llama.py, `_apply_ac_to_transformer_block` and `apply_ac`;
since moved to torchtitan/distributed/activation_checkpoint.py):

- `none`: every block keeps what autograd saves;
- `full`: every block wrapped by `checkpoint_wrapper` (torch/distributed/algorithms/_checkpoint/
  checkpoint_wrapper.py: non-reentrant `torch.utils.checkpoint`), which keeps the block's input
  and recomputes the rest in backward;
- `layer:N`: every N-th block so wrapped (torchtitan's integer `selective_ac_option`: a running
  count of the blocks, wrapped where count % N == 0, so `layer:1` is `full`);
- `op`: torchtitan's selective op policy, through `create_selective_checkpoint_contexts`: in each
  block, keep the outputs of the ops in `SAVE_LIST` except every second `aten.mm`, recompute
  the rest (`_custom_policy`).

torchtitan wraps with `preserve_rng_state=False`, as here. `blocks` names the repeated blocks by
their qualified names (`module.named_modules()`); `topoprof/zoo/preset_modules.py:preset_blocks` gives
the presets' own.
"""
from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any, Callable

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

VALID_MODES = "none, full, layer:N (N a positive integer) or op"

# torchtitan's `_save_list` (torchtitan/models/llama3/parallelize_llama.py; the cuDNN attention
# as in its later `_op_sac_save_list`, torchtitan/models/llama3/infra/parallelize.py): matmuls,
# the fused attention kernels, the reduce-scatter of tensor parallelism, and `max` (kept for
# float8's scales).
SAVE_LIST = frozenset({
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
    # the CPU's fused attention, which torchtitan (CUDA only) does not meet: kept as the CUDA
    # kernels are, so that a CPU pass keeps what a GPU pass keeps
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
})


def check_mode(mode: str) -> tuple[str, int]:
    """('none' | 'full' | 'layer' | 'op', every N-th block); ValueError naming the valid forms."""
    text = str(mode).strip().lower()
    if text in ("none", "full", "op"):
        return text, 1
    kind, _, every = text.partition(":")
    if kind == "layer" and every.isdigit() and int(every) > 0:
        return "layer", int(every)
    raise ValueError(f"activation checkpointing {mode!r}: valid modes are {VALID_MODES}")


def _op_policy() -> Callable:
    """torchtitan's `_custom_policy`, with its own count of matmuls per block's forward and
    recompute: every second `mm` is recomputed, the rest of SAVE_LIST kept."""
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[mode] += 1
        save = func in SAVE_LIST and not (func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_contexts():
    return create_selective_checkpoint_contexts(_op_policy())


# torch 2.14 added `respect_saved_tensors_hooks` to torch.utils.checkpoint (pytorch/pytorch#190581):
# its default keeps the old behaviour, in which the tensors selective checkpointing keeps bypass
# saved_tensors_hooks (with a FutureWarning). Asked for explicitly where torch has it, so that a
# count through those hooks (`topoprof.trace.activation_bytes`) sees what the policy keeps; what is
# kept, and so the memory, is the same either way.
_CHECKPOINT_ARGS = inspect.signature(torch.utils.checkpoint.checkpoint).parameters
_SAC_HOOKS: dict[str, Any] = (
    {"respect_saved_tensors_hooks": True} if "respect_saved_tensors_hooks" in _CHECKPOINT_ARGS else {})


def _wrap(block, selective: bool):
    # lazy: torch.distributed (absent from some torch builds), only where a block is wrapped
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if selective:
        return checkpoint_wrapper(block, context_fn=_op_contexts, preserve_rng_state=False, **_SAC_HOOKS)
    return checkpoint_wrapper(block, preserve_rng_state=False)


def apply_activation_checkpointing(module: torch.nn.Module, mode: str, blocks: list[str]) -> torch.nn.Module:
    """`module` with its `blocks` (qualified names, in forward order) wrapped as `mode` says
    (module docstring); in place, and returned."""
    kind, every = check_mode(mode)
    if kind == "none":
        return module
    for count, name in enumerate(blocks, start=1):
        if kind == "layer" and count % every != 0:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        parent.register_module(child, _wrap(getattr(parent, child), selective=kind == "op"))
    return module


# The ops of one checkpointed block, as `run_under_selective_op` runs them per pair of contexts:
# a GPT-2 or Llama block's forward runs about 30 to 60 aten ops (topoprof/trace/op_trace.py counts
# them), so 64 stands for one block's forward. Each block gets contexts of its own
# (`context_fn` is called per checkpointed call), whose storage grows with the ops it holds.
OPS_PER_BLOCK = 64


def run_under_selective_op(op: Callable[[], object], blocks: int) -> int:
    """`op` run as `op` mode runs the ops of `blocks` checkpointed blocks: per block, fresh contexts
    (`_op_contexts`), OPS_PER_BLOCK calls under the forward's mode (the policy asked per op, its
    output kept or marked for recompute), then as many under the recompute's mode (each looked up
    and, marked, run again). Returns the ops run: the forward's and the recompute's together."""
    for _ in range(blocks):
        forward, recompute = _op_contexts()
        with forward:
            for _ in range(OPS_PER_BLOCK):
                op()
        with recompute:
            for _ in range(OPS_PER_BLOCK):
                op()
    return 2 * OPS_PER_BLOCK * blocks


def selective_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules `op` mode wrapped (`_wrap(selective=True)`), as the wrapper calls them: their
    forward, and its recompute in backward, run under the op policy's modes."""
    # lazy: torch.distributed (absent from some torch builds), only where a block is wrapped
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return [m._checkpoint_wrapped_module for m in module.modules() if isinstance(m, CheckpointWrapper)
            and getattr(m.checkpoint_fn, "keywords", {}).get("context_fn") is _op_contexts]


def children_of(module: torch.nn.Module, container: str) -> list[str]:
    """The qualified names of a container's children (a ModuleList's or a Sequential's blocks); ""
    names the model itself."""
    prefix = f"{container}." if container else ""
    return [f"{prefix}{name}" for name, _ in module.get_submodule(container).named_children()]
