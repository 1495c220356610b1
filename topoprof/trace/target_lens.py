"""What the device a meta pass stands for runs where the meta device cannot tell
(`topoprof/trace/op_trace.py`): its fused attention kernel and, on CUDA in 16-bit, autocast's casts.

The target (`topoprof.specs.traced_pass.TraceTarget`: CUDA or a CPU, at a precision) is read
through `TargetLens`, a TorchFunctionMode above autograd, so that the backward follows:
- attention: `scaled_dot_product_attention` on meta takes torch's math path (`_fused_sdp_choice_meta`
  in aten/src/ATen/native/transformers/attention.cpp answers "math" without a CUDA key), which
  materializes the scores; on the device torch picks a backend and runs its one fused kernel
  forward and one backward. The lens picks as the device would, for every way a model calls it
  (`enable_gqa`, a bool or float `attn_mask`, `is_causal`, dropout; `nn.MultiheadAttention` and
  Hugging Face's `sdpa` attention call it too) and runs that backend's op on meta: on CUDA by the
  rules of torch's dispatcher for the target GPU's compute capability and this torch
  (`topoprof.trace.sdpa_dispatch`: flash, memory-efficient, cuDNN or math); on the CPU by torch's
  own CPU choice (`torch._fused_sdp_choice`: its flash kernel or math). Where the device takes the
  math path, meta's math path is what it runs, and stays. A bool mask reaches a fused kernel as a
  float mask of 0 and -inf (attention.cpp `convert_boolean_attn_mask`), allocated as there;
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

from topoprof.specs.traced_pass import TraceTarget
from topoprof.trace import fused_kernels, sdpa_dispatch

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
# A CUDA target whose GPU is not named: sm80, the oldest architecture every fused attention kernel
# of torch's runs on (sdp_utils.cpp: flash from sm80; `topoprof.trace.sdpa_dispatch`).
DEFAULT_CAPABILITY = (8, 0)
# The torch.nn.functional names F.multi_head_attention_forward calls in training (need_weights=False,
# as nn.TransformerEncoderLayer passes it): its input and output projections and its attention.
_MHA_CALLS = ("linear", "scaled_dot_product_attention")
ATTENTION_BACKENDS = (sdpa_dispatch.FLASH, sdpa_dispatch.EFFICIENT, sdpa_dispatch.CUDNN, sdpa_dispatch.MATH)


class TargetLens(TorchFunctionMode):
    """What the target device runs where meta cannot tell (module docstring): the fused attention
    kernel, and on CUDA in 16-bit, autocast's casts inside `region()`."""

    def __init__(self, device: str, autocast_dtype=None, capability: tuple[int, int] = DEFAULT_CAPABILITY,
                 attention: str | None = None):
        super().__init__()
        self.device, self.dtype = device, autocast_dtype
        self.capability, self.attention_override = tuple(capability), attention
        self._cache: dict[int, torch.Tensor] = {}
        self.attention: dict[str, int] = {}          # calls per backend run
        self.attention_reasons: dict[str, str] = {}  # why the faster backends were refused, per backend run

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
            elif name in _FP32_RESULT and kwargs.get("dtype") is None and not _dtype_given(args) and any(
                    isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)
                    for t in tree_leaves(args)):
                kwargs["dtype"] = torch.float32  # F.softmax passes dtype=None by name: None is not given
        if name == "scaled_dot_product_attention":
            fused = self._fused_attention(args, kwargs)
            if fused is not None:
                return fused
        if self.device == "cuda" and name in fused_kernels.REDIRECTED:
            fused = fused_kernels.redirect(fused_kernels.canonical_name(func), args, kwargs, "cuda", TORCH_VERSION,
                                           autocast=self.casting())
            if fused is not NotImplemented:
                return fused
        if name == "multi_head_attention_forward":
            with self._seeing(torch.nn.functional, _MHA_CALLS):
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def _seeing(self, module, names):
        """`module`'s functions `names` routed through this lens while a Python function of torch's
        runs that calls them: a mode is off while its own handler runs, so without this its calls
        (nn.MultiheadAttention's projections and its SDPA, under F.multi_head_attention_forward)
        would run as meta runs them, in fp32 and by the math path."""
        saved = {n: getattr(module, n) for n in names}

        def routed(original):
            return lambda *args, **kwargs: self.__torch_function__(original, (), args, kwargs)

        try:
            for n, original in saved.items():
                setattr(module, n, routed(original))
            yield
        finally:
            for n, original in saved.items():
                setattr(module, n, original)

    def _fused_attention(self, args, kwargs):
        """The kernel the target runs for this call, run on meta (module docstring); None where
        the target takes torch's math path too, which meta then runs as it does."""
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = {**dict(zip(names, args)), **kwargs}
        q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            return None
        call = AttentionCall(q, k, v, bound.get("attn_mask"), float(bound.get("dropout_p") or 0.0),
                             bool(bound.get("is_causal", False)), bound.get("scale"), bool(bound.get("enable_gqa")))
        backend, reason = (self._cpu_backend(call) if self.device == "cpu" else self._cuda_backend(call))
        self.attention[backend] = self.attention.get(backend, 0) + 1
        if reason:
            self.attention_reasons.setdefault(backend, reason)
        return None if backend == sdpa_dispatch.MATH else _run_backend(backend, call, self.device)

    def _cuda_backend(self, call: "AttentionCall") -> tuple[str, str]:
        if self.attention_override is not None:
            return self.attention_override, f"{self.attention_override}: as the model's own attention runs"
        choice = sdpa_dispatch.choose_backend(call.sdpa_call(), sdpa_dispatch.GpuArch(*self.capability),
                                              TORCH_VERSION)
        refused = "; ".join(f"{b}: {why}" for b, why in choice.refused.items() if not why.startswith("(not reached"))
        return choice.backend, refused

    @staticmethod
    def _cpu_backend(call: "AttentionCall") -> tuple[str, str]:
        """torch's own CPU choice (`_fused_sdp_choice`, sdp_utils_cpp.cpp), asked with CPU tensors of
        the call's shapes that hold one row each (stride 0 but the last dimension's)."""
        def stand_in(t):
            if t is None:
                return None
            row = torch.zeros(t.shape[-1], dtype=t.dtype, device="cpu")  # not the trace's default device, meta
            return row.as_strided(tuple(t.shape), (0,) * (t.dim() - 1) + (1,))

        with torch._C.DisableTorchFunction():  # the trace's modes would make them meta tensors
            mask = call.mask if call.mask is None else stand_in(call.mask)
            backend = torch._fused_sdp_choice(stand_in(call.q), stand_in(call.k), stand_in(call.v), mask, call.dropout,
                                              call.causal, scale=call.scale, enable_gqa=call.gqa)
        return (sdpa_dispatch.FLASH if backend == _FLASH_CHOICE else sdpa_dispatch.MATH), ""


