"""The fused kernels a CUDA target runs where meta runs a composite (`topoprof.trace.fused_kernels`):
rms_norm, dropout and fp16 softmax reach the fused aten op, with what its autograd node keeps."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from topoprof.trace import fused_kernels as fk

LOCAL = fk.parse_version(torch.__version__)
needs_fused_op = pytest.mark.skipif(
    LOCAL < (2, 9), reason="local torch has no 2.9-style aten::_fused_rms_norm"
)


class Lens(TorchFunctionMode):
    """Minimal lens: ask redirect() first, else run the function."""

    def __init__(self, target="cuda", version="2.13.0", autocast=False):
        super().__init__()
        self.target, self.version, self.autocast = target, version, autocast
        self.redirected = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = fk.canonical_name(func)
        out = fk.redirect(name, args, kwargs, self.target, self.version, autocast=self.autocast)
        if out is not NotImplemented:
            self.redirected.append(name)
            return out
        return func(*args, **kwargs)


class Rec(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def trace(fn, *inputs, lens=None):
    """forward+backward on meta: returns (fwd ops, bwd ops, saved [(shape, dtype)], out)."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    lens = lens or Lens()
    fwd, bwd = Rec(), Rec()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with lens, fwd:
            out = fn(*inputs)
    with bwd:
        out.sum().backward()
    return fwd.ops, bwd.ops, saved, out


def meta(*shape, dtype=torch.float32, grad=True):
    return torch.empty(*shape, device="meta", dtype=dtype).requires_grad_(grad)


# ----------------------------------------------------------------------------- rms_norm
@needs_fused_op
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("use_module", [False, True])
def test_rms_norm_fused_on_meta(dtype, use_module):
    x = meta(4, 8, 64, dtype=dtype)
    if use_module:
        mod = torch.nn.RMSNorm(64, eps=1e-6, device="meta", dtype=dtype)
        fn, inputs, w = mod, (x,), mod.weight
    else:
        w = meta(64, dtype=dtype)
        fn, inputs = (lambda a, b: F.rms_norm(a, [64], b, 1e-6)), (x, w)
    fwd, bwd, saved, out = trace(fn, *inputs)
    assert fwd == ["aten._fused_rms_norm.default"], fwd
    assert out.grad_fn.name() == "FusedRmsNormBackward0"
    assert "aten._fused_rms_norm_backward.default" in bwd
    # derivatives.yaml: saves input, weight, result1 (rstd); rstd float32 [4, 8, 1]
    assert sorted(saved, key=str) == sorted(
        [((4, 8, 64), dtype), ((64,), dtype), ((4, 8, 1), torch.float32)], key=str
    )
    assert not any(d == torch.float32 and s == (4, 8, 64) for s, d in saved) or dtype == torch.float32
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    assert w.grad.shape == w.shape and w.grad.dtype == dtype


@needs_fused_op
def test_rms_norm_no_weight_and_fp64():
    x = meta(2, 3, 16, dtype=torch.float64)
    fwd, bwd, saved, out = trace(lambda a: F.rms_norm(a, [16]), x)
    assert fwd == ["aten._fused_rms_norm.default"]
    assert sorted(saved, key=str) == sorted([((2, 3, 16), torch.float64), ((2, 3, 1), torch.float64)], key=str)
    assert x.grad.shape == x.shape


@needs_fused_op
def test_rms_norm_composite_on_meta_without_redirect():
    # baseline: what meta does on its own (what topoprof would record without the lens)
    x, w = meta(4, 8, 64, dtype=torch.bfloat16), meta(64, dtype=torch.bfloat16)
    fwd, _, saved, out = trace(lambda a, b: F.rms_norm(a, [64], b, 1e-6), x, w, lens=Lens(target="cpu"))
    assert "aten._fused_rms_norm.default" not in fwd
    assert "aten._to_copy.default" in fwd
    assert ((4, 8, 64), torch.float32) in saved  # the fp32 upcast the composite keeps


