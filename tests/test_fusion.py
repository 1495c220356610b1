"""The trace as torch.compile runs it (`topoprof.model.compute.fusion`): chains of memory-bound
ops between extern kernels fused into one memory pass over what enters and leaves them, cut
after reductions at the slow end; the compiled host cost per graph and per kernel. No torch."""
from __future__ import annotations

import dataclasses

import pytest

from tests.helpers.profiles import HOST, h100_profile
from topoprof.model.compute.datasheet import named_gpu
from topoprof.model.compute.fusion import fuse
from topoprof.model.compute.host_costs import compiled_host_seconds
from topoprof.model.compute.profile_choice import pricer_for
from topoprof.model.compute.roofline import roofline
from topoprof.specs.traced_pass import TracedOp, TracedPass, TraceTarget


def _op(name, phase, reads, writes, flops=0, **more):
    return TracedOp(name=name, phase=phase, flops=flops, view=False,
                    bytes_read=sum(b for _, b in reads), bytes_written=sum(b for _, b in writes),
                    outputs=[b for _, b in writes], inplace=False, reads=reads, writes=writes, **more)


def _trace():
    """A block's matmul, residual add, layer norm, cast, next matmul; then the norm's backward,
    which reads the add's output and the norm's statistics (saved for it)."""
    return TracedPass(target=TraceTarget("cuda", "bf16"), autograd_nodes=4, autograd_leaves=2, ops=[
        _op("aten.mm.default", "forward", [[1, 50], [2, 20]], [[10, 100]], flops=10**6, shapes=[[10, 10], [10, 10]]),
        _op("aten.add.Tensor", "forward", [[10, 100], [11, 100]], [[12, 100]]),
        _op("aten.native_layer_norm.default", "forward", [[12, 100], [13, 4]], [[14, 100], [15, 1], [16, 1]]),
        _op("aten._to_copy.default", "forward", [[14, 100]], [[17, 50]]),
        _op("aten.mm.default", "forward", [[17, 50], [18, 20]], [[19, 50]], flops=10**6, shapes=[[10, 10], [10, 10]]),
        _op("aten.native_layer_norm_backward.default", "backward", [[19, 50], [12, 100], [15, 1], [16, 1]],
            [[20, 100]]),
        _op("aten.add.Tensor", "backward", [[20, 100], [21, 100]], [[22, 100]]),
    ])


def test_a_chain_is_one_pass_over_what_enters_and_leaves_it():
    fast = fuse(_trace(), "fast").ops
    assert [op.name for op in fast] == [
        "aten.mm.default", "fused(add, native_layer_norm, _to_copy)", "aten.mm.default",
        "fused(native_layer_norm_backward, add)"]   # the phases are two graphs: no chain across them
    chain = fast[1]
    # read once: the matmul's output, the residual, the norm's weight; written: the add's output and
    # the statistics (the backward reads them), the cast (the next matmul reads it); the norm's
    # output stays inside
    assert (chain.bytes_read, chain.bytes_written) == (100 + 100 + 4, 100 + 1 + 1 + 50)
    backward = fast[3]
    # the last chain's output is read by nothing after it: a gradient, kept for the optimizer
    assert (backward.bytes_read, backward.bytes_written) == (50 + 100 + 1 + 1 + 100, 100)


def test_the_slow_end_cuts_a_chain_after_each_reduction():
    slow = fuse(_trace(), "slow").ops
    names = [op.name for op in slow]
    assert names[1:3] == ["fused(add, native_layer_norm)", "fused(_to_copy)"]
    norm, cast = slow[1], slow[2]
    assert (norm.bytes_read, norm.bytes_written) == (204, 100 + 100 + 1 + 1)   # its output leaves it now
    assert (cast.bytes_read, cast.bytes_written) == (100, 50)
    assert fuse(_trace(), "middle").ops == slow


def test_a_trace_without_storage_keys_reads_the_first_op_and_writes_the_last():
    trace = _trace()
    trace = dataclasses.replace(trace, ops=[dataclasses.replace(op, reads=None, writes=None) for op in trace.ops])
    chain = fuse(trace, "fast").ops[1]
    assert (chain.bytes_read, chain.bytes_written) == (200, 50)


def test_compiled_pays_a_call_per_graph_and_a_launch_per_kernel():
    dev = pricer_for(named_gpu("h100-sxm"), "bf16", True, h100_profile(), "hand-made")[0]
    fused = fuse(_trace(), "middle")
    host = compiled_host_seconds(fused, dev.host, "middle")
    launch = dev.host.compiled_kernel.at("middle", fast_is_high=False)
    assert host[0] == pytest.approx(launch + HOST["autograd_forward"])          # the forward graph's call
    assert host[1] == pytest.approx(launch)
    first_backward = next(i for i, op in enumerate(fused.ops) if op.phase == "backward")
    assert host[first_backward] == pytest.approx(launch + HOST["autograd_backward_node"]
                                                 + 2 * (HOST["autograd_backward_node"] - HOST["op"]))
    eager = roofline(_trace(), pricer_for(named_gpu("h100-sxm"), "bf16", False, h100_profile(), "hand-made")[0])
    compiled = roofline(_trace(), dev)
    assert compiled.kernels < eager.kernels == 7
    assert compiled.middle.host_s < eager.middle.host_s and compiled.middle.device_s < eager.middle.device_s