def _dtype_given(args) -> bool:
    """A dtype passed by position (`torch.softmax(x, -1, torch.float32)`): autocast's fp32 result
    policy leaves it as given."""
    return any(isinstance(a, torch.dtype) for a in args)


# torch.nn.attention.SDPBackend.FLASH_ATTENTION's value, as `_fused_sdp_choice` returns it
_FLASH_CHOICE = 1


class AttentionCall:
    """One `scaled_dot_product_attention` call's arguments, as the backends read them."""

    def __init__(self, q, k, v, mask, dropout: float, causal: bool, scale, gqa: bool):
        self.q, self.k, self.v, self.mask = q, k, v, mask
        self.dropout, self.causal, self.scale, self.gqa = dropout, causal, scale, gqa

    def sdpa_call(self) -> sdpa_dispatch.SdpaCall:
        q, k, v, mask = self.q, self.k, self.v, self.mask
        kind = None if mask is None else ("bool" if mask.dtype == torch.bool else "float")
        return sdpa_dispatch.SdpaCall(
            batch=q.shape[0], q_heads=q.shape[1], kv_heads=k.shape[1], q_len=q.shape[2], kv_len=k.shape[2],
            head_dim=q.shape[3], head_dim_v=v.shape[3], dtype=_DTYPE_NAMES.get(q.dtype, "fp32"), mask=kind,
            mask_shape=None if mask is None else tuple(mask.shape),
            mask_requires_grad=bool(mask is not None and mask.requires_grad), is_causal=self.causal,
            dropout_p=self.dropout, enable_gqa=self.gqa,
            requires_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
            last_dim_contiguous=all(t.stride(-1) == 1 for t in (q, k, v)))

    def float_mask(self):
        """A bool mask as the fused kernels take it: 0 where attended, -inf elsewhere, in the query's
        dtype (attention.cpp `convert_boolean_attn_mask`: a new tensor, as on the device)."""
        if self.mask is None or self.mask.dtype != torch.bool:
            return self.mask
        zero = torch.scalar_tensor(0.0, dtype=self.q.dtype, device=self.mask.device)
        minus_inf = torch.scalar_tensor(float("-inf"), dtype=self.q.dtype, device=self.mask.device)
        return torch.where(self.mask, zero, minus_inf)


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


