"""The fused kernels a CUDA device runs where meta runs a composite (`topoprof.trace.target_lens`
calls `redirect` for a CUDA target): CompositeImplicitAutograd torch functions that CUDA sends to
one fused aten op, so that a trace on the *meta* device records the same aten op and, more
importantly, the same autograd node and saved tensors.

The rules were read from each release's native_functions.yaml, derivatives.yaml and
ATen/autocast_mode.h (2.6 .. 2.15, one release per minor version) and from copies of the C++
sources not tied to a release; the C++ conditions of rms_norm's fallbacks were checked against
torch 2.13 at run time. Not verified: the CUDA-only conditions of dropout and softmax (they test
for a CUDA tensor, which a CPU build cannot make), autocast's rms_norm outside 2.13 (read from
the header's list), and cross_entropy's device branches (none assumed).

Public API
----------
``redirect(func_name, args, kwargs, target_device, torch_version, *, autocast=False)``
    Returns the result of the fused aten op, or ``NotImplemented`` when the
    target would run the same (composite) code path that meta already runs.
    ``func_name`` is the name ``torch.overrides.resolve_name(func)`` gives,
    e.g. ``"torch.nn.functional.rms_norm"``; ``canonical_name(func)`` does that.
    ``torch_version`` is the torch version *of the target machine*
    (``"2.13.0+cu128"``, ``(2, 13)``, ``torch.__version__``...).
    ``autocast`` says whether the step runs under ``torch.autocast("cuda")`` on
    the target.  It must be passed explicitly: on a CPU-only build
    ``torch.autocast("cuda")`` disables itself ("CUDA is not available ...
    Disabling autocast"), so the flag cannot be read from TLS here.

Only meta tensors are redirected (a real CUDA tensor already takes the fused
path by itself; CPU tensors are left alone unless ``allow_non_meta=True``, which
exists for numerical tests).

Rules (see NOTES.md for the full citations and what is *not* verified)
----------------------------------------------------------------------
rms_norm  (``torch.nn.functional.rms_norm``, ``torch.rms_norm``; nn.RMSNorm calls F.rms_norm)
    * torch 2.6, 2.7: no ``_fused_rms_norm`` op in native_functions.yaml -> composite
      everywhere -> NotImplemented.
    * torch 2.8: ``_fused_rms_norm(Tensor input, int normalized_shape_ndim, Tensor weight,
      float eps) -> Tensor`` exists with an MPS kernel only, and derivatives.yaml has no
      entry -> CUDA runs the composite -> NotImplemented.
    * torch 2.9 .. 2.15: native_functions.yaml
      ``_fused_rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float? eps)
      -> (Tensor, Tensor)`` with ``CUDA: _fused_rms_norm_cuda`` and
      ``CompositeImplicitAutograd: rms_norm_composite``; derivatives.yaml saves
      ``input, weight, result1 (rstd)`` and backward calls ``_fused_rms_norm_backward``.
      ``rms_norm_symint`` (aten/src/ATen/native/layer_norm.cpp) falls back to
      ``rms_norm_composite`` when the input suggests channels_last(_3d) memory format,
      when the input is complex, or when ``weight.dtype != input.dtype``; otherwise it calls
      ``at::_fused_rms_norm``.  ``_fused_rms_norm_cuda``
      (aten/src/ATen/native/cuda/layer_norm_kernel.cu) returns ``Y`` = empty_like(contiguous
      input) and ``rstd`` of dtype ``toAccumulateType(input, is_cuda=true)`` (float32 for
      fp16/bf16/fp32, float64 for fp64) viewed to ``input.shape[:axis] + [1]*len(normalized_shape)``.
      It dispatches AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16).
    * autocast: ``rms_norm`` is in ``AT_FORALL_FP32`` of ATen/autocast_mode.h in 2.12.1,
      2.13.0, 2.14.1, 2.15.0 (not in 2.6.0 .. 2.11.0).  Under autocast the fp32 policy casts
      fp16/bf16 input and weight to float32 before ``rms_norm`` runs, so the fused op sees
      fp32 tensors and saves the fp32 copy of the input.
    * On meta, ``_fused_rms_norm`` has no Meta kernel: the CompositeImplicitAutograd kernel
      fills both the Meta and the AutogradMeta slots, so calling it on meta decomposes
      (grad_fn ToCopyBackward0 / MulBackward0).  This module therefore registers Python Meta
      kernels for ``_fused_rms_norm`` (only for the duration of the redirected call) and for
      ``_fused_rms_norm_backward`` (permanently: it has no composite, and the node created
      on meta needs it at backward time).  With a Meta kernel present, AutogradMeta uses the
      generated VariableType kernel (FusedRmsNormBackward0).

dropout  (``torch.nn.functional.dropout``, ``torch.dropout``; nn.Dropout calls F.dropout)
    aten/src/ATen/native/Dropout.cpp ``dropout()``:
    ``if (input.is_nested() || (train && is_fused_kernel_acceptable(input, p)))
    return std::get<0>(at::native_dropout(input, p, train));`` with
    ``is_fused_kernel_acceptable = (is_cuda || is_xpu || is_lazy || is_privateuseone)
    && p > 0 && p < 1 && numel > 0``.  ``dropout_`` (inplace=True) always runs the composite.
    native_dropout saves ``result1`` (the bool mask) in derivatives.yaml (2.6 .. 2.15);
    the composite ``_dropout_impl`` keeps an input-dtype ``noise`` tensor (MulBackward0).
    native_dropout has a Meta kernel in torch 2.13 (checked by calling it).

softmax / log_softmax with dtype=torch.float32 on a float16 input
    aten/src/ATen/native/SoftMax.cpp ``softmax(input, dim, dtype)`` /
    ``log_softmax(...)``: ``if (input_.is_cuda() && input_.scalar_type() == Half &&
    dtype == Float) return at::_softmax(input_, dim_, true);`` else it converts first
    (``input_.toType(dtype)``) and calls ``_softmax(converted, dim_, false)``.  The saved
    tensor (the fp32 output) is the same either way; the CUDA path skips the fp32 copy of
    the input (one kernel and a transient fp32 buffer).  BFloat16 is *not* in the condition.

Everything else in the survey (layer_norm, group_norm, batch_norm, cross_entropy, gelu,
silu, embedding, linear) returns NotImplemented: either meta already runs the same aten op
as CUDA, or (batch_norm -> cudnn_batch_norm) the CUDA-side result depends on cuDNN runtime
queries that cannot be answered on meta.  See NOTES.md.
"""
from __future__ import annotations

