"""What the device a meta pass stands for runs where the meta device cannot tell
(`topoprof/trace/op_trace.py`): its fused attention kernel and, on CUDA in 16-bit, autocast's casts.

The target (`{"device": "cuda" or "cpu", "precision": "bf16", "fp16" or "fp32"}`) is read
through `TargetLens`, a TorchFunctionMode above autograd, so that the backward follows:
- attention: `scaled_dot_product_attention` on meta takes torch's math path (`_fused_sdp_choice_meta`
  in aten/src/ATen/native/transformers/attention.cpp answers "math" without a CUDA key), which
  materializes the scores; on the device torch runs one fused kernel forward and one backward.
  The lens calls the one that device runs: on CUDA `_scaled_dot_product_flash_attention` (16-bit,
  no mask) or `_scaled_dot_product_efficient_attention` (fp32 or a mask), on the CPU
  `_scaled_dot_product_flash_attention_for_cpu`;
- precision: on CUDA with bf16/fp16 the forward runs under autocast, which has no meta kernel;
  the lens applies CUDA autocast's cast policy (aten/src/ATen/autocast_mode.cpp, its
  `KERNEL_CUDA` lists: lower_precision_fp, fp32, fp32_set_opt_dtype) by function name, with
  autocast's cache of casted leaf weights, so the trace holds the casts and the 16-bit bytes a
  bf16 step moves. A CPU target runs in fp32, as CPU ranks train.

The lens stays on in the backward (`topoprof/trace/op_trace.py` starts the engine past
`Tensor.backward`, which would reach the lens as a torch function and run with the lens off),
and where it casts is a real `torch.autocast("cpu", dtype)` region (`TargetLens.region`), for
activation checkpointing: `torch.utils.checkpoint` records the autocast state at the forward and
re-enters it for the recompute in backward (`_get_autocast_kwargs`; for meta tensors
`_infer_device_type` answers "meta", which has no autocast of its own, so the CPU's state is the
one it carries), as it carries CUDA's on a GPU. CPU autocast casts only CPU tensors
(`cached_cast` checks the device), so on meta tensors the region changes nothing but that state.
A recompute thus casts and attends as the forward did, its weight copies cached until its region
ends, as on the GPU. Without both, the recompute ran with no lens at all (fp32, and attention
by meta's math path): non-reentrant checkpointing refused the recomputed tensors
(`CheckpointError`: different metadata than during the forward), reentrant checkpointing
recomputed in fp32 without a word.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten


# CUDA autocast's policy (aten/src/ATen/autocast_mode.cpp, `TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m)`),
# by the names torch's Python functions and Tensor methods carry: run in the 16-bit dtype
# (lower_precision_fp), in fp32 (fp32), or with fp32 as the result dtype (fp32_set_opt_dtype).
_LOWER_PRECISION = frozenset({
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__", "__rmatmul__", "einsum", "mm",
    "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "multi_dot",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention"})
_FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    # F.cross_entropy is log_softmax (fp32_set_opt_dtype) then nll_loss (fp32): it runs in fp32
    "cross_entropy"})
_FP32_RESULT = frozenset({"prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                          "linalg_matrix_norm", "sum"})
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TargetLens(TorchFunctionMode):
    """What the target device runs where meta cannot tell (module docstring): the fused attention
    kernel, and on CUDA in 16-bit, autocast's casts inside `region()`."""

    def __init__(self, device: str, autocast_dtype=None):
        super().__init__()
        self.device, self.dtype = device, autocast_dtype
        self._cache: dict[int, torch.Tensor] = {}

    def region(self):
        """The autocast region the forward and the loss run in, as `torch.autocast` wraps them:
        a real one on the CPU (module docstring), none for an fp32 target."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.dtype)

    def casting(self) -> bool:
        return self.dtype is not None and torch.is_autocast_enabled("cpu")

    def clear_cache(self) -> None:
        """As leaving the outermost `torch.autocast` region clears its cache (autocast_mode.cpp,
        clear_cache)."""
        self._cache.clear()

    def leave_ended_region(self) -> None:
        """Called before each aten op: the casts cached in a region that has ended (a recompute's,
        in backward) go, before that op allocates, as they go when the region is left."""
        if self._cache and not self.casting():
            self._cache.clear()

    def _cast(self, values, dtype):
        def one(t):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype in (dtype, torch.float64):
                return t
            # autocast's cached_cast: a leaf fp32 weight that needs its gradient, not a view, is
            # cast once per region
            cache = (dtype == self.dtype and t.dtype == torch.float32 and t.is_leaf and t.requires_grad
                     and not t._is_view())
            if cache and id(t) in self._cache:
                return self._cache[id(t)]
            casted = t.to(dtype)
            if cache:
                self._cache[id(t)] = casted
            return casted
        return tree_map(one, values)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if self.casting():
            if name in _LOWER_PRECISION:
                args, kwargs = self._cast((args, kwargs), self.dtype)
            elif name in _FP32:
                args, kwargs = self._cast((args, kwargs), torch.float32)
            elif name in _FP32_RESULT and "dtype" not in kwargs and any(
                    isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16) for t in tree_leaves(args)):
                kwargs["dtype"] = torch.float32
        if name == "scaled_dot_product_attention":
            fused = self._fused_attention(args, kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)

    def _fused_attention(self, args, kwargs):
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = {**dict(zip(names, args)), **kwargs}
        q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
        mask, dropout = bound.get("attn_mask"), bound.get("dropout_p", 0.0)
        causal, scale = bool(bound.get("is_causal", False)), bound.get("scale")
        if bound.get("enable_gqa") or not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            return None
        try:
            if self.device == "cpu":
                return aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, dropout, causal, attn_mask=mask, scale=scale)[0]
            if mask is None and q.dtype in (torch.bfloat16, torch.float16):
                return aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, scale=scale)[0]
            return aten._scaled_dot_product_efficient_attention(q, k, v, mask, True, dropout, causal, scale=scale)[0]
        except Exception:  # noqa: BLE001 - a shape or option the kernel refuses: torch's own path stands
            return None


def check_target(target: dict | None) -> dict | None:
    """{"device": "cuda"|"cpu", "precision": "bf16"|"fp16"|"fp32"[, "weights": "cast"]}; a CPU
    trains in fp32. "weights": "cast" runs a 16-bit CUDA pass with the model's weights cast to that
    dtype and no autocast, as FSDP2's MixedPrecisionPolicy(param_dtype) runs its blocks (the
    all-gathered parameters in param_dtype, the inputs cast to it: `cast_forward_inputs`)."""
    if target is None:
        return None
    device, precision = target.get("device"), target.get("precision", "fp32")
    weights = target.get("weights", "autocast")
    if device not in ("cuda", "cpu") or precision not in ("bf16", "fp16", "fp32") or weights not in ("autocast", "cast"):
        raise ValueError(f"op trace target {target!r}: device cuda or cpu, precision bf16, fp16 or fp32, "
                         "weights autocast or cast")
    checked = {"device": device, "precision": "fp32" if device == "cpu" else precision}
    if weights == "cast" and checked["precision"] != "fp32":
        checked["weights"] = "cast"
    return checked
