"""An op trace priced from a device profile (`topoprof.model.compute.profiled`, `host_costs`,
`profile_choice`): the exact times a hand-made profile's points imply, the ends of a profile
scaled to another GPU, the corrections between and below measured shapes, the host's time per
op by kind, the choice of the nearest profile and the datasheet path where none can be had.
No torch."""
from __future__ import annotations

import dataclasses
import math

import pytest

from tests.helpers.profiles import GRID, HOST, MEMORY, SDPA, h100_profile, power, profile_doc
from topoprof.errors import InputError
from topoprof.model.compute.datasheet import SM_COUNT, named_gpu
from topoprof.model.compute.host_costs import eager_host_seconds, host_costs_from
from topoprof.model.compute.profile import profile_from_dict
from topoprof.model.compute.profile_choice import nearest_profile, pricer_for, pricing_for
from topoprof.model.compute.profile_scale import datasheet_ratios
from topoprof.model.compute.roofline import DeviceModel, price, roofline
from topoprof.model.compute.roofline_terms import quantization
from topoprof.specs.traced_pass import ParamEntry, TracedOp, TracedPass, TraceTarget

CUDA = TraceTarget("cuda", "bf16")


def _op(name, phase="forward", flops=0, read=0, written=0, view=False, **more):
    op = {"name": name, "phase": phase, "flops": flops, "view": view, "bytes_read": read, "bytes_written": written}
    if not view:
        op.update(outputs=[written], inplace=False)
    return TracedOp(**{**op, **more})


def _mm(m, n, k, phase="forward", name="aten.mm.default"):
    shapes = [[m, k], [k, n]] if name == "aten.mm.default" else [[n], [m, k], [k, n]]
    return _op(name, phase, 2 * m * n * k, 2 * (m * k + k * n), 2 * m * n, shapes=shapes)


def _sdpa(b, h, s, d, backward=False, causal=True):
    name = f"aten._scaled_dot_product_flash_attention{'_backward' if backward else ''}.default"
    flops = (10 if backward else 4) * b * h * s * s * d   # torch.utils.flop_counter's count, causal or not
    return _op(name, "backward" if backward else "forward", flops, 3 * 2 * b * h * s * d, 2 * b * h * s * d,
               shapes=[[b, h, s, d]] * (4 if backward else 3), causal=causal)


def _trace():
    ops = [_mm(1024, 3072, 768, name="aten.addmm.default"),
           _op("aten.add.Tensor", read=699050, written=349526),                 # 1 MiB moved
           _sdpa(2, 4, 1024, 64),
           _op("aten.view.default", view=True),
           _mm(4096, 768, 3072, "backward"),
           _op("aten.add.Tensor", "backward", read=(1 << 26) - (1 << 24), written=1 << 24),   # 64 MiB moved
           _sdpa(2, 4, 1024, 64, backward=True)]
    return TracedPass(ops=ops, target=CUDA, autograd_nodes=6, autograd_leaves=2)


def _h100(**changes):
    return pricer_for(named_gpu("h100-sxm"), "bf16", False, h100_profile(**changes), "hand-made")[0]


def test_each_op_takes_exactly_what_the_profiles_points_imply():
    dev, trace = _h100(), _trace()
    attention = 4 * 2 * 4 * 1024 * 1024 * 64
    device = [2 * 1024 * 3072 * 768 / power(1024, 3072, 768),   # a measured shape: its own rate
              (1 << 20) / 4e11,                                   # add at a measured size
              attention / 2 / 1.5e14,                              # causal: the profile counts half the FLOPs
              0.0,
              2 * 4096 * 768 * 3072 / power(4096, 768, 3072),
              (1 << 26) / 3.2e12,
              2.5 * attention / 2 / 1.5e14]                        # backward: 10 of the same 4 b h s^2 d
    # forward: the matmul and the attention under autocast (autocast_op less its one cast), the add
    # one recorded op; backward: a plain op per kernel, plus 6 nodes x (node - op) over 3 kernels
    spread = 6 * (HOST["autograd_backward_node"] - HOST["op"]) / 3
    host = [HOST["autocast_op"] - HOST["autograd_forward"], HOST["autograd_forward"],
            HOST["autocast_op"] - HOST["autograd_forward"], 0.0, HOST["op"] + spread, HOST["op"] + spread,
            HOST["op"] + spread]
    assert eager_host_seconds(trace, dev.host, "middle") == pytest.approx(host)
    clock = end = 0.0
    for op, t, h in zip(trace.ops, device, host):
        if not op.view:
            clock += h
            end = max(clock, end) + t    # the queue: issued by the host, after the op before it
    for at in ("fast", "middle", "slow"):   # every figure measured: one number at every end
        got = price(trace, dev, at)
        assert got.seconds == pytest.approx(end)
        assert got.by_kind == {"matmul": pytest.approx(device[0] + device[4]),
                               "attention": pytest.approx(device[2] + device[6]),
                               "memory": pytest.approx(device[1] + device[5])}
    # the datasheet's shares would not give these times (80-90 % of 989.5 TFLOP/s for the matmul)
    assert not 0.8 <= 2 * 1024 * 3072 * 768 / device[0] / 989.5e12 <= 0.9


