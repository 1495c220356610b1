"""The fits search's candidates priced from passes extended in the samples
(`topoprof/model/inputs/sampled.py`): a pass at 2 and 3 samples extended to a larger micro-batch
is the pass traced there, count for count, for a preset and for a user's model cut to its blocks,
under each checkpointing mode; the candidates trace only each mode's check and what no line
reaches; a line that does not hold is traced instead."""
from __future__ import annotations

import copy
import os
from dataclasses import replace

import pytest

from topoprof.model.inputs.sampled import (
    SAMPLES,
    SampledPasses,
    counts_of,
    extend,
    pass_at,
    same_counts,
    to_trace_first,
)
from topoprof.specs.traced_pass import (
    PassMemory,
    PassTotals,
    PhaseTotals,
    SelectiveCheckpointCost,
    TracedOp,
    TracedPass,
    TraceTarget,
)


def _memory(peak_bytes: int, rounded_peak_bytes: int) -> PassMemory:
    """A pass's memory with its peaks, the rest nothing."""
    return PassMemory(activations_bytes=0, param_copies_bytes=0, kept=None, peak_bytes=peak_bytes,
                      rounded_peak_bytes=rounded_peak_bytes, forward_peak_bytes=0, forward_transient_bytes=0,
                      backward_start_bytes=0, backward_peak_bytes=0, backward_transient_bytes=0, grads_bytes=0,
                      segments=[])


def _pass(samples: int, name: str = "aten.mm.default", view: bool = False) -> TracedPass:
    """A pass whose counts are affine in the samples, as a model's are: 5 FLOPs a sample over a
    weight's 8 bytes read at every size."""
    backward = 3 * samples
    return TracedPass(device="meta", target=TraceTarget("cuda", "bf16"), shape=f"{samples}x4",
                      memory=_memory(100 * samples, 512),
                      ops=[TracedOp(name=name, phase="forward", flops=5 * samples, view=view,
                                    bytes_read=8 + 4 * samples, bytes_written=0, shapes=[[samples, 4], [4, 4]],
                                    reads=[[1, 8], [2, 4 * samples]])],
                      totals=PassTotals(backward=PhaseTotals(ops=1, flops=backward)),
                      ready_flops=[[0, samples], [1, backward]], ready=[[0, 1 / 3], [1, 1.0]])


def _off_its_line(traced: TracedPass, op: int) -> TracedPass:
    """`traced` with one count off its line: op `op`'s FLOPs, one more."""
    ops = list(traced.ops)
    ops[op] = replace(ops[op], flops=ops[op].flops + 1)
    return replace(traced, ops=ops)


def test_each_count_is_extended_on_its_own_line_and_the_rest_is_kept():
    out = pass_at(_pass(2), _pass(3), 7)
    assert out is not None
    assert out.ops == _pass(7).ops and out.totals == _pass(7).totals
    assert out.target == _pass(7).target and out.device == "meta"
    assert out.ready_flops == [[0, 7], [1, 21]] and out.ready == [[0, 7 / 21], [1, 1.0]]
    # what names the size, the memory (its rounded peak is no line) and the host cost are not extended
    assert out.shape == "" and out.memory is None
    assert same_counts(out, _pass(7)) and not same_counts(out, _pass(8))


@pytest.mark.parametrize("other", [
    _pass(3, name="aten.addmm.default"),  # another op
    _pass(3, view=True),                  # a flag, not a count
    replace(_pass(3), ops=_pass(3).ops * 2),  # another number of ops
    replace(_pass(3), ready=[[0, 0.5], [1, 1.0]], kwargs={"ratio": 0.5}),  # a float that differs
])
def test_two_passes_that_differ_in_more_than_their_counts_extend_to_nothing(other):
    two = replace(_pass(2), kwargs={"ratio": 0.25}) if "ratio" in other.kwargs else _pass(2)
    assert pass_at(two, other, 7) is None


def _known(modes=("none", "full"), samples=SAMPLES, line=_pass) -> dict:
    return {(mode, s, d): line(s) for mode in modes for s in samples for d in (1, 2)}


def test_the_checks_and_what_no_line_reaches_are_traced_first():
    keys = [(mode, m, d) for mode, m in [("none", 1), ("none", 2), ("none", 5), ("none", 9), ("full", 3),
                                         ("op", 6)] for d in (1, 2)]
    first = to_trace_first(keys, _known())
    # below SAMPLES (its ops may differ there), each mode's largest past SAMPLES, a mode not known
    assert first == [("none", 1, 1), ("none", 1, 2), ("none", 9, 1), ("none", 9, 2), ("op", 6, 1), ("op", 6, 2)]
    extended, rest = extend(keys, _known(), {key: _pass(key[1]) for key in first})
    assert rest == []
    assert sorted(extended) == [("full", 3, 1), ("full", 3, 2), ("none", 2, 1), ("none", 2, 2), ("none", 5, 1),
                                ("none", 5, 2)]
    assert all(same_counts(p, _pass(key[1])) for key, p in extended.items())


def test_a_line_its_check_does_not_hold_is_traced_past_samples():
    keys = [("none", m, d) for m in (2, 5, 9) for d in (1, 2)]
    traced = {key: _pass(key[1]) for key in to_trace_first(keys, _known())}
    traced[("none", 9, 2)] = _off_its_line(traced[("none", 9, 2)], 0)  # one count off its line, at one depth
    extended, rest = extend(keys, _known(), traced)
    assert rest == [("none", 5, 1), ("none", 5, 2)]
    assert sorted(extended) == [("none", 2, 1), ("none", 2, 2)]  # at SAMPLES: the passes traced there