# The torch this trace runs, as the job is taken to run it: (major, minor)
TORCH_VERSION = fused_kernels.parse_version(torch.__version__)


def _run_backend(backend: str, call: AttentionCall, device: str):
    """The forward op of `backend` on the call's meta tensors, as attention.cpp calls it; its output."""
    q, k, v = call.q, call.k, call.v
    if device == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, call.dropout, call.causal,
                                                                attn_mask=call.float_mask(), scale=call.scale)[0]
    needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if backend == sdpa_dispatch.FLASH:
        return aten._scaled_dot_product_flash_attention(q, k, v, call.dropout, call.causal, scale=call.scale)[0]
    if backend == sdpa_dispatch.CUDNN:
        return aten._scaled_dot_product_cudnn_attention(q, k, v, call.float_mask(), needs_lse, call.dropout,
                                                        call.causal, False, scale=call.scale)[0]
    if call.gqa and k.shape[1] != q.shape[1]:  # native GQA in the memory-efficient kernel (2.14+): heads as q's
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    return aten._scaled_dot_product_efficient_attention(q, k, v, call.float_mask(), needs_lse, call.dropout,
                                                        call.causal, scale=call.scale)[0]


def check_target(target: TraceTarget | None) -> TraceTarget | None:
    """`target` as the device runs it: a CPU in fp32; weights cast only in 16 bits; a capability
    and a forced attention backend only on CUDA (DEFAULT_CAPABILITY stands for a GPU not named).
    ValueError for what no device runs."""
    if target is None:
        return None
    device, precision, capability, attention = target.device, target.precision, target.capability, target.attention
    if (device not in ("cuda", "cpu") or precision not in ("bf16", "fp16", "fp32")
            or target.weights not in ("autocast", "cast")):
        raise ValueError(f"op trace target {target!r}: device cuda or cpu, precision bf16, fp16 or fp32, "
                         "weights autocast or cast")
    if capability is not None and (len(capability) != 2 or not all(isinstance(n, int) for n in capability)):
        raise ValueError(f"op trace target {target!r}: capability (major, minor)")
    if attention not in (None, *ATTENTION_BACKENDS):
        raise ValueError(f"op trace target {target!r}: attention one of {', '.join(ATTENTION_BACKENDS)}")
    precision = "fp32" if device == "cpu" else precision
    cuda = device == "cuda"
    return TraceTarget(device, precision, "cast" if target.weights == "cast" and precision != "fp32" else "autocast",
                       capability if cuda else None, attention if cuda else None)