def test_an_op_with_flops_no_kind_reads_runs_at_a_gemm_rate_and_is_never_fused():
    from topoprof.model.compute.fusion import fusible

    dev, side = _h100(), 1024
    flops = 2 * side ** 3
    scaled_mm = _op("aten._scaled_mm.default", flops=flops, read=2 * side * side, written=2 * side * side)
    assert dev.device_seconds(scaled_mm, "middle") == (pytest.approx(flops / power(side, side, side)), "matmul")
    assert not fusible(scaled_mm) and fusible(_op("aten.add.Tensor", read=8, written=4))


def test_checkpointings_recompute_costs_the_host_what_the_forward_did():
    dev, trace = _h100(), _trace()
    recomputed = [dataclasses.replace(_mm(1024, 3072, 768, "backward", name="aten.addmm.default"), recompute=True),
                  _op("aten.add.Tensor", "backward", read=699050, written=349526, recompute=True)]
    with_recompute = dataclasses.replace(trace, ops=trace.ops[:4] + recomputed + trace.ops[4:])
    host = eager_host_seconds(with_recompute, dev.host, "middle")
    # under autocast again, and autograd-recorded again: the forward's own host cost per op
    assert host[4:6] == pytest.approx([HOST["autocast_op"] - HOST["autograd_forward"], HOST["autograd_forward"]])
    # the engine's node overhead still spread over the backward's own three kernels only
    spread = 6 * (HOST["autograd_backward_node"] - HOST["op"]) / 3
    assert host[6:] == pytest.approx([HOST["op"] + spread] * 3)


def test_attention_splits_the_profiles_forward_plus_backward_as_the_trace_counts_them():
    dev = _h100()
    forward, backward = _sdpa(2, 4, 1024, 64), _sdpa(2, 4, 1024, 64, backward=True)
    both = dev.device_seconds(forward, "middle")[0] + dev.device_seconds(backward, "middle")[0]
    profile_flops = 3.5 * 4 * 2 * 4 * 1024 * 1024 * 64 * 0.5   # the profile's count: 3.5 x forward, halved
    assert both == pytest.approx(profile_flops / 1.5e14)
    full = dataclasses.replace(forward, causal=False)
    assert dev.device_seconds(full, "middle")[0] == pytest.approx(4 * 2 * 4 * 1024 * 1024 * 64 / 2.5e14)


def test_a_profile_scaled_to_another_gpu_spans_exactly_the_stated_ratios():
    profile = h100_profile()
    ratios = datasheet_ratios(profile, named_gpu("a100-sxm4-80gb"))
    dev = pricer_for(named_gpu("a100-sxm4-80gb"), "bf16", False, profile, "hand-made")[0]
    gemm = _mm(1024, 768, 768)   # 24 tiles: under a wave on either GPU, so no quantization either way
    flops, rate = gemm.flops, power(1024, 768, 768)
    gemm_ratios = (ratios.peak, ratios.peak / ratios.sms, ratios.bandwidth)
    assert dev.device_seconds(gemm, "fast")[0] == pytest.approx(flops / (rate * max(gemm_ratios)))
    assert dev.device_seconds(gemm, "slow")[0] == pytest.approx(flops / (rate * min(gemm_ratios)))
    add = _op("aten.add.Tensor", read=1 << 25, written=1 << 25)     # 64 MiB moved
    memory_ratios = (ratios.bandwidth, ratios.bandwidth / ratios.sms)
    assert dev.device_seconds(add, "fast")[0] == pytest.approx((1 << 26) / (3.2e12 * max(memory_ratios)))
    assert dev.device_seconds(add, "slow")[0] == pytest.approx((1 << 26) / (3.2e12 * min(memory_ratios)))
    assert (ratios.peak, ratios.bandwidth) == (pytest.approx(312 / 989.5), pytest.approx(2039 / 3350))
    assert any("scaled by a100-sxm4-80gb / h100-sxm" in line for line in dev.basis_lines())
    # the host's costs are the profiled host's, unchanged
    assert dev.host.kinds["autograd_forward"].low == dev.host.kinds["autograd_forward"].high == HOST["autograd_forward"]


