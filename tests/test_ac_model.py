"""Activation checkpointing in the model: the option as the request takes it, its recompute priced
from the trace, its place in FSDP's timeline, and the search for the largest micro-batch that fits
per strategy and mode."""
from __future__ import annotations

import os

import pytest

from tests.helpers.profiles import modelled
from topoprof.errors import InputError
from topoprof.model.comm.collectives import RingComm
from topoprof.model.compute.datasheet import named_gpu
from topoprof.model.compute.modelled import ModelledCompute, OptimizerRates
from topoprof.model.compute.timing import Compute
from topoprof.model.fsdp.plan import fsdp_plan, recompute_shares
from topoprof.model.fsdp.timeline import FsdpSetting, collective_times, fsdp_micro_batch
from topoprof.model.inputs.request import WorkloadRequest
from topoprof.model.memory.traced import MicroBatchBytes, TracedMemory
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.specs.fsdp_modes import MODES
from topoprof.specs.traced_pass import TraceTarget
from topoprof.workload.checkpointing import Checkpointing, parse_checkpointing
from topoprof.workload.presets import get_preset


def test_the_option_is_checked_where_the_request_is_built():
    assert WorkloadRequest(preset="gpt2", activation_checkpointing="layer:2").checkpointing == Checkpointing("layer", 2)
    assert WorkloadRequest(preset="gpt2").checkpointing == Checkpointing("none")
    with pytest.raises(InputError, match="valid: none, full, layer:N"):
        WorkloadRequest(preset="gpt2", activation_checkpointing="sometimes")
    assert WorkloadRequest(user_model="tests/fixtures/user_models/tied.py:build",
                           activation_checkpointing="full").checkpointing == Checkpointing("full")


def test_a_llama_presets_fused_rmsnorm_reaches_every_pass_of_it():
    from topoprof.model.compute.traced import preset_request
    from topoprof.model.inputs.candidates import model_shape

    request = WorkloadRequest(preset="llama3-8b", rmsnorm="fused", tokens=8192)
    assert request.preset_sizes == {"norm": "fused"}
    assert WorkloadRequest(preset="llama3-8b").preset_sizes is None
    assert preset_request("llama3-8b", 1, 8192, None, "op", request.preset_sizes).kwargs["sizes"] == {"norm": "fused"}
    assert model_shape("llama3-8b", None, 1, 8192, request.preset_sizes).kwargs["sizes"] == {"norm": "fused"}
    with pytest.raises(InputError, match="applies to a Llama preset"):
        WorkloadRequest(preset="gpt2", rmsnorm="fused")
    with pytest.raises(InputError, match="one of eager, fused"):
        WorkloadRequest(preset="llama3-8b", rmsnorm="triton")


def test_a_sample_past_a_presets_context_is_traced_and_counted_as_sequences_of_it():
    from topoprof.model.inputs.candidates import model_shape

    shape = model_shape("llama-7b", None, 2, 16384)    # 8192 tokens per sample, a context of 2048
    assert (shape.seq_len, shape.per_sample) == (2048, 4) and "as 4 sequences" in shape.label
    assert model_shape("llama3-8b", None, 1, 8192).per_sample == 1



@pytest.mark.parametrize("micro_batch, tokens, sequences, seq_len", [(2, 3000, 4, 750), (3, 4096, 6, 682),
                                                                      (4, 4096, 4, 1024)])
def test_the_main_pass_and_the_fits_search_run_a_long_sample_as_the_same_sequences(micro_batch, tokens, sequences,
                                                                                   seq_len):
    from topoprof.model.compute.traced import preset_request
    from topoprof.model.inputs.candidates import model_shape

    main = preset_request("gpt2", micro_batch, tokens, None)  # the compute's pass (context 1024)
    shape = model_shape("gpt2", None, micro_batch, tokens)    # the memory's and the search's passes
    assert (main.stated["micro_batch"], main.stated["seq_len"]) == (sequences, seq_len)
    assert (micro_batch * shape.per_sample, shape.seq_len) == (sequences, seq_len)

# --- the recompute priced from the trace ---------------------------------------------------------

torch = pytest.importorskip("torch")

SIZES = {"hidden": 256, "heads": 8, "kv_heads": 2, "intermediate": 896, "vocab_size": 2048}


