"""What each op of an op trace (`topoprof/trace/op_trace.py`) is, for pricing it from a device profile
(`topoprof.model.compute.profiled`): a GEMM (its products' m, n, k), a fused attention kernel
(its sequence, head dim and causality), or a memory-bound op of one of the profile's memory kinds
(`topoprof.model.compute.profile.MEMORY_KINDS`); and whether autocast wraps it. No torch here.

- GEMMs: `aten.mm`/`addmm` multiply an m x k by a k x n matrix; `bmm`/`baddbmm` `batch` of them.
  A convolution is its implicit GEMM (cuDNN's implicit-GEMM kernels): M = images x output
  pixels, N = output channels per group, K = input channels per group x kernel pixels, one per
  group; its backward is the two products of a linear layer's backward, the input gradient
  (M x K, over N) and the weight gradient (N x K, over M), each of the forward's FLOPs
  (`convolution_backward` computes the input gradient only where the input needs one: with the
  FLOPs of one product it is taken as the weight gradient, as for a network's first layer).
- Attention: the fused kernels' FLOPs as `torch.utils.flop_counter` counts them (the trace's):
  forward 4 b h s^2 d (two matmuls), backward 10 b h s^2 d (five), causal or not. A profile counts
  forward + backward as 3.5 x 4 b h s^2 d, halved when causal (`profile_facts.SDPA_CONVENTION`),
  so an op's FLOPs in the profile's count are the trace's, halved when causal: the same 14 b h
  s^2 d split 4 : 10 between the forward and the backward op, each over the profile's rate.
- Memory-bound: by the aten op's name (`MEMORY_KIND`); a cast (`_to_copy` that changes the
  element size) is an upcast (the profile reads a downcast as its nearest measured kind); an op
  not in the table goes to the profile by its own name, which reads it as its nearest kind or
  a generic elementwise op and says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from topoprof.model.compute.roofline_terms import CONV_BACKWARD, CONV_FORWARD
from topoprof.specs.traced_pass import TracedOp, TracedPass

ATTENTION_PREFIX = "aten._scaled_dot_product_"
_GEMM = ("mm", "addmm", "bmm", "baddbmm")

# aten op (its name without "aten." and the overload) -> the profile's memory kind
MEMORY_KIND = {
    **dict.fromkeys(("clone", "copy_", "cat", "stack", "contiguous", "embedding", "slice_backward",
                     "select_backward", "index_select", "gather", "constant_pad_nd", "repeat"), "copy"),
    **dict.fromkeys(("add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "where", "addcmul", "addcdiv",
                     "lerp", "neg", "masked_fill", "fill_", "zero_", "ones_like", "zeros_like", "full", "arange",
                     "rsub", "pow", "sqrt", "rsqrt", "exp", "log"), "add"),
    **dict.fromkeys(("gelu", "gelu_backward", "silu", "silu_backward", "relu", "relu_", "threshold_backward",
                     "tanh", "tanh_backward", "sigmoid", "sigmoid_backward", "native_dropout",
                     "native_dropout_backward", "hardtanh", "hardtanh_backward"), "gelu"),
    **dict.fromkeys(("native_layer_norm", "native_layer_norm_backward", "native_group_norm",
                     "native_group_norm_backward", "native_batch_norm", "native_batch_norm_backward",
                     "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                     "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "cudnn_batch_norm_backward"),
                    "layer_norm"),
    **dict.fromkeys(("_fused_rms_norm", "_fused_rms_norm_backward"), "rms_norm"),
    **dict.fromkeys(("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
                     "logsumexp"), "softmax"),
}
# kinds whose kernel reduces over a dimension (Inductor fuses across them only where the sizes agree)
REDUCING = frozenset({"layer_norm", "rms_norm", "softmax"})
_REDUCTION_OPS = ("sum", "mean", "amax", "amin", "max", "min", "nll_loss_forward", "nll_loss_backward",
                  "var_mean", "norm", "embedding_dense_backward")


def is_conv(op: TracedOp) -> bool:
    """A convolution, forward or backward."""
    return base_name(op) in CONV_FORWARD + CONV_BACKWARD


def base_name(op: TracedOp) -> str:
    """'aten.native_layer_norm.default' -> 'native_layer_norm'."""
    parts = op.name.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else op.name


@dataclass(frozen=True)
class Product:
    """One matrix product of a GEMM-like op: `batch` products of an m x k by a k x n matrix."""

    m: int
    n: int
    k: int
    batch: int
    flops: float


@dataclass(frozen=True)
class Attention:
    seq: int
    head_dim: int
    causal: bool
    flops: float           # in the profile's count: the trace's, halved when causal


@dataclass(frozen=True)
class GemmShape:
    """A GEMM-like op as `batch` products of an m x k by a k x n matrix. A convolution is its
    implicit GEMM per group: m = images x output pixels, n = output channels per group, k = the
    weight's input channels per group x kernel, batch = groups."""

    m: int
    n: int
    k: int
    batch: int