def test_quantization_between_measured_shapes_and_not_at_them():
    dev = _h100()
    sms, tile = SM_COUNT["h100-sxm"], dev.tile
    at_point = _mm(16384, 3072, 768)
    assert dev.device_seconds(at_point, "fast")[0] == pytest.approx(dev.device_seconds(at_point, "slow")[0])
    # between 4096 and 16384 rows, 3072 columns: many waves; its own tiles against the corners'
    m, n, k = 6000, 3072, 768
    between = _mm(m, n, k)
    t = math.log(m / 4096) / math.log(16384 / 4096)
    corners_q = math.exp((1 - t) * math.log(quantization(4096, n, 1, sms, tile))
                         + t * math.log(quantization(16384, n, 1, sms, tile)))
    ratio = quantization(m, n, 1, sms, tile) / corners_q
    assert ratio < 1   # 6000 rows leave the last wave part empty
    flops = between.flops
    assert dev.device_seconds(between, "fast")[0] == pytest.approx(flops / power(m, n, k))
    assert dev.device_seconds(between, "slow")[0] == pytest.approx(flops / (power(m, n, k) * ratio))


def test_below_the_smallest_shape_a_small_kernel_takes_between_its_rate_and_its_time():
    dev = _h100()
    small = _mm(512, 768, 768)          # half the smallest measured shape's rows, both under a wave
    edge_rate = power(1024, 768, 768)
    assert dev.device_seconds(small, "fast")[0] == pytest.approx(small.flops / edge_rate)
    assert dev.device_seconds(small, "slow")[0] == pytest.approx(2 * 1024 * 768 * 768 / edge_rate)  # the edge's time
    tiny = _op("aten.add.Tensor", read=1 << 18, written=1 << 18)    # half a MiB, below the smallest 1 MiB
    assert dev.device_seconds(tiny, "fast")[0] == pytest.approx((1 << 19) / 4e11)
    assert dev.device_seconds(tiny, "slow")[0] == pytest.approx((1 << 20) / 4e11)


def test_a_reading_blended_from_scattered_shapes_carries_their_spread():
    scattered = [((1024, 768, 768), 1e14), ((4096, 3072, 768), 6e14), ((2048, 1024, 1024), 3e14)]
    profile = profile_from_dict(profile_doc(gemm=scattered, host=HOST), "scattered")
    dev = pricer_for(named_gpu("h100-sxm"), "bf16", False, profile, "scattered")[0]
    read = profile.gemm_flops_per_s(2048, 2048, 768)
    assert "blend" in read.basis and read.spread > 0
    op = _mm(2048, 2048, 768)
    assert dev.device_seconds(op, "fast")[0] == pytest.approx(op.flops / (read.value * math.exp(read.spread)))
    assert dev.device_seconds(op, "slow")[0] == pytest.approx(op.flops / (read.value * math.exp(-read.spread)))


def test_host_kinds_fall_back_with_their_reasons():
    only_op = host_costs_from(h100_profile(host={"op": 5e-6}))
    assert only_op.kinds["autograd_forward"].low == 5e-6 and "as its op" in only_op.kinds["autograd_forward"].basis
    node = only_op.kinds["autograd_backward_node"]
    assert (node.low, node.high) == (7e-6, 37e-6) and "cited eager range" in node.basis
    assert only_op.kinds["autocast_op"].low == 10e-6
    derived = host_costs_from(h100_profile(host={"op": 5e-6, "autograd_forward": 8e-6},
                                           ranges={"autograd_backward_node": [5e-6, 30e-6]}))
    assert (derived.kinds["autograd_backward_node"].low, derived.kinds["autograd_backward_node"].high) == (5e-6, 30e-6)
    trace = _trace()
    slow = eager_host_seconds(trace, derived, "slow")
    assert slow[4] == pytest.approx(5e-6 + 6 * (30e-6 - 5e-6) / 3)     # node - op at the slow end, over 3 kernels
    assert eager_host_seconds(trace, derived, "fast")[4] == pytest.approx(5e-6)   # a node no dearer than its op


