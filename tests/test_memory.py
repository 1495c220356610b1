"""Memory per GPU by strategy: the counts, whether they fit, and that nothing that does not fit is
recommended."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers.cli import topoprof
from helpers.model_reports import model_report

from topoprof.model.comm.collectives import RingComm
from topoprof.model.compute.datasheet import named_gpu
from topoprof.model.compute.timing import Compute
from topoprof.model.memory import holding
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.predict import predict
from topoprof.specs.messages import StepMemory

N = 1_000_000_000


def test_adamw_with_fp32_weights_is_zeros_16_bytes_per_parameter():
    held = holding.holding("single", holding.MemoryModel(N))
    assert held.params + held.grads + held.optimizer == 16 * N  # ZeRO §3.1's 2 + 2 + 12, held in fp32
    assert holding.holding("single", holding.MemoryModel(N, optimizer="sgd")).optimizer == 0
    assert holding.holding("single", holding.MemoryModel(N, optimizer="sgd_momentum")).optimizer == 4 * N
    bf16 = holding.holding("single", holding.MemoryModel(N, param_bytes=2, grad_bytes=2))
    assert bf16.states == 8 * N  # AdamW's moments in the parameters' dtype


def test_ddp_buckets_are_a_copy_of_the_gradients_unless_they_are_the_gradients():
    assert holding.holding("ddp_synced", holding.MemoryModel(N)).buckets == 4 * N
    assert holding.holding("ddp_synced", holding.MemoryModel(N, gradient_as_bucket_view=True)).buckets == 0
    assert holding.holding("dp", holding.MemoryModel(N)).buckets == 0


def test_fsdp_shards_and_its_working_set():
    m = holding.MemoryModel(N, world_size=8, gpus_per_node=4, largest_group_params=N // 32, fsdp_param_bytes=2)
    full = holding.holding("fsdp_full_shard", m)
    assert (full.params, full.grads, full.optimizer) == (4 * N / 8, 4 * N / 8, 8 * N / 8)
    # the running group and the prefetched one in param_dtype, the running group's gradient in reduce_dtype
    assert full.unsharded == 2 * 2 * (N // 32) + 4 * (N // 32)
    no_sync = holding.holding("fsdp_full_shard_no_sync", m)
    assert no_sync.unsharded - full.unsharded == 4 * (N - N // 32)  # every group's gradient, full size
    grad_op = holding.holding("fsdp_shard_grad_op", m)
    assert grad_op.unsharded >= 2 * N  # every group stays unsharded from forward to backward
    hsdp = holding.holding("hsdp", m)
    assert hsdp.params == 4 * N / 4  # sharded inside a node only
    assert holding.holding("something_else", m) is None


def test_fit_and_its_reason():
    held = holding.Holding(40e9, 40e9, 80e9, activations=None)
    unknown = holding.fit(held, None)
    assert unknown.fits is None and "unknown" in unknown.reason
    no = holding.fit(held, 80e9)
    assert no.fits is False and "160.0 GB of 80.0 GB" in no.reason and "alone" in no.reason
    assert holding.fit(held, 200e9).fits is True  # the states alone fit; the reason says activations are unknown
    assert "activations unknown" in holding.fit(held, 200e9).reason
    full = holding.Holding(10e9, 10e9, 20e9, activations=30e9)
    assert holding.fit(full, 80e9) == holding.Fit(True, None)


GIB = 2 ** 30 / 1e9  # NVIDIA's "GB" of memory are GiB: the H200 here, "141 GB", showed 143771 MiB


def test_gpu_memory_from_the_name_or_the_datasheet():
    assert named_gpu("NVIDIA H100 80GB HBM3").memory_gb[0] == 80 * GIB
    assert named_gpu("Tesla V100-SXM2-32GB").memory_gb[0] == 32 * GIB
    assert named_gpu("v100-sxm2").memory_gb[0] == 16 * GIB and "smaller" in named_gpu("v100-sxm2").memory_gb[1]
    assert named_gpu("h200-sxm").memory_gb[0] == 141 * GIB
    # the H200 of reports/gpu-nvidia-h200-20261126: nvidia-smi's 143771 MiB is within 0.5 % of 141 GiB
    assert abs(143771 * 2 ** 20 / 1e9 / named_gpu("h200-sxm").memory_gb[0] - 1) < 0.005
    assert named_gpu("no such gpu").memory_gb is None


def test_largest_group_is_a_block():
    from topoprof.workload.presets import get_preset

    layout = get_preset("llama-7b")
    block = sum(t.numel for t in layout.tensors if t.name.startswith("model.layers.0."))
    # root: embeddings, head, norm
    assert Workload(layout).largest_fsdp_group_params == max(block, 2 * 32000 * 4096 + 4096)
    assert Workload(layout, fsdp_unit="nothing").largest_fsdp_group_params == layout.params  # no groups: whole


def _llama(**compute) -> ModelInputs:
    return ModelInputs(Workload.from_preset("llama-7b", tokens_per_micro_batch=4096),
                       Compute(gpu="h100-sxm", **compute),
                       Cluster(RingComm(370.0, 3.4, 8), 1, 8))


def test_7b_under_ddp_does_not_fit_on_an_80gb_gpu():
    from topoprof.model.memory import environment as env

    pred = predict(_llama())
    ddp = pred.strategies["ddp_synced"].memory
    params = 6_738_415_616
    assert ddp.fits is False and ddp.gpu_memory_gb == 80 * GIB
    assert ddp.parts_gb["params"] == pytest.approx(4 * params / 1e9)
    # the backward's peak (the states, 20 B per parameter with DDP's buckets, and Korthikanti's
    # activations) against the foreach AdamW step's (the states and one fp32 list per parameter),
    # each beside cuBLAS's two 32 MiB workspaces on an H100 (compute capability 9.0)
    backward, step = 20 * params + 34 * 4096 * 4096 * 32, 20 * params + 4 * params
    allocated = max(backward, step) + 2 * 32 * 2 ** 20
    low = allocated + env.CUDA_CONTEXT_BYTES[0] + env.DRIVER_RESERVE_BYTES + env.nccl_bytes(1)[0]
    high = (allocated + env.CUDA_CONTEXT_BYTES[1] + env.DRIVER_RESERVE_BYTES + env.nccl_bytes(1)[1]
            + env.FRAGMENTATION_SHARE[1] * allocated)
    assert ddp.range_gb == pytest.approx((low / 1e9, high / 1e9))
    assert ddp.total_gb == pytest.approx(high / 1e9)
    assert "does not fit" in ddp.reason and "buckets 27.0" in ddp.reason
    assert ddp.parts_gb["logits"] == 0 and "not counted" in ddp.sources["logits"]  # no op trace here
    bigger = predict(_llama(gpu_memory_gb=400.0)).strategies["ddp_synced"].memory
    assert bigger.fits is True


def test_nothing_that_does_not_fit_is_recommended():
    from topoprof.report.recommend import fit_recommendation, rank, strategy_recommendations

    def strategy(step, fits, total=100.0):
        return {"step_time_s": step, "comm_exposed_s": 0.0,
                "memory": {"fits": fits, "total_gb": total, "gpu_memory_gb": 80.0, "reason": "does not fit: needs",
                           "parts_gb": {"activations": 1.0}}}
    pred = model_report(inputs={"accumulation_steps": 8, "world_size": 8},
                        strategies={"single": strategy(8.0, False), "ddp_synced": strategy(1.2, False),
                                    "ddp_no_sync": strategy(1.0, False), "fsdp_full_shard": strategy(1.5, True, 40.0),
                                    "fsdp_full_shard_no_sync": strategy(1.3, True, 70.0)})
    assert all(r.key != "no_sync" for r in strategy_recommendations(pred, "7B"))
    fit = fit_recommendation(pred, "7B")
    assert fit.key == "fits" and fit.numbers["strategy"] == "fsdp_full_shard_no_sync"
    assert rank([*strategy_recommendations(pred, "7B"), fit])[0].key == "fits"
    assert "takes 1.3 s per step" in fit.why


def test_dataparallels_lower_bound_is_recommended_only_with_its_overhead_given():
    from topoprof.report.recommend import fit_recommendation

    def strategy(step, fits, total=100.0):
        return {"step_time_s": step, "comm_exposed_s": 0.0,
                "memory": {"fits": fits, "total_gb": total, "gpu_memory_gb": 80.0, "reason": "does not fit: needs",
                           "parts_gb": {"activations": 1.0}}}
    strategies = {"ddp_synced": strategy(1.2, False), "dp": strategy(0.9, True, 78.0),
                  "fsdp_full_shard": strategy(1.5, True, 40.0)}
    unpriced = model_report(inputs={"accumulation_steps": 1, "world_size": 8}, strategies=strategies)
    assert fit_recommendation(unpriced, "7B").numbers["strategy"] == "fsdp_full_shard"
    given = model_report(inputs={"accumulation_steps": 1, "world_size": 8, "dp_thread_overhead_s": 0.01},
                         strategies=strategies)
    assert fit_recommendation(given, "7B").numbers["strategy"] == "dp"
    alone = model_report(inputs={"accumulation_steps": 1, "world_size": 8},
                         strategies={"ddp_synced": strategy(1.2, False), "dp": strategy(0.9, True, 78.0)})
    assert fit_recommendation(alone, "7B") is None


def test_advice_says_a_duration_in_the_unit_its_size_reads_in():
    from topoprof.report.units import duration

    assert [duration(s) for s in (0.0093, 0.9996, 1.5, 99.96, 5999.0, 51706.7)] == \
        ["9.3 ms", "999.6 ms", "1.5 s", "1.7 min", "1.7 h", "14.4 h"]
    assert duration(0.9996, 0) == "1.0 s"  # never "1000 ms"


@pytest.mark.slow
def test_model_cli_says_what_does_not_fit():
    proc = topoprof("model", "--preset", "llama-7b", "--gpu", "h100-sxm", "--world-size", "8", "--tokens", "4096",
                    "--link-bandwidth", "370", "--no-sweep",
                    "--micro-batch-time", "0.4",  # the compute given; the memory still traced
                    timeout=120)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("ddp_synced "))
    assert "does not fit: needs 167.6 GB of 85.9 GB" in row
    doc = json.loads(topoprof("model", "--preset", "gpt2", "--gpu", "h100-sxm", "--world-size", "2", "--tokens", "1024",
                              "--link-bandwidth", "370", "--no-sweep", "--json", timeout=120).stdout)
    mem = doc.get("model", doc)["strategies"]["ddp_synced"]["memory"]
    assert mem["fits"] is True and mem["basis"] == "counted" and set(mem["parts_gb"]) >= {"params", "activations"}


def test_memory_a_gpu_measured_replaces_the_count():
    """The bytes per phase of a timed step (probes/ranks/model_timing.py on a GPU) stand in for the
    counted ones: the same sharding and buckets apply to them."""
    from topoprof.workload.presets import get_preset

    layout = get_preset("gpt2")
    n = layout.params
    measured = StepMemory("cuda:0", params_bytes=4 * n, optimizer_bytes=8 * n, activations_bytes=3_000_000_000,
                          grads_bytes=4 * n, peak_bytes=5_000_000_000)
    work = Workload(layout, tokens_per_micro_batch=1024, measured_memory=measured)
    pred = predict(ModelInputs(work, Compute(gpu="h100-sxm", micro_batch_time_s=0.1),
                               Cluster(RingComm(370.0, 3.4, 2), 1, 2)))
    ddp = pred.strategies["ddp_synced"].memory
    assert ddp.basis.startswith("measured on cuda:0")
    assert ddp.parts_gb["activations"] == pytest.approx(3.0)
    assert ddp.parts_gb["optimizer"] == pytest.approx(8 * n / 1e9)
    assert ddp.parts_gb["buckets"] == pytest.approx(4 * n / 1e9)
    from topoprof.model.memory import environment as env

    # cuBLAS's workspaces were allocated in the warm-up, before the phases were read: added to them
    workspace = 2 * 32 * 2 ** 20
    low = 20 * n + 3e9 + workspace + env.CUDA_CONTEXT_BYTES[0] + env.DRIVER_RESERVE_BYTES + env.nccl_bytes(1)[0]
    assert ddp.range_gb[0] == pytest.approx(low / 1e9)  # the measured activations hold the logits and copies
    assert "measured" in ddp.sources["logits"]


def test_what_does_not_fit_is_neither_swept_nor_offered():
    from topoprof.model.strategies.model_plan import plan_model
    from topoprof.model.strategies.model_report import model_payload

    payload = model_payload(plan_model(_llama(micro_batch_time_s=0.4), {"link_bandwidth_gbps": 370}))
    assert all(step is None for step in payload["sweep"]["strategies"]["ddp_synced"])
    assert all(step is not None for step in payload["sweep"]["strategies"]["fsdp_full_shard"])
    for option in payload["fixed_global_batch"]["options"]:
        assert option["step_time_s"] is None and "does not fit" in option["reason"]


def test_the_memory_tables_columns_are_headed_by_the_whole_strategy_names():
    from topoprof.model.strategies.model_plan import plan_model
    from topoprof.model.strategies.model_report import model_payload, read_model_report
    from topoprof.report.text_fits import PARTS_COLUMNS, memory_parts_lines

    report = read_model_report(model_payload(plan_model(_llama(micro_batch_time_s=0.4), {"link_bandwidth_gbps": 370},
                                                        sweep=False)))
    lines = memory_parts_lines(report)
    head = lines[2:lines.index(next(line for line in lines if line.lstrip().startswith("weights")))]
    width, first = 15, 2 + 26
    columns = (len(head[0]) - first) // width
    names = ["_".join(cell for line in head if (cell := line.ljust(first + columns * width)
                                                [first + j * width:first + (j + 1) * width].strip()))
             for j in range(columns)]
    # fsdp_full_shard and its no_sync twin were both "fsdp_full_shar" when cut at 14 characters
    assert names == [n for n in PARTS_COLUMNS if (r := report.result(n)) is not None and r.memory is not None]
    assert "fsdp_full_shard_no_sync" in names and "fsdp_shard_grad_op_no_sync" in names


def test_the_gpu_the_compute_was_timed_on_is_the_memory_to_fit():
    from topoprof.model.compute.measured import MeasuredCompute
    from topoprof.model.inputs import resolve
    from topoprof.model.inputs.request import ComputeRequest, MemoryRequest

    timed = MeasuredCompute(0.1, 0.6, 0.01, "timed", "NVIDIA H100 80GB HBM3", int(85.5e9))
    origins: list = []
    memory = resolve._memory_of_the_timed_gpu(MemoryRequest(), ComputeRequest(), timed, origins)
    assert memory.gpu_memory_gb == 85.5 and origins == [("gpu_memory_gb", "NVIDIA H100 80GB HBM3's memory as CUDA "
                                                                         "reported it where the compute was timed")]
    on_a_cpu = replace(timed, device_name=None, device_memory_bytes=None)
    for memory, compute, record in ((MemoryRequest(gpu_memory_gb=40.0), ComputeRequest(), timed),  # --gpu-memory wins
                                    (MemoryRequest(), ComputeRequest(gpu="h100-sxm"), timed),  # another GPU named
                                    (MemoryRequest(), ComputeRequest(), on_a_cpu),
                                    (MemoryRequest(), ComputeRequest(), None)):  # nothing timed
        assert resolve._memory_of_the_timed_gpu(memory, compute, record, origins) is memory
    assert len(origins) == 1


def test_sweep_with_no_strategy_that_fits_says_so_instead_of_an_empty_table():
    from topoprof.report.text_model import _sweep_rows

    sweep = {"world_size": 8, "samples_per_micro_batch": 1}
    none_fit = model_report(sweep={**sweep, "accum": [1, 2, 4],
                                   "strategies": {"single": [None] * 3, "ddp_synced": [None] * 3}}).sweep
    assert _sweep_rows(none_fit) == ["Step time by accumulation steps K: none (no strategy above fits in memory "
                                     "and applies here)"]
    one_fits = model_report(sweep={**sweep, "accum": [1, 2],
                                   "strategies": {"single": [0.1, 0.2], "ddp_synced": [None, None]}}).sweep
    lines = _sweep_rows(one_fits)
    assert lines[0] == "Step time (ms) by accumulation steps K:" and len(lines) == 3 and lines[2].startswith("single")


def test_a_what_if_counts_the_activations_from_its_op_trace():
    """An image model has no activation formula: its --gpu what-if's op trace counts them, and
    twice the images hold twice the batch's tensors, less the few that do not scale (batch norm's
    per-channel statistics, the loss)."""
    def activations(images: int) -> dict:
        doc = json.loads(topoprof("model", "--preset", "resnet50", "--gpu", "a100-sxm4-80gb", "--world-size", "1",
                                  "--micro-batch-size", str(images), "--image-size", "64", "--no-sweep", "--json",
                                  timeout=180).stdout)
        return doc.get("model", doc)["inputs"]["activation_memory_gb"]

    one, two = activations(2), activations(4)
    assert one["source"].startswith("counted from the op trace at 2x3x64x64")
    assert one["value"] > 0 and 1.9 * one["value"] < two["value"] < 2 * one["value"]


def test_every_part_is_named_with_its_source_and_cpu_ranks_hold_no_gpu_environment():
    from topoprof.model.memory import environment as env

    layout_inputs = _llama()
    ddp = predict(layout_inputs).strategies["ddp_synced"].memory
    named = {"params", "grads", "optimizer", "buckets", "unsharded", "activations", "logits", "param_copies",
             "backward_transient", "optimizer_transient", "cuda_context", "driver_reserve", "nccl_buffers", "allocator"}
    assert named <= set(ddp.parts_gb)
    assert {"activations", "logits", "param_copies", "backward_transient", "optimizer_transient", "cuda_context",
            "driver_reserve", "nccl_buffers", "allocator"} <= set(ddp.sources)
    assert ddp.parts_gb["nccl_buffers"] == pytest.approx(env.nccl_bytes(1)[1] / 1e9)  # one communicator
    single = predict(layout_inputs).strategies["single"].memory
    assert single.parts_gb["nccl_buffers"] == 0  # one process alone communicates nothing
    cpu = ModelInputs(layout_inputs.workload, layout_inputs.compute,
                      Cluster(RingComm(10.0, 30.0, 8), 1, 8, backend="gloo"))
    mem = predict(cpu).strategies["ddp_synced"].memory
    assert "cuda_context" not in mem.parts_gb and "CPU ranks" in mem.sources["cuda_context"]
    numels = [t.numel for t in layout_inputs.workload.layout.tensors]
    # for-loop AdamW: a parameter's square root and quotient, and the previous parameter's denom
    held = max(2 * n + prev for prev, n in zip([0, *numels], numels))
    assert mem.parts_gb["optimizer_transient"] == pytest.approx(4 * held / 1e9)
    assert 2 * max(numels) <= held <= 3 * max(numels)
