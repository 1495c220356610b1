"""The roofline over an op trace (`topoprof.model.compute.roofline`) and the compute it gives the step-time
model: hand-computed traces, the composition on a GPU (a queue behind the host) and a CPU (inline),
the ends of each cited range on the datasheet path, and the modelled compute as `Compute` carries
it. Pricing from a device profile: tests/test_profiled.py. No torch."""
from __future__ import annotations

import dataclasses
import math

import pytest

from tests.helpers.profiles import modelled
from topoprof.model.compute import roofline as rl
from topoprof.model.compute.op_kinds import gemm_shape
from topoprof.model.compute.roofline import DeviceModel, price, roofline
from topoprof.model.compute.roofline_terms import Span, measured, quantization
from topoprof.specs.traced_pass import TracedOp, TracedPass


def _op(name="aten.add.Tensor", phase="forward", flops=0, read=0, written=0, view=False, **more):
    op = {"name": name, "phase": phase, "flops": flops, "view": view, "bytes_read": read, "bytes_written": written}
    if not view:
        op.setdefault("outputs", [written])
        op.setdefault("inplace", False)
    return TracedOp(**{**op, **more})


def _device(asynchronous=False, host=1e-6, peak=1e12, bw=1e11, sms=None, **more) -> DeviceModel:
    return DeviceModel("test", peak, "given", measured(bw, "given"), measured(1.0, "given"), measured(1.0, "given"),
                       {"forward": measured(host, "given"), "backward": measured(host, "given")}, asynchronous,
                       sms=sms, **more)


def test_each_op_is_its_larger_of_compute_and_memory_plus_its_host_cost_inline():
    # a matmul of 2e9 FLOPs at 1e12 FLOP/s (2 ms) reading 1e8 B at 1e11 B/s (1 ms): compute-bound;
    # a copy of 3e8 B (3 ms); a view: nothing. Inline (a CPU): host cost + device time, op by op.
    trace = TracedPass(ops=[_op("aten.mm.default", flops=2_000_000_000, read=60_000_000, written=40_000_000,
                                shapes=[[1000, 1000], [1000, 1000]]),
                            _op("aten.transpose.int", view=True),
                            _op("aten.copy_.default", phase="backward", read=150_000_000, written=150_000_000)])
    fast = price(trace, _device(), "fast")
    slow = price(trace, _device(), "slow")
    assert fast.seconds == pytest.approx(2e-6 + 2e-3 + 3e-3)        # max(2, 1) ms + 3 ms
    assert slow.seconds == pytest.approx(2e-6 + (2e-3 + 1e-3) + 3e-3)  # compute and memory not overlapped
    assert price(trace, _device(), "middle").seconds == pytest.approx(2e-6 + math.sqrt(2e-3 * 3e-3) + 3e-3)
    assert fast.forward_s == pytest.approx(1e-6 + 2e-3)
    assert fast.by_kind == {"matmul": pytest.approx(2e-3), "attention": 0.0, "memory": pytest.approx(3e-3)}


def test_a_gpu_queue_is_bound_by_the_host_or_by_the_device():
    small = [_op(read=1000) for _ in range(100)]  # 100 tiny kernels of 10 ns each
    host_bound = price(TracedPass(ops=small), _device(asynchronous=True, host=10e-6), "fast")
    assert host_bound.seconds == pytest.approx(100 * 10e-6 + 1e-8)  # the device waits for the host
    big = [_op(read=10**9) for _ in range(3)]  # 10 ms each
    device_bound = price(TracedPass(ops=big), _device(asynchronous=True, host=10e-6), "fast")
    assert device_bound.seconds == pytest.approx(10e-6 + 3 * 10e-3)  # the host runs ahead
    for trace in (TracedPass(ops=small), TracedPass(ops=big), TracedPass(ops=small + big + small)):
        t = price(trace, _device(asynchronous=True, host=10e-6), "fast")
        assert max(t.host_s, t.device_s) <= t.seconds + 1e-15 <= t.host_s + t.device_s + 2e-15