import contextlib
import re
import threading
import warnings
from typing import Any

import torch
from torch._prims_common import suggest_memory_format

__all__ = [
    "redirect",
    "canonical_name",
    "parse_version",
    "RMS_NORM_NAMES",
    "DROPOUT_NAMES",
    "SOFTMAX_NAMES",
    "LOG_SOFTMAX_NAMES",
    "ensure_fused_rms_norm_backward_meta",
]

# The fused ops `redirect` runs, each one kernel on the target: the trace records it whole, never
# its CompositeImplicitAutograd decomposition.
FUSED_OPS = frozenset({torch.ops.aten._fused_rms_norm.default} if hasattr(torch.ops.aten, "_fused_rms_norm") else ())
# The functions' own names (`func.__name__`), checked before the full name is resolved.
REDIRECTED = frozenset({"rms_norm", "dropout", "softmax", "log_softmax"})
RMS_NORM_NAMES = frozenset({"torch.nn.functional.rms_norm", "torch.rms_norm"})
DROPOUT_NAMES = frozenset({"torch.nn.functional.dropout", "torch.dropout"})
SOFTMAX_NAMES = frozenset(
    {"torch.nn.functional.softmax", "torch.softmax", "torch.Tensor.softmax", "torch.special.softmax"}
)
LOG_SOFTMAX_NAMES = frozenset(
    {"torch.nn.functional.log_softmax", "torch.log_softmax", "torch.Tensor.log_softmax",
     "torch.special.log_softmax"}
)


def canonical_name(func: Any) -> str:
    """Name of a torch callable as ``torch.overrides.resolve_name`` spells it."""
    name = torch.overrides.resolve_name(func)
    if name is None:
        name = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"
    return name


def parse_version(v: Any) -> tuple[int, int]:
    """(major, minor) from '2.13.0+cu128', TorchVersion, (2, 13), (2, 13, 0) ..."""
    if isinstance(v, (tuple, list)):
        return int(v[0]), int(v[1])
    m = re.match(r"\s*(\d+)\.(\d+)", str(v))
    if not m:
        raise ValueError(f"cannot parse torch version {v!r}")
    return int(m.group(1)), int(m.group(2))


# --------------------------------------------------------------------------------------
# Meta kernels for the fused RMSNorm ops (shapes/dtypes of _fused_rms_norm_cuda).
# --------------------------------------------------------------------------------------
def _cuda_acc_dtype(dtype: torch.dtype) -> torch.dtype:
    # at::toAccumulateType(t, /*is_cuda=*/true): Half/BFloat16/Float -> Float, Double -> Double.
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return torch.float32
    raise RuntimeError(f"_fused_rms_norm (CUDA) is not implemented for {dtype}")


