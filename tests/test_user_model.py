"""`--model PATH:CALLABLE`: the user's parameters read as DDP reads them, buckets equal to torch's
own rebuilt buckets, measured compute in the prediction, and one-line errors for bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers.cli import topoprof

from topoprof.errors import InputError
from topoprof.model.ddp.buckets import ddp_buckets
from topoprof.model.inputs.request import check_spec
from topoprof.model.inputs.user_record import (
    ReadyOrder,
    choose_ready_order,
    flop_order_reason,
    stated_shape,
    trace_wanted,
    user_compute,
    user_layout,
)
from topoprof.specs.messages import TimedPass, TraceFailure, UserModelRecord
from topoprof.specs.traced_pass import ParamEntry, TracedPass

# Its tests share one module fixture of rank launches: one worker runs them all, so the launches
# run once (`--dist loadgroup` in pyproject.toml), not once on each worker that takes a test of it.
pytestmark = pytest.mark.xdist_group("user_model")

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "user_models", "tied.py")


@pytest.fixture(scope="module")
def record():
    # in a process of its own, as the CLI does: torch work in the test process itself could meet
    # the state earlier tests left there (threads, a process group)
    from topoprof.measure.user_model import measure_user_model

    return measure_user_model(f"{FIXTURE}:build", "cpu", 2, timeout_s=120, trace=stated_shape(4, None))


_TORCH_BUCKETS = """
import json, sys, tempfile
import torch, torch.distributed as dist
from topoprof.zoo.user_callable import call_user_callable, user_loss
spec, cap = sys.argv[1], json.loads(sys.argv[2])
module, batch, loss_fn = call_user_callable(spec)
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
ddp = torch.nn.parallel.DistributedDataParallel(module, **({} if cap is None else {"bucket_cap_mb": cap}))
for _ in range(3):
    user_loss(ddp, batch, loss_fn).backward()
data = ddp._get_ddp_logging_data()
print(json.dumps([data["has_rebuilt_buckets"], data["rebuilt_per_bucket_param_indices"]]))
"""


def _torch_rebuilt_buckets(bucket_cap_mb):
    """The buckets a real DDP run rebuilds after its first iteration (one gloo rank), read in a
    fresh interpreter."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", _TORCH_BUCKETS, f"{FIXTURE}:build", json.dumps(bucket_cap_mb)],
                          capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stderr[-1500:]
    rebuilt, indices = json.loads(proc.stdout.splitlines()[-1])
    assert rebuilt == 1
    return [tuple(int(i) for i in bucket.split()) for bucket in indices.split(", ")]


def test_parameters_as_ddp_sees_them(record):
    names = [p.name for p in record.params]
    assert names[:2] == ["out.weight", "out.bias"]           # registration order, not forward order
    assert "embed.weight" not in names                       # tied: counted once, under its first name
    shared = next(p for p in record.params if p.name == "head.weight")
    assert shared.aliases == ["embed.weight"]
    assert [p.requires_grad for p in record.params if p.name.startswith("frozen")] == [False, False]
    layout = user_layout(record)
    assert not any(t.name.startswith("frozen") for t in layout.tensors)
    from topoprof.zoo.user_callable import call_user_callable

    module = call_user_callable(f"{FIXTURE}:build")[0]
    assert layout.params == sum(p.numel() for p in module.parameters() if p.requires_grad)


@pytest.mark.parametrize("bucket_cap_mb", [None, 0.02, 0.005])
def test_buckets_equal_torch_rebuilt_buckets(record, bucket_cap_mb):
    ours = [b.tensor_indices for b in ddp_buckets(user_layout(record), 4, bucket_cap_mb)]
    assert ours == _torch_rebuilt_buckets(bucket_cap_mb)
    if bucket_cap_mb == 0.005:
        assert len(ours) > 3                                  # a cap that really splits


def test_measured_compute_is_positive_with_its_source(record):
    compute = user_compute(record)
    assert compute.micro_batch_time_s > 0 and compute.optimizer_time_s > 0
    assert 0 < compute.backward_fraction < 1
    assert "measured on cpu (fp32, AdamW), 2 repeats" in compute.source


@pytest.mark.parametrize("spec, says", [
    ("tied.py", "expected PATH.py:CALLABLE"),
    ("missing/model.py:build", "no such file"),
    ("tied.py:not-a-name", "expected PATH.py:CALLABLE"),
])
def test_spec_is_checked_before_anything_runs(spec, says):
    with pytest.raises(InputError, match=says):
        check_spec(spec)


def _model_cli(spec: str):
    return topoprof("model", "--model", spec, "--world-size", "2", "--link-bandwidth", "10", "--accum", "4",
                    "--no-sweep", "--json", timeout=300)


