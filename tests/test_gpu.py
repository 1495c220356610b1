"""On the GPUs that are there: the real driver, NCCL, CUDA copies, bf16 training, a whole scan.

Marked `gpu` and skipped, with the reason, where torch sees no CUDA GPU. `python
tests/run_gpu_suite.py` runs them and writes one summary (docs/gpu-checks.md); each test
records what it measured with `record_property`, which the summary shows.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU: torch.cuda.is_available() is False here")]
ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "topoprof", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def _out_dir(tmp_path: Path, name: str) -> Path:
    """Where a test keeps what the summary should carry: the suite's folder, else a temporary one."""
    base = os.environ.get("TOPOPROF_GPU_SUITE_OUT")
    return Path(base) / name if base else tmp_path / name


def test_topo_on_the_real_driver(record_property):
    proc = _cli("topo", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    topo, probes = doc["topology"], {p["name"]: p for p in doc["topology"]["probes"]}
    record_property("probes", "; ".join(f"{p['name']}: {p['status']}" for p in probes.values()))
    record_property("gpus", ", ".join(f"GPU{g['index']} {g['name']}" for g in topo["gpus"]))
    # NVML lists every GPU of the machine; CUDA_VISIBLE_DEVICES may hide some from torch.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert len(topo["gpus"]) == GPUS if not visible else len(topo["gpus"]) >= GPUS
    assert probes["nvidia-smi"]["status"] in ("ok", "partial"), probes["nvidia-smi"]
    assert probes["NVML"]["status"] in ("ok", "partial"), probes["NVML"]
    for gpu in topo["gpus"]:
        for field in ("name", "pci_bus_id", "compute_capability", "pcie_gen_max", "pcie_width_max", "numa_node"):
            # filled, or named with the driver's reason in the NVML status
            assert gpu[field] is not None or f"{field} (" in probes["NVML"]["detail"], (field, gpu)
    record_property("nvml_detail", probes["NVML"]["detail"])


def test_bench_nccl_on_every_visible_gpu(tmp_path, record_property):
    out = tmp_path / "bench.json"
    proc = _cli("bench", "--backend", "nccl", "--collectives", "all_reduce,all_gather,reduce_scatter",
                "-b", "8", "-e", "256M", "-f", "4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert doc["metadata"]["world_size"] == GPUS and rows
    assert not doc.get("stopped"), doc.get("stopped")  # every size up to 256M, none cut short
    assert all(r["wrong"] == 0 for r in rows)
    record_property("world_size", GPUS)
    record_property("nccl", doc["metadata"].get("nccl_version", "?"))
    if GPUS == 1:  # one rank: the rows time the collective; it moves nothing, so no bandwidth is given
        assert all(r["busbw_gbps"] is None and r["algbw_gbps"] is None for r in rows)
        assert not doc["fit"]
        assert "# One rank: nothing crosses a link, so no bandwidth is given" in proc.stdout
        largest = max((r for r in rows if r["collective"] == "all_reduce"), key=lambda r: r["size_bytes"])
        record_property("largest", f"all_reduce {largest['size_bytes']} B on one rank: {largest['time_us']:.1f} us, "
                                   "no bandwidth (nothing crosses a link)")
    else:
        peak = max(rows, key=lambda r: (r["busbw_gbps"], r["algbw_gbps"]))
        record_property("peak", f"{peak['collective']} {peak['size_bytes']} B: algbw {peak['algbw_gbps']:.1f} GB/s, "
                                f"busbw {peak['busbw_gbps']:.1f} GB/s")
        assert peak["busbw_gbps"] > 0


def _plain_copy_gbps(kind: str, size: int = 256 << 20, iters: int = 10) -> float:
    """The plainest loop: copy_ `iters` times between two synchronizations, wall clock."""
    if kind == "h2d":
        src = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    elif kind == "d2h":
        src = torch.empty(size, dtype=torch.uint8, device="cuda:0")
        dst = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    else:
        src = torch.empty(size, dtype=torch.uint8, device="cuda:0")
        dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return size * iters / (time.perf_counter() - start) / 1e9


def _topoprof_copies(tmp_path: Path) -> dict[str, float]:
    out = tmp_path / "copies.json"
    proc = _cli("bench", "--copies", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    copies = json.loads(out.read_text())["copies"]
    assert copies["status"] == "ok", copies
    found = {}
    for m in copies["measurements"]:
        if m["src"] in ("host", "cuda:0") and m["dst"] in ("host", "cuda:0"):
            found[m["kind"]] = m["bandwidth_gbps"]
    return found


def test_copies_match_a_plain_torch_loop(tmp_path, record_property):
    # Two rounds, topoprof then the plain loop, on GPU 0: medians compared.
    ours, plain = {}, {}
    for _ in range(2):
        for kind, gbps in _topoprof_copies(tmp_path).items():
            ours.setdefault(kind, []).append(gbps)
        for kind in ("h2d", "d2h", "d2d"):
            # a device-to-device copy of 256 MiB takes a fraction of a millisecond: 50 of them keep
            # the host clock's start and wait a small part of the time
            plain.setdefault(kind, []).append(_plain_copy_gbps(kind, iters=50 if kind == "d2d" else 10))
    for kind in ("h2d", "d2h", "d2d"):
        a, b = statistics.median(ours[kind]), statistics.median(plain[kind])
        record_property(kind, f"topoprof {a:.1f} GB/s, plain loop {b:.1f} GB/s, ratio {a / b:.3f}")
        assert 0.9 <= a / b <= 1.1, (kind, ours[kind], plain[kind])


def test_training_worker_on_cuda_in_bf16(record_property):
    import dataclasses

    from topoprof.measure.launch import JobSpec, launch_local, worker_result
    from topoprof.specs.messages import TrainingCalibration, TrainingJob, TrainingResult
    from topoprof.workload.synthetic import spec_for_params

    spec = spec_for_params(25_000_000, seq_len=256)
    config = {"spec": dataclasses.asdict(spec), "mode": "single", "micro_batch": 8, "accum": 4, "steps": 3,
              "warmup_steps": 1, "seed": 0, "amp": "bf16", "optimizer": "adamw"}
    for mode, nproc in (("single", 1), ("ddp_synced", GPUS)):
        result = launch_local(JobSpec("training", TrainingJob(**{**config, "mode": mode}), nproc, "nccl",
                                      timeout_s=300))
        assert result.failure is None, result.failure.describe()
        res = worker_result(result, TrainingResult)
        assert isinstance(res, TrainingResult)
        assert res.mode == mode and res.world_size == nproc and res.step_time_s > 0
        record_property(f"{mode}_step_ms", round(res.step_time_s * 1e3, 2))
        if mode == "single":
            calibration = worker_result(result, TrainingCalibration)
            assert isinstance(calibration, TrainingCalibration)
            cal = calibration.calibration
            assert cal["micro_batch_time_s"] > 0 and cal["optimizer_time_s"] > 0
            record_property("calibration", f"fwd+bwd {cal['micro_batch_time_s'] * 1e3:.2f} ms, "
                                           f"optimizer {cal['optimizer_time_s'] * 1e3:.2f} ms")


def test_user_model_timed_on_cuda_under_each_precision(record_property):
    """`--model` on a GPU: timed on cuda:0 under bf16 and fp16 autocast and fp32, AdamW fused.
    The buckets from its measured ready order hold every trainable tensor once; bf16 and fp16 give
    the same buckets (the same autocast casts), while fp32 may not: under autocast a Linear's
    weight gradient comes through the cast's backward, after its bias's, which can move a tensor
    across a bucket boundary (seen with CPU autocast on this model)."""
    from topoprof.measure.user_model import measure_user_model
    from topoprof.model.ddp.buckets import ddp_buckets
    from topoprof.model.inputs.user_record import user_compute, user_layout

    spec = os.path.join(os.path.dirname(__file__), "fixtures", "user_models", "tied.py") + ":build_1m"
    buckets = {}
    for precision in ("bf16", "fp16", "fp32"):
        record = measure_user_model(spec, "cuda:0", precision=precision)
        assert record.precision == (f"{precision} autocast" if precision != "fp32" else "fp32")
        assert record.optimizer.startswith("AdamW")
        compute = user_compute(record)
        assert compute.micro_batch_time_s > 0 and compute.optimizer_time_s > 0
        layout = user_layout(record)
        buckets[precision] = tuple(tuple(b.tensor_indices) for b in ddp_buckets(layout, 4))
        assert sorted(i for b in buckets[precision] for i in b) == list(range(len(layout.tensors)))
        record_property(f"{precision}_fwd_bwd_ms", round(compute.micro_batch_time_s * 1e3, 3))
    assert buckets["bf16"] == buckets["fp16"]


def test_presets_timed_on_cuda_and_a_too_large_one_scaled(record_property):
    """gpt2 at its real size fits and is timed whole; llama-7b with AdamW in fp32 master weights
    (16 bytes per parameter before activations) exceeds one 80 GB GPU and is timed by its blocks."""
    from topoprof.model.inputs.user_model import measure_preset

    gpt2 = measure_preset("gpt2", 4, 1024, "cuda:0")
    assert gpt2.scaled is None and gpt2.micro_batch_time_s > 0
    record_property("gpt2_4x1024_bf16_ms", round(gpt2.micro_batch_time_s * 1e3, 2))
    memory = torch.cuda.get_device_properties(0).total_memory
    if memory < 7e9 * 16:
        llama = measure_preset("llama-7b", 1, 1024, "cuda:0")
        assert llama.scaled == (2, 4) and "extended linearly to 32" in llama.source
        record_property("llama7b_1x1024_scaled_ms", round(llama.micro_batch_time_s * 1e3, 2))


def test_preset_memory_measured_beside_the_count(record_property):
    """gpt2 timed on cuda:0: its memory by phase (weights, optimizer state, activations,
    gradients) measured with torch.cuda.memory_allocated, beside the counted figures."""
    from topoprof.model.comm.collectives import RingComm
    from topoprof.model.compute.timing import Compute
    from topoprof.model.inputs.user_model import measure_preset
    from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
    from topoprof.model.strategies.predict import predict

    gpt2 = measure_preset("gpt2", 4, 1024, "cuda:0")
    measured = gpt2.memory
    assert measured and all(getattr(measured, k) > 0 for k in ("params_bytes", "optimizer_bytes", "activations_bytes",
                                                               "grads_bytes", "peak_bytes"))
    cluster = Cluster(RingComm(100.0, 3.4, 2), 1, 2)
    compute = Compute(micro_batch_time_s=gpt2.micro_batch_time_s, gpu=torch.cuda.get_device_name(0))
    counted = predict(ModelInputs(Workload.from_preset("gpt2", tokens_per_micro_batch=4096), compute, cluster))
    timed = predict(ModelInputs(Workload.from_preset("gpt2", tokens_per_micro_batch=4096, measured_memory=measured),
                                compute, cluster))
    for part in ("params", "grads", "optimizer", "activations"):
        record_property(f"single_{part}_gb_measured", round(timed.strategies["single"].memory.parts_gb[part], 3))
        record_property(f"single_{part}_gb_counted", round(counted.strategies["single"].memory.parts_gb[part], 3))
    record_property("peak_gb", round(measured.peak_bytes / 1e9, 3))


def test_scan_end_to_end_on_the_real_driver(tmp_path, record_property):
    out = _out_dir(tmp_path, "scan")
    proc = _cli("scan", "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr
    for name in ("report.json", "report.md"):
        assert (out / name).stat().st_size > 0
    doc = json.loads((out / "report.json").read_text())
    probes = {p["name"]: p for p in doc["probes"]}
    record_property("probes", "; ".join(f"{p['name']}: {p['status']}" for p in doc["probes"]))
    record_property("summary", proc.stdout.strip().splitlines()[0])
    record_property("wall_s", doc["timing"]["total_s"])
    assert probes["nvidia-smi"]["status"] in ("ok", "partial"), probes["nvidia-smi"]
    assert probes["ranks"]["status"] == "ok" and all(r["wrong"] == 0 for r in doc["bench"]["rows"])
    assert doc["copies"]["status"] == "ok"
    for chart in doc["charts"].values():
        assert (out / chart).read_bytes().startswith(b"\x89PNG")


def test_validate_on_one_gpu_measures_ddps_own_costs(record_property):
    """One rank on NCCL: every DDP mode measured on GPU0, nothing predicted, and the calibration
    (DDP's own costs at world size 1) that `model --calibration` carries to more GPUs."""
    proc = _cli("validate", "--backend", "nccl", "--nproc", "1", "--params", "25M", "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["setup"]["nproc"] == 1 and doc["modes"]
    for mode, m in doc["modes"].items():
        assert m["measured_step_s"] > 0 and m["predicted_step_s"] is None, (mode, m)
        record_property(mode, f"measured {m['measured_step_s'] * 1e3:.2f} ms")
    cal = doc["calibration"]
    assert cal["micro_batch_time_s"] > 0
    record_property("calibration", {key: cal.get(key) for key in (
        "micro_batch_time_s", "ddp_overhead_s", "ddp_kernel_s", "memory_bandwidth_gbps", "ddp_copy_bandwidth_gbps",
        "optimizer_time_s")})
    assert cal["ddp_copies_basis"], cal  # how DDP's copies are carried: at the measured bandwidth, or one rate
    record_property("ddp_copies_basis", cal["ddp_copies_basis"])


@pytest.mark.skipif(GPUS < 2, reason="validate predicts DDP across ranks: needs 2 or more GPUs (one GPU: the test "
                                     "above)")
def test_validate_with_nccl(record_property):
    proc = _cli("validate", "--backend", "nccl", "--params", "25M", "--modes",
                "ddp_synced,ddp_no_sync,ddp_no_sync_backward_only,dp", "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for mode, m in doc["modes"].items():
        assert m["measured_step_s"] > 0, (mode, m)
        assert m["predicted_step_s"] is not None or mode == "dp", (mode, m)
        predicted = ("no prediction" if m["predicted_step_s"] is None else
                     f"predicted {m['predicted_step_s'] * 1e3:.1f} ms, error {m['error_pct']:+.1f} %")
        record_property(mode, f"measured {m['measured_step_s'] * 1e3:.1f} ms, {predicted}")
    for mode, check in (doc.get("numerics") or {}).items():
        if mode.startswith("ddp"):
            assert check["allclose"] is True, (mode, check)


def test_profile_measures_this_gpu_within_its_time(tmp_path, record_property):
    """`topoprof profile` quick and full: under 20 s and 60 s from the command's start, every
    section measured, nothing skipped but for the time budget, the file loads; and two of its GEMM
    points against torch.utils.benchmark timing the same product (whose time includes the host's
    issue of each call, which the profile's device time leaves out: never slower than it, and
    within 15 % where the product is large enough for the issue not to matter)."""
    from torch.utils.benchmark import Timer

    from topoprof.model.compute.profile import load_profile

    for args, limit_s in ((("--quick",), 20.0), ((), 60.0)):
        out = _out_dir(tmp_path, "profile") / f"profile{'-quick' if args else ''}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        proc = _cli("profile", "--device", "cuda", *args, "--out", str(out), timeout=300)
        took = time.perf_counter() - started
        assert proc.returncode == 0, proc.stderr
        p = load_profile(str(out))
        record_property(f"profile{args and ' --quick' or ''}", f"{took:.1f} s; " + proc.stdout.replace("\n", " | "))
        assert took < limit_s, proc.stderr
        assert p.gemm and p.memory and p.sdpa and p.optimizer is not None
        assert {"op", "autograd_forward", "autograd_backward_node", "autocast_op", "optimizer_per_tensor"} \
            <= set(p.host_seconds_per_op)
        assert [s for s in p.skipped if not s.reason.startswith("time budget")] == []
    for (m, n, k), slack in (((512, 768, 768), None), ((8192, 4096, 4096), 0.15)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        reference = 2 * m * n * k / Timer("a @ b", globals={"a": a, "b": b}).blocked_autorange(min_run_time=0.5).median
        profiled = p.gemm_flops_per_s(m, n, k).value
        record_property(f"gemm {m}x{n}x{k}", f"profile {profiled / 1e12:.1f} TFLOP/s, torch.utils.benchmark "
                                             f"{reference / 1e12:.1f}")
        assert profiled >= 0.9 * reference
        if slack is not None:
            assert abs(profiled / reference - 1) < slack