def _fused_rms_norm_meta(input, normalized_shape, weight=None, eps=None):
    normalized_shape = list(normalized_shape)
    axis = input.dim() - len(normalized_shape)
    if axis < 0 or list(input.shape[axis:]) != normalized_shape:
        raise RuntimeError("_fused_rms_norm: input shape does not end with normalized_shape")
    if weight is not None and list(weight.shape) != normalized_shape:
        raise RuntimeError("_fused_rms_norm: weight shape != normalized_shape")
    # Y = at::native::empty_like(*X, ..., LEGACY_CONTIGUOUS_MEMORY_FORMAT)
    y = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    # rstd = at::empty({M}, acc_type).view(stat_shape)
    stat_shape = list(input.shape[:axis]) + [1] * len(normalized_shape)
    rstd = torch.empty(stat_shape, dtype=_cuda_acc_dtype(input.dtype), device=input.device)
    return y, rstd


def _fused_rms_norm_backward_meta(grad_out, input, normalized_shape, rstd, weight, output_mask):
    dx = torch.empty(input.shape, dtype=input.dtype, device=input.device) if output_mask[0] else None
    dw = None
    if output_mask[1] and weight is not None:
        dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    return dx, dw


def _impl(lib, name, fn):
    # torch.library.Library.impl refuses Meta kernels for ops that have a
    # CompositeImplicitAutograd kernel (torch/library.py), so go one level down.
    try:
        lib.m.impl(name, "Meta", fn, False)  # (name, key, fn, with_keyset) in 2.13
    except TypeError:
        lib.m.impl(name, "Meta", fn)


_lock = threading.RLock()
_bwd_lib: torch.library.Library | bool | None = None  # kept alive for the life of the process


def _has_fused_rms_norm_op() -> bool:
    try:
        schema = torch.ops.aten._fused_rms_norm.default._schema
    except (AttributeError, RuntimeError):
        return False
    # 2.9+ schema returns (Tensor, Tensor); 2.8's MPS-only op returns a single Tensor.
    return len(schema.returns) == 2 and hasattr(torch.ops.aten, "_fused_rms_norm_backward")


def ensure_fused_rms_norm_backward_meta() -> None:
    """Register (once) a Meta kernel for aten::_fused_rms_norm_backward."""
    global _bwd_lib
    with _lock:
        if _bwd_lib is None:
            if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm_backward", "Meta"):
                _bwd_lib = False  # someone (a future torch) already has one
                return
            lib = torch.library.Library("aten", "IMPL")
            _impl(lib, "_fused_rms_norm_backward", _fused_rms_norm_backward_meta)
            _bwd_lib = lib


@contextlib.contextmanager
def _scoped_fused_rms_norm_meta():
    """Register the forward Meta kernel only while the redirected call runs, so that
    ``torch.rms_norm`` on meta elsewhere keeps its composite (CPU-like) behaviour. The
    registration is process-wide while it lasts: the trace runs in one thread (the lock keeps two
    of its own calls apart), and a registration that fails part-way is undone."""
    with _lock:
        lib = None
        try:
            if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "Meta"):
                lib = torch.library.Library("aten", "IMPL")
                _impl(lib, "_fused_rms_norm", _fused_rms_norm_meta)
            yield
        finally:
            if lib is not None:
                lib._destroy()


# --------------------------------------------------------------------------------------
# argument helpers
# --------------------------------------------------------------------------------------
def _bind(args, kwargs, names, defaults):
    out = dict(defaults)
    for n, a in zip(names, args):
        out[n] = a
    for k, v in (kwargs or {}).items():
        out[k] = v
    return out


def _is_channels_last_suggested(x: torch.Tensor) -> bool:
    return suggest_memory_format(x) in (torch.channels_last, torch.channels_last_3d)


_warned_missing_op = False