def test_model_command_uses_the_measured_model():
    proc = _model_cli(f"{FIXTURE}:build")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    inputs = doc["inputs"]
    assert inputs["model"]["value"].startswith("user:")
    assert "measured on cpu" in inputs["micro_batch_time_s"]["source"]
    assert "measured on cpu" in inputs["optimizer_time_s"]["source"]


@pytest.mark.parametrize("callable_name, says, traceback", [
    ("raises", "raised ValueError: no data here", True),
    ("wrong_shape", "returned Linear; expected (module, example_batch)", False),
    ("no_trainable", "no parameter with requires_grad", False),
    ("absent", "has no callable named 'absent'", False),
])
def test_bad_user_model_is_one_line_and_exit_2(callable_name, says, traceback):
    proc = _model_cli(f"{FIXTURE}:{callable_name}")
    assert proc.returncode == 2, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("topoprof: error: --model ") and says in first
    assert ("Traceback (most recent call last)" in proc.stderr) == traceback
    assert proc.stderr.count("Traceback") <= 1


@pytest.mark.slow
def test_a_rank_slower_than_its_timeout_per_rotation_goes_on_and_is_not_taken_for_hung():
    # each forward sleeps 0.5 s (tied.py:slow): a rotation's micro-batches outlast the 4 s timeout
    # (ended as hung when the ranks said nothing between rotations), none of them alone does; the
    # ranks say so as they go, and the run ends measured
    proc = topoprof("validate", "--model", f"{FIXTURE}:slow", "--nproc", "2", "--backend", "gloo", "--modes",
                    "ddp_synced", "--accum", "2", "--steps", "1", "--warmup-steps", "0", "--no-numerics", "--timeout",
                    "4", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["modes"]["ddp_synced"]["measured_step_s"] >= 2 * 0.5  # a step's 2 forwards


@pytest.mark.slow
def test_validate_trains_the_user_model_in_every_mode():
    given = topoprof("validate", "--model", f"{FIXTURE}:pair", "--micro-batch", "4", timeout=120)
    assert given.returncode == 2 and "validate trains your --model on the example batch" in given.stderr
    proc = topoprof("validate", "--model", f"{FIXTURE}:pair", "--nproc", "2", "--backend", "gloo", "--steps", "2",
                    "--warmup-steps", "1", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["setup"]["spec"] == {"user_model": f"{FIXTURE}:pair"}
    assert doc["label"] == f"user:{FIXTURE}:pair"
    # trained on its example batch of 2 every micro-batch, and planned so (the default of 4 before)
    assert doc["setup"]["micro_batch"] == 2
    from topoprof.zoo.user_callable import call_user_callable

    module = call_user_callable(f"{FIXTURE}:pair")[0]
    assert doc["setup"]["params"] == sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert doc["numerics"] is None                       # the numerics check trains the synthetic model
    for mode in ("ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only"):
        m = doc["modes"][mode]
        # a 21K-parameter model's steps are all latency and noise: accuracy is the benchmark's
        # (bench_validate.py --parts user); here every mode is measured and predicted
        assert m["measured_step_s"] > 0 and m["predicted_step_s"] > 0
    # every step reduced the buckets the model predicted: the rotations' bucket sizes are DDP's
    from topoprof.measure.user_model import measure_user_model
    from topoprof.model.ddp.buckets import ddp_buckets
    from topoprof.model.inputs.user_record import user_layout

    predicted = sorted(b.numel for b in ddp_buckets(user_layout(measure_user_model(f"{FIXTURE}:pair", "cpu", 1)), 4))
    assert sorted(doc["rotations"]["rotations"][0][0]["bucket_numel"]) == predicted


def test_a_scans_validation_plans_a_users_model_at_its_example_batch():
    """The validation trains a user's model on its example batch: its micro-batch is that batch's
    samples (1 where they cannot be counted), the synthetic model's default otherwise."""
    from topoprof.scan.options import ScanOptions, validate_options

    record = UserModelRecord(f"{FIXTURE}:pair", "cpu", [ParamEntry("w", [4, 4])], samples=2, ready=[[0, 1.0]])
    opts = ScanOptions("gloo", 2, "", user_model=f"{FIXTURE}:pair", user_record=record)
    assert validate_options(opts).micro_batch == 2
    assert validate_options(replace(opts, user_record=replace(record, samples=None))).micro_batch == 1
    assert validate_options(ScanOptions("gloo", 2, "")).micro_batch == 4


@pytest.mark.slow
def test_scan_predicts_the_user_model_and_refuses_a_broken_one(tmp_path):
    def scan(name, out):
        return topoprof("scan", "--quick", "--no-validate", "--nproc", "2", "--backend", "gloo", "--model",
                        f"{FIXTURE}:{name}", "--out", str(out), timeout=600)

    proc = scan("build", tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    (pred,) = report["predictions"]
    assert pred["label"] == f"user:{FIXTURE}:build"
    assert "measured on cpu" in pred["compute_source"]
    assert pred["inputs"]["micro_batch_size"]["value"] == 4  # its example batch's samples, timed and trained so
    assert "user_record" not in report["inputs"] and report["inputs"]["user_model"] == f"{FIXTURE}:build"
    given = topoprof("scan", "--model", f"{FIXTURE}:build", "--micro-batch-size", "2", timeout=120)
    assert given.returncode == 2 and "a scan trains your --model on the example batch" in given.stderr
    proc = scan("raises", tmp_path / "bad")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0].startswith("topoprof: error: --model ")
    assert not (tmp_path / "bad" / "report.json").exists()


def test_cpu_ranks_time_in_fp32_and_sgd_is_honoured():
    from topoprof.measure.user_model import measure_user_model
    from topoprof.probes.ranks.model_timing import precision_context

    for precision in ("bf16", "fp16", "fp32"):
        _, used, scaler = precision_context(precision, "cpu")
        assert used == "fp32" and scaler is None
    record = measure_user_model(f"{FIXTURE}:build", "cpu", 1, precision="bf16", optimizer="sgd")
    assert record.precision == "fp32" and record.optimizer == "SGD"
    with pytest.raises(InputError, match="adamw or sgd"):
        from topoprof.model.inputs.user_model import measure_here

        measure_here(f"{FIXTURE}:build", optimizer="adam")


H100 = "NVIDIA H100 80GB HBM3"  # as torch.cuda.get_device_name names it


@pytest.mark.parametrize("device, name, gpu, micro_batch_time, says", [
    ("cuda:0", H100, None, None, None),                 # timed on the GPU predicted: its own order
    ("cuda:0", H100, "H100 SXM", None, None),           # --gpu naming this same GPU
    ("cuda:0", H100, "A100 SXM", None, "timed on NVIDIA H100 80GB HBM3 (cuda:0), not on the A100 SXM predicted"),
    ("cpu", None, None, None, "timed on cpu, not on a GPU"),
    ("cpu", None, "H100 SXM", None, "timed on cpu, not on the H100 SXM predicted (--gpu)"),
    ("cuda:0", H100, None, 0.1, "the compute is given (--micro-batch-time)"),
])
def test_the_timed_order_only_for_the_device_timed(device, name, gpu, micro_batch_time, says):
    why = flop_order_reason(device, name, gpu, micro_batch_time)
    assert why == says if says is None else says in why
    assert trace_wanted(device, gpu, micro_batch_time) or why is None  # a reason never lacks its trace


def test_a_cpu_timing_takes_its_order_from_the_backward_flops(record):
    trace = record.op_trace
    assert isinstance(trace, TracedPass)
    assert trace.params == record.params                    # one index for both
    assert sorted(i for i, _ in trace.ready) == sorted(i for i, _ in record.ready)
    order = choose_ready_order(record)
    assert order.ready == trace.ready and order.note is None
    layout = user_layout(record, order)
    assert layout.source.endswith("gradient-ready order: backward FLOPs per tensor (FlopCounterMode on meta at "
                                  "4x32), since it was timed on cpu, not on a GPU")
    trainable = [i for i, p in enumerate(record.params) if p.requires_grad]
    schedule = [(trainable[r.index], r.ready_fraction) for r in layout.ready_schedule()]
    assert [i for i, _ in schedule] == [i for i, _ in trace.ready]
    assert [f for _, f in schedule] == pytest.approx([f for _, f in trace.ready])


def test_a_timing_on_the_gpu_predicted_keeps_its_order(record):
    on_gpu = replace(record, device="cuda:0", device_name=H100)
    order = choose_ready_order(on_gpu, gpu="H100 SXM")
    assert order == ReadyOrder(record.ready, "gradient-ready order: measured on cuda:0")
    assert user_layout(on_gpu, order).source.endswith("; gradient-ready order: measured on cuda:0")
    assert user_layout(record).source.endswith("; gradient-ready order: measured on cpu")  # scan, validate


@pytest.mark.parametrize("trace, says", [
    (TraceFailure("on meta, RuntimeError: Tensor.item() cannot be called on meta tensors"), "Tensor.item()"),
    (None, "no pass on meta was run"),
    ("renamed", "has other parameters than the one timed"),
])
def test_a_failed_meta_pass_keeps_the_timed_order_and_says_why(record, trace, says):
    if trace == "renamed":
        assert isinstance(record.op_trace, TracedPass)
        trace = replace(record.op_trace, params=[replace(p, name="x" + p.name) for p in record.params])
    order = choose_ready_order(replace(record, op_trace=trace), micro_batch_time=0.1)
    assert order.ready == record.ready
    assert order.text.startswith("gradient-ready order: measured on cpu, although the compute is given")
    assert says in order.text and says in order.note


def test_a_gpu_timing_runs_for_a_minimum_time_and_no_timed_pass_carries_hooks(monkeypatch):
    """On a GPU, warm-up and timed passes each go on for a minimum time (a few short passes of a
    host-bound model spread widely); the ready order comes from the last warm-up pass, so that no
    timed pass pays a hook per tensor; the memory phases are read on the first timed pass."""
    import topoprof.probes.ranks.model_timing as worker

    clock = [0.0]
    monkeypatch.setattr(worker.time, "perf_counter", lambda: clock[0])
    calls = []

    def step(hooks=False, memory_phases=False, seconds=0.05):
        clock[0] += seconds
        calls.append((hooks, memory_phases))
        return TimedPass(seconds / 3, 2 * seconds / 3, [[0, 1.0]] if hooks else []), 0.001

    assert worker._warm_up(step, cuda=True) == [[0, 1.0]]
    assert len(calls) == round(worker.GPU_WARMUP_S / 0.05) + 1 and calls[-1] == (True, False)
    assert not any(hooks for hooks, _ in calls[:-1])
    calls.clear()
    passes, _ = worker._timed_passes(step, cuda=True, repeats=3)
    assert len(passes) == round(worker.GPU_TIMED_S / 0.05)
    assert calls[0] == (False, True) and not any(h or m for h, m in calls[1:])
    # a pass so short that the time would take more than the cap: the cap ends it
    calls.clear()
    passes, _ = worker._timed_passes(lambda **kw: step(seconds=1e-4, **kw), cuda=True, repeats=3)
    assert len(passes) == 3 * worker.MAX_PASSES_PER_REPEAT
    # on a CPU a pass is long and steady: one warm-up, `repeats` timed passes
    calls.clear()
    worker._warm_up(step, cuda=False)
    passes, _ = worker._timed_passes(step, cuda=False, repeats=2)
    assert calls == [(True, False), (False, True), (False, False)] and len(passes) == 2


def test_a_loss_fn_that_cannot_take_output_and_batch_is_named_before_it_runs():
    """loss_fn is called as loss_fn(output, batch): one of one argument is the user's to fix, said
    as such, not a TypeError out of the model's pass."""
    import torch

    from topoprof.zoo.user_callable import UserModelError, user_loss

    module, batch = torch.nn.Linear(4, 2), torch.zeros(3, 4)
    with pytest.raises(UserModelError, match=r"cannot be called as loss_fn\(output, batch\)"):
        user_loss(module, batch, lambda out: out.sum())
    assert user_loss(module, batch, lambda out, batch: out.sum()).numel() == 1
    assert user_loss(module, batch, lambda *args: args[0].sum()).numel() == 1


def test_a_users_model_is_priced_for_the_gpu_predicted_or_beside_its_time_for_the_gpu_it_ran_on():
    from topoprof.model.compute.datasheet import named_gpu
    from topoprof.model.inputs.gather import _timed_gpu_priced
    from topoprof.model.inputs.request import ComputeRequest

    on_gpu = UserModelRecord("m:f", "cuda:0", [], device_name="NVIDIA H100 80GB HBM3", passes=[])
    on_cpu = UserModelRecord("m:f", "cpu", [], passes=[])
    traced = UserModelRecord("m:f", "meta", [])
    a100 = ComputeRequest(gpu="a100-sxm4-80gb")
    assert _timed_gpu_priced(a100, on_gpu) is None                          # the GPU predicted, named
    assert _timed_gpu_priced(a100, None) is None                            # a preset's
    beside = _timed_gpu_priced(ComputeRequest(), on_gpu)                    # timed here, no --gpu
    assert beside is not None and beside.same_row(named_gpu("h100-sxm"))
    timed = _timed_gpu_priced(ComputeRequest(micro_batch_time_s=0.1), on_gpu)
    assert timed is not None and timed.same_row(named_gpu("h100-sxm"))
    assert _timed_gpu_priced(ComputeRequest(), on_cpu) is None              # a CPU's time has no GPU beside it
    assert _timed_gpu_priced(ComputeRequest(), traced) is None