def test_the_host_cost_of_selective_checkpointing_is_the_checks():
    keys = [("op", m, 1) for m in (5, 9)]
    known = {("op", s, 1): replace(_pass(s), selective_checkpoint=SelectiveCheckpointCost(1e-5, "")) for s in SAMPLES}
    traced = {("op", 9, 1): replace(_pass(9), selective_checkpoint=SelectiveCheckpointCost(2e-5, ""))}
    extended, rest = extend(keys, known, traced)
    assert rest == [] and extended[("op", 5, 1)].selective_checkpoint == SelectiveCheckpointCost(2e-5, "")


def test_passes_traced_for_another_device_extend_nothing():
    sampled = SampledPasses(TraceTarget("cuda", "bf16"), _known())
    assert sampled.for_target(TraceTarget("cuda", "bf16")) == _known()
    assert sampled.for_target(TraceTarget("cpu", "fp32")) == {}


# The trace itself: a model's passes on meta (torch).

H100_BF16 = TraceTarget("cuda", "bf16", capability=(9, 0))
BLOCKS = os.path.join(os.path.dirname(__file__), "fixtures", "user_models", "blocks.py")


def _preset_pass(mode: str, depth: int, samples: int) -> TracedPass:
    from topoprof.model.inputs.traces import _variant
    from topoprof.trace.op_trace import trace_user_model

    variant = _variant(mode, depth, samples, 128, H100_BF16)
    traced = trace_user_model("topoprof.zoo.preset_modules:build", variant.stated,
                              {"preset": "gpt2", **variant.kwargs}, variant.target)
    assert isinstance(traced, TracedPass), traced
    return _as_a_variant(traced)


def _as_a_variant(traced: TracedPass) -> TracedPass:
    """A pass as the trace worker sends a variant's: without the ops summed by name and the
    parameters (`topoprof/trace/op_trace.py:_variant`)."""
    return replace(traced, by_name=None, params=None)


def _user_pass(mode: str, depth: int, samples: int) -> TracedPass:
    from topoprof.trace.op_trace import trace_user_model

    traced = trace_user_model(f"{BLOCKS}:build", {"micro_batch": samples, "seq_len": 64}, None, H100_BF16,
                              ac=mode, depth=depth)
    assert isinstance(traced, TracedPass), traced
    return _as_a_variant(traced)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "full", "op"])
@pytest.mark.parametrize("traced", [_preset_pass, _user_pass], ids=["gpt2", "users-blocks"])
def test_a_pass_extended_in_the_samples_is_the_pass_traced_there(traced, mode):
    pytest.importorskip("torch")
    for depth in (1, 2):
        two, three, seven = (traced(mode, depth, m) for m in (*SAMPLES, 7))
        extended = pass_at(two, three, 7)
        assert extended is not None and same_counts(extended, seven), (mode, depth)


@pytest.mark.slow
def test_the_candidates_trace_each_modes_check_alone_and_a_broken_line_in_full(monkeypatch):
    """Through the trace worker: the memory's passes, then the candidates', as `topoprof model`
    gathers them."""
    pytest.importorskip("torch")
    from topoprof.model.inputs import traces
    from topoprof.model.inputs.candidates import model_shape

    asked: list[list[dict]] = []
    real = traces.trace_models

    def counted(spec, kwargs, variants, *args, **more):
        asked.append(variants)
        return real(spec, kwargs, variants, *args, **more)

    monkeypatch.setattr(traces, "trace_models", counted)
    shape = model_shape(None, 2_000_000, 2, 128)
    assert not isinstance(shape, str)
    memory = traces.memory_set(shape, "bf16", cast=False, target=H100_BF16)
    assert memory.sampled is not None and len(memory.sampled.passes) == 3 * 2 * len(SAMPLES)
    wanted = [("none", 1), ("none", 4), ("none", 6), ("full", 5), ("layer:2", 6)]
    asked.clear()
    passes = traces.candidate_passes(shape, wanted, H100_BF16, sampled=memory.sampled)
    assert not isinstance(passes, str)
    sizes = sorted((v.kwargs.get("ac", "none"), v.stated["micro_batch"]) for v in asked[0])
    # none's size 1 and its check at 6, full's check at 6 (layer:2 is none and full)
    assert len(asked) == 1 and sizes == [("full", 6)] * 2 + [("none", 1)] * 2 + [("none", 6)] * 2
    everything = traces.candidate_passes(shape, wanted, H100_BF16)
    assert not isinstance(everything, str) and set(passes.traces) == set(everything.traces)
    for key, found in passes.traces.items():
        assert counts_of(found) == counts_of(everything.traces[key]), key

    broken = copy.deepcopy(memory.sampled)
    broken.passes[("none", 3, 1)] = _off_its_line(broken.passes[("none", 3, 1)], -1)
    asked.clear()
    again = traces.candidate_passes(shape, wanted, H100_BF16, sampled=broken)
    assert not isinstance(again, str)
    assert [len(a) for a in asked] == [6, 2]  # none at 4 then traced, at both depths
    assert all(counts_of(found) == counts_of(everything.traces[key]) for key, found in again.traces.items())

