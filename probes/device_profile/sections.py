"""The sections of the device profile (`probes/device_profile/profile_worker.py`): each measures its part of the
document on the profile's run (device, plan, clock, budget) and returns a line of progress."""
from __future__ import annotations

import time

from topoprof.probes.device_profile.clock import HOST_BLOCK_S, autorange
from topoprof.probes.device_profile.points import gemm_shapes, sdpa_cases
from topoprof.probes.device_profile.timing_run import HOST_MAX_CALLS, ProfileRun

ADAMW_WORDS = 7   # fp32 param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written
# bytes read + written per call over the input's bytes (as shared/gpu-facts/opbench.py counts);
# the upcast reads bf16 (2 B) and writes fp32 (4 B) per element: see _memory_ops
PASSES = {"copy": 2, "add": 3, "gelu": 2, "layer_norm": 2, "rms_norm": 2, "softmax": 2}
ROW = 1024        # the last dimension of a memory op's tensor (the normalized one)


# ---- sections: each fills its part of the document and returns a line of progress -------------

def _span(rates: list[float], unit: str) -> str:
    def si(x: float) -> str:
        scale, prefix = next(((s, p) for s, p in ((1e12, "T"), (1e9, "G"), (1e6, "M")) if x >= s), (1.0, ""))
        return f"{x / scale:.3g} {prefix}{unit}"
    lo, hi = min(rates), max(rates)
    return si(lo) if lo == hi else f"{si(lo)} .. {si(hi)}"


def _host_costs(run: ProfileRun, out: dict) -> str:
    # lazy: imports torch; in the profile's worker, never when the CLI reads this module
    from topoprof.trace.selective_cost import WHAT as SELECTIVE_WHAT

    torch, seconds, how = run.torch, {}, {}
    x, w = run.randn(64, dtype=torch.float32), run.randn(64, dtype=torch.float32, grad=True)
    measured = {
        "op": (lambda: run.host_time(lambda: torch.add(x, x)), "torch.add of 64 elements, no autograd"),
        "autograd_forward": (lambda: run.host_time(lambda: torch.mul(w, x)), "torch.mul recorded by autograd"),
        "autograd_backward_node": (lambda: _backward_node_s(run), "a chain of N recorded torch.mul: backward time / N"),
        "autocast_op": (lambda: _autocast_op_s(run), ("torch.mm of an fp32 1x8 input by an 8x8 leaf weight under "
                                                      "bf16 autocast: the input's cast and the mm (the weight's cast "
                                                      "cached)")),
        "selective_checkpoint_op": (lambda: _selective_checkpoint_op_s(run, w, x), SELECTIVE_WHAT),
        "optimizer_per_tensor": (lambda: _optimizer_per_tensor_s(run), (
            f"AdamW ({'fused' if run.cuda else 'foreach'}) step over {run.plan.optimizer_tensors} tensors of 64 "
            "elements: step time / tensors")),
    }
    for kind, (measure, text) in measured.items():
        # every kind, whatever the budget: each prices ops no other kind stands for, and all of them
        # together take a few seconds (blocks of HOST_BLOCK_S) even on a loaded machine
        value = run.point("host_costs", kind, measure, budgeted=False)
        if value is not None:
            seconds[kind], how[kind] = value, f"measured: {text}"
    out["host_costs"] = {"seconds_per_op": seconds, "how": how}
    return ", ".join(f"{k} {v * 1e6:.3g} us" for k, v in seconds.items())


def _backward_node_s(run: ProfileRun) -> float:
    torch = run.torch
    leaf = run.randn(1, dtype=torch.float32, grad=True)

    def chain_backward(n: int) -> float:
        z = leaf
        for _ in range(n):
            z = z * 1.0001
        run.clock.sync()
        t0 = time.perf_counter()
        z.backward()
        run.clock.sync()
        return time.perf_counter() - t0

    with torch.enable_grad():
        return run.pick(autorange(chain_backward, HOST_BLOCK_S, 10 * HOST_BLOCK_S, max_calls=HOST_MAX_CALLS))