# --------------------------------------------------------------------------------------
# rules
# --------------------------------------------------------------------------------------
def _rms_norm(args, kwargs, ver, autocast, allow_non_meta):
    global _warned_missing_op
    if ver < (2, 9):
        return NotImplemented  # no CUDA _fused_rms_norm before 2.9
    b = _bind(args, kwargs, ("input", "normalized_shape", "weight", "eps"), {"weight": None, "eps": None})
    x, shape, w, eps = b["input"], b["normalized_shape"], b["weight"], b["eps"]
    if not isinstance(x, torch.Tensor) or (x.device.type != "meta" and not allow_non_meta):
        return NotImplemented
    if not _has_fused_rms_norm_op():
        if not _warned_missing_op:
            warnings.warn("local torch has no 2.9+-style aten::_fused_rms_norm; "
                          "rms_norm is traced as the composite")
            _warned_missing_op = True
        return NotImplemented
    shape = [int(s) for s in (shape if isinstance(shape, (list, tuple, torch.Size)) else [shape])]
    # shape errors: let the original function raise its own error
    if len(shape) < 1 or x.dim() < len(shape) or list(x.shape[x.dim() - len(shape):]) != shape:
        return NotImplemented
    if w is not None and list(w.shape) != shape:
        return NotImplemented
    # autocast fp32 policy (rms_norm in AT_FORALL_FP32 since 2.12): cached_cast(kFloat, ...)
    if autocast and ver >= (2, 12):
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.to(torch.float32)
        if w is not None and w.dtype in (torch.float16, torch.bfloat16):
            w = w.to(torch.float32)
    # rms_norm_symint fallbacks to rms_norm_composite
    if _is_channels_last_suggested(x):
        return NotImplemented
    if x.is_complex():
        return NotImplemented
    if w is not None and w.dtype != x.dtype:
        return NotImplemented
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return NotImplemented
    if x.device.type == "meta":
        ensure_fused_rms_norm_backward_meta()
        with _scoped_fused_rms_norm_meta():
            y, _rstd = torch.ops.aten._fused_rms_norm(x, shape, w, eps)
        return y
    y, _rstd = torch.ops.aten._fused_rms_norm(x, shape, w, eps)
    return y


def _dropout(name, args, kwargs, ver, allow_non_meta):
    if name == "torch.nn.functional.dropout":
        b = _bind(args, kwargs, ("input", "p", "training", "inplace"), {"p": 0.5, "training": True, "inplace": False})
        x, p, train, inplace = b["input"], b["p"], b["training"], b["inplace"]
        if p < 0.0 or p > 1.0:
            return NotImplemented  # F.dropout raises ValueError itself
    else:  # torch.dropout(input, p, train)
        b = _bind(args, kwargs, ("input", "p", "train"), {})
        x, p, train, inplace = b.get("input"), b.get("p"), b.get("train"), False
        if x is None or p is None or train is None:
            return NotImplemented
    if inplace:
        return NotImplemented  # dropout_ -> _dropout<true> on every device
    if not isinstance(x, torch.Tensor) or (x.device.type != "meta" and not allow_non_meta):
        return NotImplemented
    if x.is_nested:
        return NotImplemented
    # train && is_fused_kernel_acceptable(input, p)
    if train and 0.0 < p < 1.0 and x.numel() > 0:
        return torch.ops.aten.native_dropout(x, float(p), bool(train))[0]
    return NotImplemented


def _softmax_like(name, args, kwargs, ver, allow_non_meta, log):
    if name.startswith("torch.nn.functional."):
        # F.softmax(input, dim=None, _stacklevel=3, dtype=None)
        names = ("input", "dim", "_stacklevel", "dtype")
    else:
        # torch.softmax(input, dim, dtype=None) / Tensor.softmax(self, dim, dtype=None)
        names = ("input", "dim", "dtype")
    b = _bind(args, kwargs, names, {"dim": None, "dtype": None})
    x = b.get("input", b.get("self"))
    dim, dtype = b["dim"], b["dtype"]
    if not isinstance(x, torch.Tensor) or (x.device.type != "meta" and not allow_non_meta):
        return NotImplemented
    if dim is None or not isinstance(dim, int):
        return NotImplemented  # implicit dim / Dimname: leave it to torch
    if x.dtype == torch.float16 and dtype == torch.float32 and not x.is_sparse:
        op = torch.ops.aten._log_softmax if log else torch.ops.aten._softmax
        return op(x, dim, True)
    return NotImplemented


def redirect(func_name: str, args: tuple, kwargs: dict | None, target_device: str,
             torch_version: Any, *, autocast: bool = False, allow_non_meta: bool = False):
    """Run the fused aten op the target device would run, or return NotImplemented.

    See the module docstring for the rules and the torch source they follow.
    """
    dev = torch.device(target_device).type if not isinstance(target_device, str) else target_device.split(":")[0]
    if dev != "cuda":
        return NotImplemented
    ver = parse_version(torch_version)
    kwargs = kwargs or {}
    if func_name in RMS_NORM_NAMES:
        return _rms_norm(args, kwargs, ver, autocast, allow_non_meta)
    if func_name in DROPOUT_NAMES:
        return _dropout(func_name, args, kwargs, ver, allow_non_meta)
    if func_name in SOFTMAX_NAMES:
        return _softmax_like(func_name, args, kwargs, ver, allow_non_meta, log=False)
    if func_name in LOG_SOFTMAX_NAMES:
        return _softmax_like(func_name, args, kwargs, ver, allow_non_meta, log=True)
    return NotImplemented