def test_a_cpu_profile_runs_inline_its_points_less_the_calls_host_cost():
    cpu = profile_from_dict(profile_doc(device="AMD EPYC", kind="cpu", dtype="float32", gemm=GRID,
                                        memory=[(("add", 1 << 20), 1e10), (("add", 1 << 26), 2e10)],
                                        host={"op": 4e-6, "autograd_forward": 6e-6, "autograd_backward_node": 9e-6},
                                        cpu={"fresh_page_s_per_byte": 1e-10, "fresh_page_min_bytes": 1 << 25,
                                             "how": "given"}), "cpu")
    dev, _ = pricer_for(None, "bf16", False, cpu, "cpu")
    assert not dev.asynchronous and "AMD EPYC" in dev.name
    add = _op("aten.add.Tensor", read=1 << 25, written=1 << 25, outputs=[1 << 25])
    assert dev.device_seconds(add, "middle")[0] == pytest.approx((1 << 26) / 2e10 - 4e-6 + (1 << 25) * 1e-10)
    trace = TracedPass(ops=[add, _op("aten.add.Tensor", "backward", read=1 << 19, written=1 << 19)],
                       target=TraceTarget("cpu", "fp32"), autograd_nodes=1)
    got = price(trace, dev, "middle")
    assert got.seconds == pytest.approx(got.host_s + got.device_s)   # inline: host and device add
    with pytest.raises(InputError, match="a CPU's: it cannot be scaled to GPU"):
        pricer_for(named_gpu("h100-sxm"), "bf16", False, cpu)


def test_the_nearest_profile_by_the_stated_rule():
    def made(device, source="measured by `topoprof profile` (probes/device_profile/profile_worker.py)", quick=False,
             created="2026-01-01",
             dtype="bfloat16"):
        return (f"{device}-{created}.json", profile_from_dict(profile_doc(device=device, gemm=GRID, host=HOST,
                                                                          source=source, quick=quick, created=created,
                                                                          dtype=dtype), device))

    h200_facts = made("NVIDIA H200", source="converted from shared/gpu-facts/h200.jsonl")
    h200 = made("NVIDIA H200", created="2026-02-01")
    h200_quick_newer = made("NVIDIA H200", quick=True, created="2026-03-01")
    h100 = made("NVIDIA H100 80GB HBM3")
    a100 = made("NVIDIA A100-SXM4-80GB")
    h100_fp16 = made("NVIDIA H100 80GB HBM3", dtype="float16")
    pool = [h200_facts, h200, h200_quick_newer, h100, a100, h100_fp16]
    assert nearest_profile(named_gpu("h100-sxm"), "bf16", pool).profile is h100[1]        # 1: the same GPU
    pick = nearest_profile(named_gpu("h200-sxm"), "bf16", pool)
    assert pick.profile is h200[1] and pick.rule == 0   # measured before converted facts, full before quick
    assert nearest_profile(named_gpu("h100-pcie"), "bf16", pool).rule == 1                # 2: same compute capability
    assert nearest_profile(named_gpu("a100-pcie-40gb"), "bf16", pool).profile is a100[1]  # sm_80 before sm_90
    assert nearest_profile(named_gpu("l40s"), "bf16", [h100, a100]).rule == 2             # 3: the same major (8.9, 8.0)
    fp16 = [made("NVIDIA H100 80GB HBM3", dtype="float16"), made("NVIDIA A100-SXM4-80GB", dtype="float16")]
    other = nearest_profile(named_gpu("t4"), "fp16", fp16)
    assert other.rule == 3 and other.profile is fp16[1][1]                     # 4: the nearest other (7.5: 8.0)
    assert nearest_profile(named_gpu("h100-sxm"), "fp16", pool).profile is h100_fp16[1]  # only in its precision
    assert nearest_profile(named_gpu("v100-sxm2"), "bf16", pool) is None                 # no bf16 on a V100 to scale by


def test_a_given_profile_of_another_architecture_says_so_as_a_shipped_one_does():
    assert pricer_for(named_gpu("h100-pcie"), "bf16", False, h100_profile(), "given")[1] == []   # the same sm_90
    _, notes = pricer_for(named_gpu("a100-sxm4-80gb"), "bf16", False, h100_profile(), "given")
    assert notes and "is another architecture than a100-sxm4-80gb" in notes[0]


def test_where_no_profile_can_be_had_the_datasheet_prices_it_and_says_so():
    dev, notes = pricer_for(named_gpu("v100-sxm2"), "fp16", False)
    assert isinstance(dev, DeviceModel) and "datasheet" in dev.name
    assert notes and "no device profile can be scaled to v100-sxm2 in fp16" in notes[0]
    with pytest.raises(InputError, match="measured in bfloat16: it cannot price --precision fp16"):
        pricer_for(named_gpu("h100-sxm"), "fp16", False, h100_profile())
    result = roofline(_trace(), pricer_for(named_gpu("h100-sxm"), "bf16", False, h100_profile(), "given")[0])
    assert result.kernels == 6 and result.views == 1 and any("device profile" in b for b in result.basis)