def _selective_checkpoint_op_s(run: ProfileRun, w, x) -> float:
    """autograd_forward's op under selective op checkpointing's modes, per op (forward and
    recompute alike: `run_under_selective_op`), blocks of them timed as a host block is."""
    from topoprof.zoo.checkpoint_wrap import run_under_selective_op  # lazy: imports torch; the worker's alone

    torch = run.torch

    def blocks(n: int) -> float:
        run.clock.sync()
        t0 = time.perf_counter()
        ops = run_under_selective_op(lambda: torch.mul(w, x), n)
        run.clock.sync()
        return (time.perf_counter() - t0) / ops * n  # autorange divides by n: seconds per op

    with torch.enable_grad():
        return run.pick(autorange(blocks, HOST_BLOCK_S, 10 * HOST_BLOCK_S, max_calls=HOST_MAX_CALLS))


def _autocast_op_s(run: ProfileRun) -> float:
    torch = run.torch
    a, weight = run.randn(1, 8, dtype=torch.float32), run.randn(8, 8, dtype=torch.float32, grad=True)
    with torch.autocast(device_type="cuda" if run.cuda else "cpu", dtype=torch.bfloat16):
        return run.host_time(lambda: torch.mm(a, weight))


def _optimizer_per_tensor_s(run: ProfileRun) -> float:
    torch, count = run.torch, run.plan.optimizer_tensors
    params = [torch.zeros(64, device=run.device, requires_grad=True) for _ in range(count)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = _adamw(run, params)
    return run.host_time(opt.step) / count


def _adamw(run: ProfileRun, params):
    kind = {"fused": True} if run.cuda else {"foreach": True}
    return run.torch.optim.AdamW(params, lr=1e-4, **kind)


def _gemm(run: ProfileRun, out: dict) -> str:
    torch, points = run.torch, []
    dtype = str(run.dtype).split(".")[-1]
    for m, n, k in gemm_shapes(run.plan):
        def measure(m=m, n=n, k=k):
            a, b, c = run.randn(m, k), run.randn(k, n), torch.empty(m, n, device=run.device, dtype=run.dtype)
            return run.device_time(lambda: torch.mm(a, b, out=c))
        s = run.point("gemm", f"{m}x{n}x{k}", measure)
        if s is not None:
            points.append({"m": m, "n": n, "k": k, "dtype": dtype, "seconds": s, "flops_per_s": 2 * m * n * k / s})
    out["gemm"] = points
    rates = [p["flops_per_s"] for p in points]
    return f"{len(points)} shapes, {_span(rates, 'FLOP/s')}" if rates else "nothing"


def _memory_ops(run: ProfileRun, x, y, xb, g) -> dict:
    """kind -> (call, bytes read + written per call)."""
    torch, F = run.torch, run.torch.nn.functional
    nbytes = x.numel() * x.element_size()
    rms = ((lambda: F.rms_norm(x, (ROW,), g)) if hasattr(F, "rms_norm")  # torch >= 2.4
           else (lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g))
    calls = {"copy": lambda: x.clone(), "add": lambda: x + y, "gelu": lambda: F.gelu(x),
             "layer_norm": lambda: F.layer_norm(x, (ROW,)), "rms_norm": rms, "softmax": lambda: torch.softmax(x, -1)}
    ops = {kind: (call, PASSES[kind] * nbytes) for kind, call in calls.items()}
    ops["upcast"] = (lambda: xb.float(), xb.numel() * (2 + 4))
    return ops


def _memory(run: ProfileRun, out: dict) -> str:
    torch, points = run.torch, []
    dtype = str(run.dtype).split(".")[-1]
    for size in run.plan.memory_bytes:
        rows = max(1, size // (ROW * torch.empty((), dtype=run.dtype).element_size()))
        rows_bf16 = max(1, size // (ROW * 2))   # the upcast's bf16 input: the same bytes as the others' input

        def made(rows=rows, rows_bf16=rows_bf16):
            return (run.randn(rows, ROW), run.randn(rows, ROW), run.randn(rows_bf16, ROW, dtype=torch.bfloat16),
                    run.randn(ROW))

        tensors = run.point("memory", f"{size} B tensors", made, counts=False)
        if tensors is None:
            continue
        for kind, (call, moved) in _memory_ops(run, *tensors).items():
            def timed(call=call):
                return run.device_time(call)

            s = run.point("memory", f"{kind} of {size} B", timed)
            if s is not None:
                source = tensors[2] if kind == "upcast" else tensors[0]
                points.append({"kind": kind, "dtype": dtype,   # the profile's dtype; the upcast's input is bf16
                               "tensor_bytes": source.numel() * source.element_size(), "bytes_moved": moved,
                               "seconds": s, "bytes_per_s": moved / s})
        del tensors
        run.clock.release()
    out["memory"] = points
    rates = [p["bytes_per_s"] for p in points]
    return f"{len(points)} points, {_span(rates, 'B/s')}" if rates else "nothing"


def _sdpa(run: ProfileRun, out: dict) -> str:
    torch, points = run.torch, []
    dtype = str(run.dtype).split(".")[-1]
    for b, h, t, d, causal in sdpa_cases(run.plan):
        def measure(b=b, h=h, t=t, d=d, causal=causal):
            q, k, v = (run.randn(b, h, t, d, grad=True) for _ in range(3))
            grad = run.randn(b, h, t, d)

            def step():
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.autograd.grad(o, (q, k, v), grad)
            return run.device_time(step)
        s = run.point("sdpa", f"b{b} h{h} t{t} d{d}{' causal' if causal else ''}", measure)
        if s is not None:
            flops = 3.5 * 4 * b * h * t * t * d * (0.5 if causal else 1)
            points.append({"seq": t, "head_dim": d, "causal": causal, "batch": b, "heads": h, "dtype": dtype,
                           "seconds": s, "flops_per_s": flops / s})
    out["sdpa"] = points
    rates = [p["flops_per_s"] for p in points]
    return f"{len(points)} points, {_span(rates, 'FLOP/s')}" if rates else "nothing"


def _optimizer(run: ProfileRun, out: dict) -> str:
    torch, numel = run.torch, run.plan.optimizer_params

    def measure():
        p = torch.zeros(numel, device=run.device, dtype=torch.float32, requires_grad=True)
        p.grad = torch.ones_like(p)
        return run.device_time(_adamw(run, [p]).step)
    s = run.point("optimizer", f"AdamW over {numel} parameters", measure)
    moved = ADAMW_WORDS * 4 * numel
    out["optimizer"] = None if s is None else {
        "name": f"AdamW ({'fused' if run.cuda else 'foreach'})", "params": numel, "bytes_per_step": moved,
        "seconds": s, "bytes_per_s": moved / s}
    return _span([moved / s], "B/s") if s else "nothing"


def _cpu(run: ProfileRun, out: dict) -> str:
    """What probes/device_profile/device_costs.py measures beyond this profile: fresh pages, convolutions."""
    from topoprof.probes.device_profile import device_costs  # lazy: imports torch; in the profile's worker alone

    repeats = run.plan.cpu_repeats
    pages = run.point("cpu", "fresh pages", lambda: device_costs.fresh_page_cost(repeats))
    convs = run.point("cpu", "convolution host cost", lambda: device_costs.conv_host_costs(repeats))
    if pages is not None:
        out["cpu"] = {"fresh_page_s_per_byte": pages["fresh_page_s_per_byte"],
                      "fresh_page_min_bytes": pages["fresh_page_min_bytes"],
                      "how": pages["how"]["fresh_page_s_per_byte"]}
    if convs is not None:
        for kind, key in (("conv_forward", "host_conv_forward_s"), ("conv_backward", "host_conv_backward_s")):
            out["host_costs"]["seconds_per_op"][kind] = convs[key]
            out["host_costs"]["how"][kind] = convs["how"][key]
    return ", ".join(f"{what} {'measured' if got is not None else 'skipped'}"
                     for what, got in (("fresh pages", pages), ("convolutions", convs)))


SECTIONS = {"host_costs": _host_costs, "gemm": _gemm, "memory": _memory, "sdpa": _sdpa, "optimizer": _optimizer,
            "cpu": _cpu}
