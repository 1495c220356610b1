"""Activation checkpointing of a user's `--model`, as a preset gets it: the same modes
(`topoprof/zoo/checkpoint_wrap.py`) on its repeated blocks, as torchtitan wraps `model.layers`.

The blocks are the children of `--fsdp-unit` when it is given (the module whose children FSDP
wraps); else the block list found in the model: among its `nn.ModuleList`s and `nn.Sequential`s
of two or more children of one class that hold parameters, the one that holds the most (a
model's layers, not the experts or heads inside each layer), then the one with the most children.
Nothing is keyed on a class name. A model with neither is refused in one line that names
--fsdp-unit. FSDP wraps the same blocks one by one where no --fsdp-unit is given
(`topoprof/model/inputs/resolve.py:_user_model`).

A model that checkpoints its own blocks is refused in one line when --activation-checkpointing is
given too, rather than wrapped twice (a block recomputed inside a recompute): its own
checkpointing is what its trace counts without the option. Found before anything runs where the
model says so (a block already a `checkpoint_wrapper`; Hugging Face's `activation_checkpointing_enable()`,
`gradient_checkpointing_enable()` before transformers 5, sets `gradient_checkpointing` on the layers
it checkpoints: transformers' `modeling_layers.py`, `GradientCheckpointingLayer`),
else when a block is entered under checkpointing: `torch.utils.checkpoint` called in its forward
(reentrant: the block runs without grad; non-reentrant: inside the checkpoint's saved-tensor hooks).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from topoprof.specs.traced_pass import WrappedBlocks
from topoprof.zoo.checkpoint_wrap import apply_activation_checkpointing, check_mode, children_of
from topoprof.zoo.user_callable import UserModelError


def find_block_list(module: nn.Module) -> str | None:
    """The qualified name of the model's repeated block list (module docstring); None where it has none."""
    best: tuple[tuple[int, int], str] | None = None
    for name, m in module.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(m.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        key = (sum(p.numel() for p in m.parameters()), len(children))
        if key[0] and (best is None or key > best[0]):  # blocks hold parameters: FSDP shards them
            best = (key, name)
    return None if best is None else best[1]


def block_names(module: nn.Module, unit: str | None) -> tuple[str, list[str], str]:
    """(container, its children's qualified names, how it was chosen): `unit`'s children, else the
    block list found; UserModelError("blocks") naming --fsdp-unit where there is none."""
    if unit:
        try:
            names = children_of(module, unit)
        except AttributeError:
            raise UserModelError("blocks", f"--fsdp-unit {unit}: the model has no module of that name") from None
        if not names:
            raise UserModelError("blocks", f"--fsdp-unit {unit}: that module has no children to checkpoint")
        return unit, names, "--fsdp-unit"
    found = find_block_list(module)
    if found is None:
        raise UserModelError("blocks", "activation checkpointing: no repeated block list found in the model (no "
                             "nn.ModuleList or nn.Sequential of two or more modules of one class); name the module "
                             "whose children are its blocks with --fsdp-unit MODULE")
    return found, children_of(module, found), "found: the largest list of one block class"


def own_checkpointing(module: nn.Module) -> str | None:
    """Where the model says it checkpoints itself before it runs (module docstring); None where it does not."""
    # lazy: torch.distributed (absent from some torch builds), only where a block is wrapped
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    for name, m in module.named_modules():
        where = name or "the model"
        if isinstance(m, CheckpointWrapper):
            return f"{where} is a checkpoint_wrapper"
        if getattr(m, "gradient_checkpointing", False) is True:  # Hugging Face's flag (module docstring)
            return f"{where} checkpoints its layers (Hugging Face's activation_checkpointing_enable())"
    return None


def _under_checkpointing() -> bool:
    """Whether the code now running is inside `torch.utils.checkpoint`: a reentrant one runs its
    function without grad; a non-reentrant one inside its `_checkpoint_hook` saved-tensor hooks
    (torch/utils/checkpoint.py)."""
    if not torch.is_grad_enabled():
        return True
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    return hooks is not None and getattr(hooks[0], "__qualname__", "").startswith("_checkpoint_hook.")


def _refusal(mode: str, where: str) -> UserModelError:
    return UserModelError("checkpointing", f"--activation-checkpointing {mode}: the model already checkpoints its "
                          f"blocks ({where}); leave the option out to count its own checkpointing, or turn that off "
                          "to count this mode")


def checkpoint_user_model(module: nn.Module, mode: str,
                          unit: str | None = None) -> tuple[WrappedBlocks, list[str]] | None:
    """`module` with its blocks wrapped as `mode` says, in place; what was wrapped, and the names
    of the blocks; None for `none`.
    UserModelError where it has no blocks or checkpoints itself (module docstring): a hook on each
    block refuses the pass that enters one under the model's own checkpointing."""
    kind, every = check_mode(mode)
    if kind == "none":
        return None
    where = own_checkpointing(module)
    if where is not None:
        raise _refusal(mode, where)
    container, names, chosen = block_names(module, unit)
    apply_activation_checkpointing(module, mode, names)

    def refuse_nested(block, _args):
        if _under_checkpointing():
            raise _refusal(mode, f"the blocks of {container or 'the model'} run under torch.utils.checkpoint in its "
                                 f"forward")

    for name in names:
        module.get_submodule(name).register_forward_pre_hook(refuse_nested)
    wrapped = len(names) // every if kind == "layer" else len(names)
    return WrappedBlocks(mode, container, len(names), wrapped, chosen), names



def keep_first_blocks(module: nn.Module, unit: str | None, depth: int) -> tuple[str, int]:
    """`module` cut, in place, to the first `depth` of its repeated blocks (the children of
    `unit`, else the block list found); (that list's name, how many blocks it had). A model of
    alike blocks holds and takes at N blocks what its passes at 1 and 2 extend to
    (`topoprof.model.memory.traced`), which its caller checks against the pass of the whole model.
    UserModelError("cut") where it has no block list, or fewer blocks than `depth`: the caller then
    traces it whole."""
    container = unit or find_block_list(module)
    if container is None:
        raise UserModelError("cut", "no repeated block list (an nn.ModuleList or nn.Sequential of modules of "
                                    "one class)")
    parent_name, _, attr = container.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    blocks = getattr(parent, attr)
    children = list(blocks.children())
    if len(children) < depth:
        raise UserModelError("cut", f"{container} holds {len(children)} block(s), fewer than {depth}")
    first = children[:depth]
    setattr(parent, attr, nn.Sequential(*first) if isinstance(blocks, nn.Sequential) else nn.ModuleList(first))
    return container, len(children)