def test_the_waves_and_tiles_of_nvidias_matmul_guide():
    # 256 x 128 tiles, 108 SMs (the guide's A100 example): a 2304 x 1536 output is 9 x 12 = 108
    # tiles, one full wave; one row of tiles more (2560) is 120 tiles, 2 waves of which 1.11 used
    assert quantization(2304, 1536, 1, 108, (256, 128)) == pytest.approx(1.0)
    assert quantization(2560, 1536, 1, 108, (256, 128)) == pytest.approx(120 / 108 / 2)
    # a 257-row output wastes almost a whole row of tiles
    assert quantization(257, 128, 1, 1000, (256, 128)) == pytest.approx(257 / 512 * 2 / 1000 / 1)
    assert quantization(100, 100, 1, None, (256, 128)) == 1.0


@pytest.mark.parametrize("op, dims", [
    (_op("aten.mm.default", flops=2 * 64 * 32 * 16, shapes=[[64, 32], [32, 16]]), (64, 16, 1)),
    (_op("aten.addmm.default", flops=2 * 64 * 32 * 16, shapes=[[16], [64, 32], [32, 16]]), (64, 16, 1)),
    (_op("aten.bmm.default", flops=2 * 8 * 64 * 32 * 16, shapes=[[8, 64, 32], [8, 32, 16]]), (64, 16, 8)),
    # a 3x3 convolution, 2 images of 8 x 10 x 10 into 16 channels at 10 x 10: M = 2 x 100 pixels
    (_op("aten.convolution.default", flops=2 * 2 * 16 * 8 * 9 * 100, shapes=[[2, 8, 10, 10], [16, 8, 3, 3]]),
     (200, 16, 1)),
    # grouped (4 groups): per group 4 output channels; its backward reads M off the grad output
    (_op("aten.convolution.default", flops=2 * 2 * 16 * 2 * 9 * 100, shapes=[[2, 8, 10, 10], [16, 2, 3, 3]]),
     (200, 4, 4)),
    (_op("aten.convolution_backward.default", flops=1, shapes=[[2, 16, 10, 10], [2, 8, 10, 10], [16, 2, 3, 3]]),
     (200, 4, 4)),
    (_op("aten.add.Tensor"), None),
])
def test_gemm_dimensions_from_the_traced_shapes(op, dims):
    shape = gemm_shape(op)
    assert (None if shape is None else (shape.m, shape.n, shape.batch)) == dims


def test_causal_attention_counts_half_its_flops_at_the_attention_efficiency():
    dev = DeviceModel("t", 1e12, "given", measured(1e20, "given"), measured(1.0, "given"), measured(0.5, "given"),
                      {"forward": measured(0.0, "given"), "backward": measured(0.0, "given")}, False)
    attn = _op("aten._scaled_dot_product_flash_attention.default", flops=10**9, causal=True, shapes=[[1, 1, 1, 1]] * 3)
    assert price(TracedPass(ops=[attn]), dev, "fast").seconds == pytest.approx(0.5e9 / (1e12 * 0.5))
    full = dataclasses.replace(attn, causal=False)
    assert price(TracedPass(ops=[full]), dev, "fast").seconds == pytest.approx(1e9 / (1e12 * 0.5))


def _gpu_trace():
    mm = _op("aten.mm.default", flops=2 * 1000 * 768 * 768, read=2 * (1000 * 768 + 768 * 768), written=2 * 1000 * 768,
             shapes=[[1000, 768], [768, 768]])
    return TracedPass(ops=[mm, _op(read=3_000_000, written=3_000_000), _op("aten.t.default", view=True),
                           dataclasses.replace(mm, phase="backward"), _op(phase="backward", read=10**6, written=10**6)])