def gemm_shape(op: TracedOp) -> GemmShape | None:
    """The one derivation of a matmul's or convolution's GEMM dimensions from its input shapes
    (a convolution's forward reads m from its FLOPs, 2 m n k per group), or None for any other op."""
    name, shapes = base_name(op), op.shapes or []
    mats = [s for s in shapes if len(s) >= 2]
    if name in _GEMM and len(mats) >= 2:
        a, b = mats[-2], mats[-1]
        return GemmShape(a[-2], b[-1], a[-1], (math.prod(a[:-2]) or 1) if name in ("bmm", "baddbmm") else 1)
    if name not in CONV_FORWARD + CONV_BACKWARD or len(shapes) < 2:
        return None
    backward = name in CONV_BACKWARD
    if backward and len(shapes) < 3:
        return None
    data, weight = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])
    if len(weight) < 3 or len(data) < 3 or weight[1] <= 0:
        return None
    groups = max(1, data[1] // weight[1])
    n, k = weight[0] // groups, math.prod(weight[1:])
    m = math.prod(shapes[0]) // max(1, weight[0]) if backward else op.flops // max(1, 2 * weight[0] * k)
    return GemmShape(max(1, m), max(1, n), max(1, k), groups)


def gemm_products(op: TracedOp) -> list[Product] | None:
    """The products of a GEMM-like op (module docstring), or None for any other op: a
    convolution's backward is its input's and its weight's gradients, each a product of the
    forward's dimensions in another order."""
    flops = op.flops
    shape = gemm_shape(op) if flops > 0 else None
    if shape is None:
        return None
    m, n, k, batch = shape.m, shape.n, shape.k, shape.batch
    if base_name(op) not in CONV_BACKWARD:
        return [Product(m, n, k, batch, flops)]
    one = 2 * m * n * k * batch   # the FLOPs of one product, as the forward's
    if one > 0 and round(flops / one) == 2:
        return [Product(m, k, n, batch, flops / 2), Product(n, k, m, batch, flops / 2)]
    return [Product(n, k, m, batch, flops)]


def attention(op: TracedOp) -> Attention | None:
    """A fused attention op's sequence, head dim and causality, with its FLOPs in the profile's
    count; None for any other op."""
    if not op.name.startswith(ATTENTION_PREFIX) or op.flops <= 0:
        return None
    shapes = [s for s in op.shapes or [] if len(s) == 4]
    q = shapes[1] if "_backward" in op.name and len(shapes) > 1 else (shapes[0] if shapes else None)
    if q is None:
        return None
    causal = bool(op.causal)
    return Attention(q[-2], q[-1], causal, op.flops / 2 if causal else op.flops)


def memory_kind(op: TracedOp) -> str:
    """The profile's memory kind of a memory-bound op (module docstring); an op not in the table
    by its own name, which the profile reads as its nearest kind."""
    name = base_name(op)
    if name == "_to_copy":
        return "copy" if op.bytes_read == op.bytes_written else "upcast"
    return MEMORY_KIND.get(name, name)


def reduces(op: TracedOp) -> bool:
    """The op reduces over a dimension (a norm, a softmax, a sum, the loss)."""
    return memory_kind(op) in REDUCING or base_name(op) in _REDUCTION_OPS


def runs_as_forward(op: TracedOp) -> bool:
    """A forward op, or one activation checkpointing recomputes in backward: the recompute runs
    the block's forward again with grad mode and the forward's autocast state restored
    (torch/utils/checkpoint.py), so the host pays what the forward paid for it."""
    return op.phase == "forward" or bool(op.recompute)


def autocast_wrapped(op: TracedOp, trace: TracedPass) -> bool:
    """A forward op that CUDA autocast runs in 16-bit (its lower_precision_fp list: the matmuls,
    convolutions and attention), where the trace ran for a 16-bit GPU target."""
    target = trace.target
    if not runs_as_forward(op) or target is None or target.device != "cuda" or target.precision not in ("bf16", "fp16"):
        return False
    name = base_name(op)
    return name in _GEMM + CONV_FORWARD or op.name.startswith(ATTENTION_PREFIX)