@needs_fused_op
def test_rms_norm_forward_meta_kernel_is_scoped():
    x, w = meta(4, 8, 64, dtype=torch.bfloat16), meta(64, dtype=torch.bfloat16)
    trace(lambda a, b: F.rms_norm(a, [64], b), x, w)
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "Meta")
    r = Rec()
    with r:
        F.rms_norm(x, [64], w)  # no lens: composite again
    assert "aten._fused_rms_norm.default" not in r.ops


@pytest.mark.parametrize("version", ["2.6.0", "2.7.1", "2.8.0"])
def test_rms_norm_old_versions_not_redirected(version):
    x, w = meta(4, 8, 64, dtype=torch.bfloat16), meta(64, dtype=torch.bfloat16)
    assert fk.redirect("torch.nn.functional.rms_norm", (x, [64], w, 1e-6), {}, "cuda", version) is NotImplemented


@needs_fused_op
def test_rms_norm_fallbacks():
    bf = torch.bfloat16
    # weight dtype != input dtype -> rms_norm_composite (layer_norm.cpp rms_norm_symint)
    x, w32 = meta(4, 8, 64, dtype=bf), meta(64)
    assert fk.redirect("torch.nn.functional.rms_norm", (x, [64], w32), {}, "cuda", "2.13") is NotImplemented
    # channels_last input -> composite
    xc = torch.empty(2, 8, 8, 64, device="meta").to(memory_format=torch.channels_last)
    assert fk.redirect("torch.nn.functional.rms_norm", (xc, [64], None), {}, "cuda", "2.13") is NotImplemented
    # complex -> composite
    xz = torch.empty(2, 8, device="meta", dtype=torch.complex64)
    assert fk.redirect("torch.rms_norm", (xz, [8]), {}, "cuda", "2.13") is NotImplemented
    # bad shape -> leave the error to torch
    assert fk.redirect("torch.rms_norm", (x, [32]), {}, "cuda", "2.13") is NotImplemented
    # target cpu -> never
    assert fk.redirect("torch.rms_norm", (x, [64]), {}, "cpu", "2.13") is NotImplemented


@needs_fused_op
def test_local_torch_agrees_with_fallback_rules():
    """With a Meta kernel installed, torch.rms_norm on meta follows the *local* C++
    rms_norm_symint, so the fallback conditions can be checked against the real code."""
    def goes_fused(x, w):
        r = Rec()
        with fk._scoped_fused_rms_norm_meta(), r, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.rms_norm(x, [x.shape[-1]], w)
        return "aten._fused_rms_norm.default" in r.ops

    bf = torch.bfloat16
    assert goes_fused(meta(4, 8, 64, dtype=bf, grad=False), meta(64, dtype=bf, grad=False))
    assert not goes_fused(meta(4, 8, 64, dtype=bf, grad=False), meta(64, grad=False))
    xc = torch.empty(2, 8, 8, 64, device="meta").to(memory_format=torch.channels_last)
    assert not goes_fused(xc, None)
    assert not goes_fused(torch.empty(2, 8, device="meta", dtype=torch.complex64), None)
    # and redirect agrees on all four
    for x, w, exp in [
        (meta(4, 8, 64, dtype=bf, grad=False), meta(64, dtype=bf, grad=False), True),
        (meta(4, 8, 64, dtype=bf, grad=False), meta(64, grad=False), False),
        (xc, None, False),
    ]:
        got = fk.redirect("torch.rms_norm", (x, [x.shape[-1]], w), {}, "cuda", torch.__version__)
        assert (got is not NotImplemented) == exp