def test_a_gpus_ends_are_its_cited_ranges():
    from topoprof.model.compute.datasheet import lookup_gpu

    dev = rl.gpu_device(lookup_gpu("h100-sxm"), "bf16")
    result = roofline(_gpu_trace(), dev)
    fast, middle, slow = result.seconds
    assert fast < middle < slow
    assert result.kernels == 4 and result.views == 1
    # the fast end: every kernel 7 us of host at least, the device at the datasheet's own figures
    assert fast >= 4 * rl.EAGER_HOST_COST_S.low
    slow_end = price(_gpu_trace(), dev, "slow")
    assert slow_end.seconds >= max(slow_end.host_s, slow_end.device_s)
    compiled = roofline(_gpu_trace(), rl.gpu_device(lookup_gpu("h100-sxm"), "bf16", compiled=True))
    assert all(c < e for c, e in zip(compiled.seconds, result.seconds))  # the per-op host cost goes
    assert compiled.kernels == 4 and any("per kernel 1.1-3.8 us" in b for b in compiled.basis)
    assert 0 < result.backward_fraction < 1
    with pytest.raises(Exception, match="no bf16"):
        rl.gpu_device(lookup_gpu("v100-sxm2"), "bf16")


def test_every_constant_is_a_range_with_a_source():
    for span in (rl.GEMM_EFFICIENCY, rl.ATTENTION_EFFICIENCY, rl.EAGER_HOST_COST_S, rl.COMPILED_HOST_COST_S):
        assert span.low < span.high and span.basis
    assert Span(1.0, 4.0, "x").at("middle", True) == 2.0
    assert Span(1.0, 4.0, "x").at("fast", True) == 4.0 and Span(1.0, 4.0, "x").at("fast", False) == 1.0
    with pytest.raises(Exception):
        Span(2.0, 1.0, "backwards")


# ---- the modelled compute in the step-time model --------------------------------------------

def _inputs(**compute):
    from topoprof.model.comm.collectives import RingComm
    from topoprof.model.compute.timing import Compute
    from topoprof.model.strategies.job import Cluster, ModelInputs, Workload

    return ModelInputs(Workload.from_params(1_000_000, tokens_per_micro_batch=1000),
                       Compute(gpu="NVIDIA A100-SXM4-80GB", **compute), Cluster(RingComm(10.0, 0.0, 2), 1, 2))


MODELLED = {"modelled": modelled((0.01, 0.02, 0.04), 0.6, "its ops", summary="s")}


def test_modelled_compute_is_the_middle_and_its_ends_bound_every_step():
    from topoprof.model.strategies.predict import predict
    from topoprof.model.strategies.resolve import resolve

    res = resolve(_inputs(**MODELLED))
    assert res.micro_batch_s == 0.02 and res.backward_s == pytest.approx(0.012)
    assert res.echo["micro_batch_time_range_s"][0] == (0.01, 0.04)
    assert "model's own ops" in res.echo["micro_batch_time_s"][1] and "utilization" not in res.echo
    assert resolve(_inputs(**MODELLED), "slow").micro_batch_s == 0.04
    assert resolve(_inputs(**MODELLED), "fast").micro_batch_s == 0.01
    single = predict(_inputs(**MODELLED)).strategies["single"]
    lo, hi = single.range.step_time_s
    assert lo < single.step_time_s < hi and hi - lo == pytest.approx(0.03)


def test_a_measured_or_given_figure_beats_the_model():
    from topoprof.model.strategies.resolve import resolve

    measured = resolve(_inputs(micro_batch_time_s=0.03, **MODELLED))
    assert measured.micro_batch_s == 0.03 and "micro_batch_time_range_s" not in measured.echo
    beside, source = measured.echo["micro_batch_time_modelled_s"]
    assert beside == [0.01, 0.02, 0.04] and "+50%" in source and "inside" in source
    given = resolve(_inputs(utilization=0.4, **MODELLED))  # the user's own utilization, as before
    assert given.micro_batch_s == pytest.approx(6e9 / (312e12 * 0.4))
    with pytest.raises(Exception, match="modelled seconds"):
        _inputs(modelled=modelled((0.02, 0.01, 0.04)))