def _priced(mode: str) -> ModelledCompute:
    from topoprof.model.compute.profile import load_profile
    from topoprof.model.compute.profile_choice import pricing_for
    from topoprof.model.compute.traced import modelled_compute
    from topoprof.trace.op_trace import trace_user_model

    trace = trace_user_model("topoprof.zoo.preset_modules:build", {"micro_batch": 2},
                             {"preset": "llama3-8b", "n_layer": 2, "sizes": SIZES, "ac": mode, "seq_len": 512},
                             TraceTarget("cuda", "bf16"))
    # priced from the H200's profile, scaled: its host costs per op are ranges, and at this size
    # the device's work decides (with a point host cost per op, op's recompute of many small ops
    # under its policy's modes can cost more host time than full's)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "topoprof", "model", "compute",
                        "profiles", "nvidia-h200-sxm-gpu-facts-20261126.json")
    return modelled_compute(trace, pricing_for(named_gpu("h100-sxm"), "bf16", False, load_profile(path), path))


def test_the_recompute_is_priced_in_backward_for_full_and_op_and_is_none_without():
    none, full, op = (_priced(m) for m in ("none", "full", "op"))
    assert none.detail.recompute_s is None
    for priced in (full, op):
        recompute = priced.detail.recompute_s
        assert 0 < recompute[0] <= recompute[1] <= recompute[2]
        assert "recompute ops are in its backward, priced with it" in priced.basis
        # priced with the backward: the micro-batch takes longer, and its backward's share grows
        assert priced.middle_s > none.middle_s
        assert priced.backward_fraction > none.backward_fraction
    # op keeps the matmuls
    assert full.detail.recomputed_middle_s > op.detail.recomputed_middle_s


def test_the_recompute_goes_to_the_checkpointed_groups_of_fsdps_timeline():
    from topoprof.model.strategies.resolve import resolve
    from topoprof.model.strategies.steps import fsdp_setting, recompute_total_s, with_recompute

    full = _priced("full")
    work = Workload.from_preset("gpt2", tokens_per_micro_batch=1024, checkpointing=parse_checkpointing("layer:2"))
    res = resolve(ModelInputs(work, Compute(gpu="h100-sxm", modelled=full), Cluster(RingComm(100.0, 3.4, 4), 1, 4)))
    total = recompute_total_s(res)
    assert total == pytest.approx(res.micro_batch_s * full.detail.recomputed_middle_s / full.middle_s)
    plan = fsdp_plan(work.layout)
    setting = with_recompute(fsdp_setting(res), res, plan)
    assert sum(setting.recompute_s) == pytest.approx(total)
    assert setting.backward_s == pytest.approx(res.backward_s - total)  # moved, not added
    # layer:2: every second block (torchtitan's count % 2 == 0), none in the root
    assert [s > 0 for s in setting.recompute_s] == [i % 2 == 1 for i in range(12)] + [False]
    measured = resolve(ModelInputs(work, Compute(gpu="h100-sxm", micro_batch_time_s=0.1), res.inputs.cluster))
    assert recompute_total_s(measured) == 0  # a measured backward holds its recompute already


def _timeline(recompute_each: float, mode: str = "fsdp_full_shard"):
    layout = get_preset("gpt2")
    plan = fsdp_plan(layout)
    shares = recompute_shares(plan, Checkpointing("full"), 12)
    setting = FsdpSetting(0.03, 0.06, 2, 4, None, recompute_s=tuple(recompute_each * 12 * s for s in shares))
    coll = collective_times(plan, setting, RingComm(5.0, 3.4, 4))
    return plan, fsdp_micro_batch(plan, setting, coll, MODES[mode], True)


def test_in_fsdps_backward_a_block_recomputes_after_its_all_gather_and_before_its_reduce_scatter():
    plan, mb = _timeline(0.004)
    assert len(mb.recomputes) == 12  # every block, not the root
    for span in mb.recomputes:
        gathers = [op for op in mb.ops if op.kind == "all_gather" and op.group == span.group]
        assert len(gathers) == 2  # resharded after forward: gathered again for backward
        assert span.start_s >= max(op.end_s for op in gathers) - 1e-12
        (rs,) = [op for op in mb.ops if op.kind == "reduce_scatter" and op.group == span.group]
        assert span.end_s <= rs.start_s + 1e-12
        assert span.end_s - span.start_s == pytest.approx(0.004)
    without = _timeline(0.0)[1]
    assert mb.compute_busy_s == pytest.approx(without.compute_busy_s + 12 * 0.004)