def test_a_profiles_optimizer_prices_a_what_ifs_optimizer_step():
    from topoprof.model.compute.timing import Compute, compute_times
    from topoprof.model.compute.traced import modelled_compute

    doc = profile_doc(gemm=GRID, host={**HOST, "optimizer_per_tensor": 4e-6}, memory=MEMORY, sdpa=SDPA)
    doc["optimizer"] = {"name": "AdamW (fused)", "params": 1 << 24, "bytes_per_step": 28 << 24, "seconds": 1e-3,
                        "bytes_per_s": (28 << 24) / 1e-3}
    profile = profile_from_dict(doc, "with an optimizer")
    trace = dataclasses.replace(_trace(), params=[ParamEntry("w", [1000, 100]), ParamEntry("b", [1000]),
                                                  ParamEntry("frozen", [10], requires_grad=False)])
    priced = modelled_compute(trace, pricing_for(named_gpu("h100-sxm"), "bf16", False, profile))
    assert priced.detail.optimizer.tensors == 2
    times = compute_times(Compute(gpu="h100-sxm", modelled=priced), params=101_000, flops_per_token=1.0, tokens=1,
                          grad_bytes=4)
    rate = (28 << 24) / 1e-3
    assert times.optimizer_s == pytest.approx(2 * 4e-6 + 28 * 101_000 / rate)   # AdamW: 7 words of 4 B a parameter
    assert "from the device profile" in times.echo["optimizer_time_s"][1]
    # a range of rate and host cost (a profile scaled to another GPU): each end of the what-if takes its own
    detail = priced.detail
    ranged = dataclasses.replace(detail, optimizer=dataclasses.replace(detail.optimizer, bytes_per_s=(rate, 2 * rate),
                                                                       host_per_tensor_s=(2e-6, 4e-6)))
    comp = Compute(gpu="h100-sxm", modelled=dataclasses.replace(priced, detail=ranged))
    ends = {end: compute_times(comp, params=101_000, flops_per_token=1.0, tokens=1, grad_bytes=4, end=end).optimizer_s
            for end in ("fast", None, "slow")}
    assert ends["fast"] == pytest.approx(2 * 2e-6 + 28 * 101_000 / (2 * rate))
    assert ends["slow"] == pytest.approx(2 * 4e-6 + 28 * 101_000 / rate)
    assert ends["fast"] < ends[None] < ends["slow"]


def test_a_pricing_is_chosen_once_and_every_pass_priced_with_it_reads_no_profile_again(monkeypatch):
    from topoprof.model.compute import profile_choice
    from topoprof.model.compute.traced import modelled_compute, priced

    pricing = pricing_for(named_gpu("h100-sxm"), "bf16", False, h100_profile(), "hand-made")
    assert pricing.why is None and pricing.pricer is not None

    def chosen_again(*args, **kwargs):
        raise AssertionError("a profile chosen again")

    monkeypatch.setattr(profile_choice, "pricer_for", chosen_again)
    monkeypatch.setattr(profile_choice, "shipped_profiles", chosen_again)
    modelled = modelled_compute(_trace(), pricing)
    assert modelled.seconds == roofline(_trace(), pricing.pricer).seconds
    assert priced(_trace(), pricing)[0] == modelled


def test_a_pricing_that_cannot_be_had_says_why_wherever_a_pass_is_priced():
    from topoprof.model.compute.traced import priced

    cpu = profile_from_dict(profile_doc(device="AMD EPYC", kind="cpu", dtype="float32", gemm=GRID,
                                        memory=[(("add", 1 << 20), 1e10)], host={"op": 4e-6},
                                        cpu={"fresh_page_s_per_byte": 1e-10, "fresh_page_min_bytes": 1 << 25,
                                             "how": "given"}), "cpu")
    pricing = pricing_for(named_gpu("h100-sxm"), "bf16", False, cpu, "cpu")
    assert pricing.pricer is None and "cannot be scaled to GPU 'h100-sxm'" in pricing.why
    trace = dataclasses.replace(_trace(), target=TraceTarget("cpu", "fp32"))
    assert priced(trace, pricing) == (None, f"pricing its ops failed ({pricing.why})")