@needs_fused_op
@pytest.mark.parametrize("version,expect_fp32_saved", [("2.11.0", None), ("2.12.1", True), ("2.13.0", True)])
def test_rms_norm_autocast(version, expect_fp32_saved):
    # typical AMP module: fp32 weight, bf16 activation
    x, w = meta(4, 8, 64, dtype=torch.bfloat16), meta(64)
    lens = Lens(version=version, autocast=True)
    fwd, bwd, saved, out = trace(lambda a, b: F.rms_norm(a, [64], b), x, w, lens=lens)
    if expect_fp32_saved:
        # AT_FORALL_FP32 has rms_norm: cast to fp32, then the fused kernel in fp32
        assert "aten._fused_rms_norm.default" in fwd
        assert out.dtype == torch.float32
        assert ((4, 8, 64), torch.float32) in saved and ((4, 8, 1), torch.float32) in saved
    else:
        # no autocast rule before 2.12 -> dtype mismatch -> composite on CUDA as well
        assert "aten._fused_rms_norm.default" not in fwd


@needs_fused_op
def test_meta_kernel_matches_cpu_composite_metadata():
    """The Meta stand-in must give the same shapes/dtypes as the real op's contract."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        xc = torch.randn(3, 5, 32).to(dtype)
        wc = torch.randn(32).to(dtype)
        yc, rc = torch.ops.aten._fused_rms_norm(xc, [32], wc, 1e-6)  # CPU -> rms_norm_composite
        ym, rm = fk._fused_rms_norm_meta(xc.to("meta"), [32], wc.to("meta"), 1e-6)
        assert (ym.shape, ym.dtype) == (yc.shape, yc.dtype)
        assert (rm.shape, rm.dtype) == (rc.shape, rc.dtype)
        assert ym.is_contiguous()


@needs_fused_op
def test_rms_norm_numerics_cpu():
    """The redirected op (run on CPU tensors) matches F.rms_norm in value and gradient."""
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
        x = torch.randn(4, 8, 64, dtype=dtype, requires_grad=True)
        w = torch.randn(64, dtype=dtype, requires_grad=True)
        g = torch.randn(4, 8, 64, dtype=dtype)
        y1 = fk.redirect("torch.nn.functional.rms_norm", (x, [64], w, 1e-6), {}, "cuda", "2.13",
                         allow_non_meta=True)
        gx1, gw1 = torch.autograd.grad(y1, (x, w), g)
        y2 = F.rms_norm(x, [64], w, 1e-6)
        gx2, gw2 = torch.autograd.grad(y2, (x, w), g)
        torch.testing.assert_close(y1, y2, atol=tol, rtol=tol)
        torch.testing.assert_close(gx1, gx2, atol=tol, rtol=tol)
        torch.testing.assert_close(gw1, gw2, atol=tol, rtol=tol)


@needs_fused_op
def test_fused_backward_formula_numerics_cpu():
    """_fused_rms_norm_backward's python decomposition (the meta kernel torch itself
    registers) matches autograd of the composite on CPU."""
    from torch._decomp import decomposition_table

    dec = decomposition_table[torch.ops.aten._fused_rms_norm_backward.default]
    torch.manual_seed(0)
    x = torch.randn(4, 8, 64, dtype=torch.float64, requires_grad=True)
    w = torch.randn(64, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 8, 64, dtype=torch.float64)
    y, rstd = torch.ops.aten._fused_rms_norm(x, [64], w, 1e-6)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    dx, dw = dec(g, x.detach(), [64], rstd.detach(), w.detach(), [True, True])
    torch.testing.assert_close(dx, gx)
    torch.testing.assert_close(dw, gw)


# ----------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("use_module", [False, True])
def test_dropout_native_on_meta(dtype, use_module):
    x = meta(4, 8, 64, dtype=dtype)
    fn = torch.nn.Dropout(0.1) if use_module else (lambda a: F.dropout(a, 0.1, True))
    fwd, bwd, saved, out = trace(fn, x)
    assert fwd == ["aten.native_dropout.default"], fwd
    assert out.grad_fn.name() == "NativeDropoutBackward0"
    assert saved == [((4, 8, 64), torch.bool)]  # the bool mask, not an input-dtype noise tensor
    assert "aten.native_dropout_backward.default" in bwd


def test_dropout_not_redirected_cases():
    x = meta(4, 8)
    for args, kw in [((x, 0.1, False), {}), ((x, 0.0, True), {}), ((x, 1.0, True), {}),
                     ((x,), {"p": 0.1, "inplace": True})]:
        assert fk.redirect("torch.nn.functional.dropout", args, kw, "cuda", "2.13") is NotImplemented
    assert fk.redirect("torch.dropout", (meta(0, 3), 0.1, True), {}, "cuda", "2.13") is NotImplemented
    assert fk.redirect("torch.nn.functional.dropout", (x, 0.1, True), {}, "cpu", "2.13") is NotImplemented
    # default p=0.5, training=True -> fused
    assert fk.redirect("torch.nn.functional.dropout", (x,), {}, "cuda", "2.6.0") is not NotImplemented
    assert fk.redirect("torch.dropout", (x, 0.3, True), {}, "cuda", "2.15.0") is not NotImplemented


def test_dropout_composite_baseline_meta():
    x = meta(4, 8, 64, dtype=torch.bfloat16)
    fwd, _, saved, _ = trace(lambda a: F.dropout(a, 0.1, True), x, lens=Lens(target="cpu"))
    assert "aten.native_dropout.default" not in fwd
    assert saved == [((4, 8, 64), torch.bfloat16)]  # composite keeps an input-dtype noise


def test_dropout_numerics_cpu():
    torch.manual_seed(0)
    x = torch.randn(1000, 64, requires_grad=True)
    p = 0.25
    y = fk.redirect("torch.nn.functional.dropout", (x, p, True), {}, "cuda", "2.13", allow_non_meta=True)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    frac = kept.float().mean().item()
    assert abs(frac - (1 - p)) < 0.02
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, kept.to(g.dtype) / (1 - p))


# ----------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("log", [False, True])
def test_softmax_half_to_float(log):
    x = meta(4, 64, dtype=torch.float16)
    f = F.log_softmax if log else F.softmax
    fwd, bwd, saved, out = trace(lambda a: f(a, dim=-1, dtype=torch.float32), x)
    op = "aten._log_softmax.default" if log else "aten._softmax.default"
    assert fwd == [op], fwd  # no _to_copy first
    assert out.dtype == torch.float32
    assert saved == [((4, 64), torch.float32)]
    assert x.grad.dtype == torch.float16
    # composite baseline: an fp32 copy first
    fwd2, *_ = trace(lambda a: f(a, dim=-1, dtype=torch.float32), meta(4, 64, dtype=torch.float16),
                     lens=Lens(target="cpu"))
    assert fwd2 == ["aten._to_copy.default", op]


def test_softmax_not_redirected_for_bf16_or_no_dtype():
    xb = meta(4, 64, dtype=torch.bfloat16)
    redirected = fk.redirect("torch.nn.functional.softmax", (xb, -1), {"dtype": torch.float32}, "cuda", "2.13")
    assert redirected is NotImplemented
    xh = meta(4, 64, dtype=torch.float16)
    assert fk.redirect("torch.nn.functional.softmax", (xh, -1), {}, "cuda", "2.13") is NotImplemented
    assert fk.redirect("torch.softmax", (xh, -1, torch.float32), {}, "cuda", "2.13") is not NotImplemented
    assert fk.redirect("torch.Tensor.softmax", (xh, -1), {"dtype": torch.float32}, "cuda", "2.13") is not NotImplemented


# ----------------------------------------------------------------------------- misc
def test_unlisted_functions_not_redirected():
    x = meta(4, 8, 64)
    for name in ["torch.nn.functional.layer_norm", "torch.nn.functional.gelu", "torch.nn.functional.linear",
                 "torch.nn.functional.cross_entropy", "torch.nn.functional.batch_norm"]:
        assert fk.redirect(name, (x,), {}, "cuda", "2.13") is NotImplemented


def test_parse_version():
    assert fk.parse_version("2.13.0+cpu") == (2, 13)
    assert fk.parse_version(torch.__version__) == LOCAL
    assert fk.parse_version((2, 9, 1)) == (2, 9)