def test_without_resharding_the_recompute_waits_for_nothing_gathered_again():
    _, mb = _timeline(0.004, "fsdp_shard_grad_op")
    assert len(mb.recomputes) == 12 and all(op.kind != "all_gather" or op.start_s < mb.forward_end_s for op in mb.ops)


def test_a_params_layouts_chunk_groups_share_the_recompute_by_their_backward():
    from topoprof.workload.presets import synthetic_layout

    plan = fsdp_plan(synthetic_layout(1_000_000_000))
    shares = recompute_shares(plan, Checkpointing("full"), 30)  # 30 traced blocks, 25 groups of 4 chunks
    assert sum(shares) == pytest.approx(1) and shares[-1] == 0 and len(set(round(s, 9) for s in shares[:-1])) == 1
    assert recompute_shares(plan, Checkpointing("none"), 30) == ()


# --- the search ------------------------------------------------------------------------------------

GB = 1e9


def _traced(per_sample_gb: float) -> TracedMemory:
    """Made-up counts, linear in the samples: each sample keeps `per_sample_gb` in the blocks."""
    def point(d, m, factor):
        return MicroBatchBytes(activations=factor * per_sample_gb * GB * m * d / 2, logits=0.5 * GB * m,
                               backward_transient=0.25 * GB * m)
    factors = {"none": 1.0, "full": 0.1, "op": 0.4}
    return TracedMemory(2, 1024, {(v, mode): {(d, m): point(d, m, f) for d in (1, 2) for m in (2, 3)}
                                  for v in ("autocast", "cast") for mode, f in factors.items()})


def _inputs(per_sample_gb=4.0, gpu_memory_gb=80.0, **workload) -> ModelInputs:
    work = Workload.from_preset("gpt2", **{"micro_batch_size": 1, "tokens_per_micro_batch": 1024, **workload},
                                traced_memory=_traced(per_sample_gb))
    return ModelInputs(work, Compute(gpu="h100-sxm", micro_batch_time_s=0.1, gpu_memory_gb=gpu_memory_gb),
                       Cluster(RingComm(100.0, 3.4, 8), 1, 8))


def test_the_largest_micro_batch_that_fits_is_the_last_size_whose_memory_fits():
    from topoprof.model.strategies.memory import job_memory, memory_by_strategy
    from topoprof.model.strategies.search import at, largest

    inputs = _inputs()
    names = ["ddp_synced", "fsdp_full_shard"]
    for mode in ("none", "full", "layer:2", "op"):
        found = largest(inputs, names, mode)
        for name in names:
            fits = [m for m in range(1, 200)
                    if memory_by_strategy(job_memory(at(inputs, mode, m)), [name])[name].fits is True]
            best = found[name].micro_batch
            assert best == (max(fits) if fits else None), (mode, name)
            assert fits == list(range(1, (best or 0) + 1))  # every size below it fits too
            if best:
                assert found[name].total_gb <= 80.0 < found[name].next_gb
    full, none = largest(inputs, names, "full"), largest(inputs, names, "none")
    assert full["fsdp_full_shard"].micro_batch > none["fsdp_full_shard"].micro_batch


def test_a_sample_of_several_traced_sequences_counts_as_that_many():
    from topoprof.model.strategies.memory import micro_batch_count

    # traced at sequences of 1024: a sample of 4096 tokens keeps what 4 of them keep
    long = micro_batch_count(_inputs(micro_batch_size=1, tokens_per_micro_batch=4096))
    four = micro_batch_count(_inputs(micro_batch_size=4, tokens_per_micro_batch=4096))
    one = micro_batch_count(_inputs())
    assert long.activations == pytest.approx(four.activations) == pytest.approx(4 * one.activations)


def test_the_search_says_what_fits_and_why_not_when_it_cannot():
    from topoprof.model.strategies.search import search

    out = search(_inputs(), ["single", "ddp_synced", "fsdp_full_shard", "fsdp_full_shard_no_sync"], None)
    assert out.modes == ("none", "full", "layer:2", "op")
    rows = {r.strategies: r for r in out.largest}
    assert set(rows) == {("single",), ("ddp_synced",), ("fsdp_full_shard",), ("fsdp_full_shard_no_sync",)}
    assert out.fastest_reason is not None and "not priced here" in out.fastest_reason
    (pair,) = out.no_sync
    assert pair.no_sync == "fsdp_full_shard_no_sync" and pair.extra_gb > 0
    nameless = _inputs()
    unknown = search(ModelInputs(nameless.workload, Compute(micro_batch_time_s=0.1), nameless.cluster), ["ddp_synced"],
                     None)
    assert unknown.reason is not None and "memory is unknown" in unknown.reason
    given = search(ModelInputs(Workload.from_preset("gpt2", tokens_per_micro_batch=1024, activation_memory_gb=3.0),
                               Compute(gpu="h100-sxm", micro_batch_time_s=0.1), Cluster(RingComm(100.0, 3.4, 8), 1, 8)),
                   ["ddp_synced"], None)
    assert given.reason is not None and "given for micro-batch 1 only" in given.reason


def test_the_fastest_that_fits_is_ranked_by_samples_per_second():
    from dataclasses import replace

    from topoprof.model.strategies.search import search

    def price(wanted):  # compute per micro-batch: 50 ms per sample, 20 % more under full, 10 % under op
        extra = {"none": 1.0, "full": 1.2, "layer:2": 1.1, "op": 1.1}
        return {(mode, m): replace(Compute(gpu="h100-sxm", gpu_memory_gb=80.0),
                                   modelled=modelled((t, t, t), 0.66,
                                                     recompute_s=(t - 0.05 * m,) * 3 if mode != "none" else None))
                for mode, m in wanted for t in [0.05 * m * extra[mode]]}

    out = search(_inputs(), ["ddp_synced", "fsdp_full_shard"], price)
    best = out.fastest[0]
    assert best.samples_per_s == max(c.samples_per_s for c in out.fastest)
    costs = {c.mode: c for c in out.mode_costs}
    assert costs["none"].extra_s == 0 and costs["full"].extra_s == pytest.approx(0.01)
    assert costs["full"].recompute_s == pytest.approx(0.01)


def test_a_strategy_whose_step_is_a_lower_bound_is_not_ranked_unless_its_cost_is_given():
    from dataclasses import replace

    from topoprof.model.strategies.search import search

    def price(wanted):
        return {(mode, m): replace(Compute(gpu="h100-sxm", gpu_memory_gb=80.0), modelled=modelled((t, t, t), 0.66))
                for mode, m in wanted for t in [0.05 * m]}

    inputs = _inputs()
    out = search(inputs, ["dp", "ddp_synced"], price)
    assert {c.strategy for c in out.fastest} == {"ddp_synced"}
    assert set(out.unranked) == {"dp"} and "lower bound" in out.unranked["dp"]
    priced = replace(inputs, compute=replace(inputs.compute, dp_thread_overhead_s=0.001))
    given = search(priced, ["dp", "ddp_synced"], price)
    assert given.unranked == {} and "dp" in {c.strategy for c in given.fastest}


def test_a_candidate_of_the_search_keeps_the_main_passs_optimizer_step():
    from topoprof.model.inputs.search import candidate_compute

    optimizer = OptimizerRates(4, (1e12, 2e12), (1e-6, 2e-6), "profile")
    main = Compute(micro_batch_time_s=None, gpu="h100-sxm",
                   modelled=modelled((0.1, 0.2, 0.3), host_s=0.01, optimizer=optimizer))
    candidate = candidate_compute(main, modelled((0.2, 0.4, 0.6), host_s=0.02))
    assert candidate.modelled == modelled((0.2, 0.4, 0.6), host_s=0.02, optimizer=optimizer)


def test_a_size_that_fits_at_the_searchs_ceiling_is_shown_as_at_least_that():
    """The search doubles up to MAX_MICRO_BATCH and stops: a size that fits there is a floor,
    not the largest that fits (a small model on an 80 GB GPU fits 1024 sequences with room left)."""
    from topoprof.model.strategies.search import MAX_MICRO_BATCH, FitCell
    from topoprof.report.text_fits import _cell

    assert _cell(FitCell(MAX_MICRO_BATCH, 63.1, None)) == f">={MAX_MICRO_BATCH} (63.1 GB)"
    assert _cell(FitCell(20, 85.0, 89.2)) == "20 (85.0 GB)"  # the next size, 21, did not fit
