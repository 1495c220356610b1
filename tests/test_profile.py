"""The device profile: the probe on this CPU (quick), the format and its errors, the lookups on
hand-made profiles, shared/gpu-facts read as a profile, and `topoprof profile` end to end."""
from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.cli import topoprof as _cli
from tests.helpers.profiles import GRID, HOST, profile_doc
from topoprof.errors import InputError
from topoprof.model.compute.datasheet import named_gpu
from topoprof.model.compute.profile import HOST_KINDS, MEMORY_KINDS, load_profile, profile_from_dict, profile_to_json
from topoprof.model.compute.profile_facts import SHIPPED, profile_from_gpu_facts
from topoprof.model.compute.profile_scale import datasheet_ratios, scale_to
from topoprof.specs.profile_schema import PROFILE_SCHEMA_VERSION

# Its tests share one module fixture of rank launches: one worker runs them all, so the launches
# run once (`--dist loadgroup` in pyproject.toml), not once on each worker that takes a test of it.
pytestmark = pytest.mark.xdist_group("profile")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_FACTS = os.path.join(ROOT, "..", "shared", "gpu-facts", "h200-2026-11-26.jsonl")


def _doc(gemm=(), memory=(), sdpa=(), host=None, dtype="bfloat16") -> dict:
    """A hand-made profile document (`tests/helpers/profiles.py`), a plain op's host cost given."""
    return profile_doc(gemm=gemm, memory=memory, sdpa=sdpa, host=host or {"op": 6e-6}, dtype=dtype,
                       source="hand-made")


def _power(m, n, k):
    """A rate that is a power law of the shape: log-linear in log coordinates, so interpolation
    in log space between measured points reproduces it exactly."""
    return 1e12 * (m / 128) ** 0.7 * (n / 768) ** 0.3 * (k / 768) ** 0.2


def _grid_profile(ms=(128, 1024, 8192), ns=(768, 3072), ks=(768, 3072), rate=_power):
    return profile_from_dict(_doc(gemm=[((m, n, k), rate(m, n, k)) for m in ms for n in ns for k in ks]), "grid")


# ---- lookups ------------------------------------------------------------------------------------

def test_gemm_is_exact_at_grid_points_and_a_power_law_between():
    p = _grid_profile()
    read = p.gemm_flops_per_s(1024, 3072, 768)
    assert read.value == pytest.approx(_power(1024, 3072, 768)) and "measured at m=1024 n=3072 k=768" in read.basis
    between = p.gemm_flops_per_s(2048, 1536, 1024)
    assert between.value == pytest.approx(_power(2048, 1536, 1024), rel=1e-9)
    assert "interpolated" in between.basis and "m 1024..8192" in between.basis and "n 768..3072" in between.basis


def test_gemm_is_monotone_between_neighbours_whatever_the_rates():
    rates = {(128, 768, 768): 12e12, (1024, 768, 768): 103e12, (8192, 768, 768): 500e12,
             (128, 3072, 768): 40e12, (1024, 3072, 768): 300e12, (8192, 3072, 768): 700e12}
    p = profile_from_dict(_doc(gemm=list(rates.items())), "grid")
    along_m = [p.gemm_flops_per_s(m, 768, 768).value for m in range(128, 1025, 64)]
    assert along_m[0] == pytest.approx(12e12) and along_m[-1] == pytest.approx(103e12)
    assert all(a < b for a, b in zip(along_m, along_m[1:]))
    along_n = [p.gemm_flops_per_s(1024, n, 768).value for n in range(768, 3073, 256)]
    assert all(a < b for a, b in zip(along_n, along_n[1:])) and along_n[-1] == pytest.approx(300e12)


def test_gemm_outside_the_grid_is_clamped_to_the_nearest_measured_and_says_so():
    p = _grid_profile()
    small = p.gemm_flops_per_s(32, 768, 768)
    assert small.value == pytest.approx(_power(128, 768, 768))
    assert "m=32 below the smallest measured (128): clamped" in small.basis
    large = p.gemm_flops_per_s(65536, 100000, 3072)
    assert large.value == pytest.approx(_power(8192, 3072, 3072)) and large.basis.count("clamped") == 2


def test_a_grid_with_holes_reads_from_the_smallest_box_measured_all_round():
    # the activations' products (m = tokens) and the weight gradients' (k = tokens) together: m = 2048
    # has no corner at k = 768 among the weight gradients' rows, so the box spans the tokens 128..8192
    acts = [((t, a, b), _power(t, a, b)) for t in (128, 8192) for a in (768, 3072) for b in (768, 3072)]
    grads = [((a, b, t), _power(a, b, t)) for a in (768, 3072) for b in (768, 3072) for t in (128, 8192)]
    p = profile_from_dict(_doc(gemm=acts + grads), "union")
    read = p.gemm_flops_per_s(2048, 768, 768)
    assert read.value == pytest.approx(_power(2048, 768, 768)) and "m 128..8192" in read.basis
    assert p.gemm_flops_per_s(1536, 3072, 2048).value == pytest.approx(_power(1536, 3072, 2048))


def test_scattered_points_blend_the_nearest_and_say_so():
    p = profile_from_dict(_doc(gemm=[((128, 768, 768), 1e13), ((4096, 3072, 768), 6e14), ((1024, 1024, 4096), 3e14)]),
                          "scattered")
    read = p.gemm_flops_per_s(2048, 1024, 1024)
    assert "inverse-distance blend" in read.basis and 1e13 < read.value < 6e14
    assert read.spread > 0 and p.gemm_flops_per_s(128, 768, 768).spread == 0   # how far the blended points disagree


def test_misaligned_shapes_read_only_misaligned_points():
    gemm = [((m, n, 768), 5e14) for m in (512, 8192) for n in (768, 3072)] + \
           [((m, 50257, 768), 1.2e14) for m in (512, 8192)]
    p = profile_from_dict(_doc(gemm=gemm), "vocab")
    odd = p.gemm_flops_per_s(2048, 50257, 768)
    assert odd.value == pytest.approx(1.2e14) and "misaligned" in odd.basis
    assert p.gemm_flops_per_s(2048, 50264, 768).value == pytest.approx(5e14)  # 50264 = 8 x 6283: aligned


def test_memory_interpolates_over_size_and_reads_unknown_kinds_as_their_nearest():
    p = profile_from_dict(_doc(memory=[(("add", 1 << 20), 4e11), (("add", 1 << 26), 3.2e12), (("gelu", 1 << 20), 3e11),
                                       (("gelu", 1 << 26), 2.8e12)]), "mem")
    assert p.memory_bytes_per_s("add", 1 << 20).value == pytest.approx(4e11)
    middle = p.memory_bytes_per_s("add", 1 << 23).value          # half-way in log size: the geometric middle
    assert middle == pytest.approx(math.sqrt(4e11 * 3.2e12))
    silu = p.memory_bytes_per_s("silu", 1 << 26)
    assert silu.value == pytest.approx(2.8e12) and "'silu' not measured: read as gelu" in silu.basis
    odd = p.memory_bytes_per_s("some_new_op", 1 << 26)
    assert odd.value == pytest.approx(3.2e12) and "generic elementwise" in odd.basis
    assert "clamped" in p.memory_bytes_per_s("add", 1 << 30).basis


def test_sdpa_by_sequence_head_dim_and_causality():
    p = profile_from_dict(_doc(sdpa=[((128, 64, True), 1e13), ((8192, 64, True), 5e14), ((128, 64, False), 2e13),
                                     ((1024, 64, False), 2e14), ((1024, 64, False), 3e14)]), "sdpa")
    assert p.sdpa_flops_per_s(128, 64, True).value == pytest.approx(1e13)
    assert p.sdpa_flops_per_s(1024, 64, True).value == pytest.approx(1e13 * (50 ** 0.5))  # 1024 is half-way, log2
    twice = p.sdpa_flops_per_s(1024, 64, False)
    assert twice.value == pytest.approx(math.sqrt(2e14 * 3e14)) and "geometric mean of 2" in twice.basis
    assert "head dim 128 not measured: read at 64" in p.sdpa_flops_per_s(8192, 128, True).basis


def test_host_costs_by_kind():
    p = profile_from_dict(_doc(host={"op": 6.2e-6, "autograd_forward": 7.8e-6}), "host")
    assert p.host_seconds("autograd_forward").value == 7.8e-6
    assert p.host_seconds("autograd_backward_node") is None
    with pytest.raises(InputError, match="unknown"):
        p.host_seconds("no_such_kind")


def test_scaling_gives_a_range_spanning_the_ratios_that_could_bind():
    p = _grid_profile()
    scaled = scale_to(p, peak_ratio=2.0, bandwidth_ratio=1.5, sm_ratio=1.25)
    gemm = scaled.gemm_flops_per_s(1024, 768, 768)
    base = _power(1024, 768, 768)
    assert (gemm.low, gemm.high) == (pytest.approx(base * 1.5), pytest.approx(base * 2.0))
    assert "peak per SM x1.6" in gemm.basis
    memory = scale_to(profile_from_dict(_doc(memory=[(("add", 1 << 26), 3e12)]), "mem"), 2.0, 1.5, 1.25)
    add = memory.memory_bytes_per_s("add", 1 << 26)
    assert (add.low, add.high) == (pytest.approx(3e12 * 1.2), pytest.approx(3e12 * 1.5))   # bandwidth per SM, bandwidth
    assert memory.optimizer_bytes_per_s() is None
    host = scaled.host_seconds("op")
    assert host.low == host.high == 6e-6 and "same class of host CPU" in host.basis
    ratios = datasheet_ratios(p, named_gpu("H200 SXM"))   # the profile's GPU is an H100 SXM: same peak and SMs
    assert (ratios.peak, ratios.sms) == (1.0, 1.0) and ratios.bandwidth == pytest.approx(4800 / 3350)
    with pytest.raises(InputError, match="no datasheet"):
        datasheet_ratios(p, named_gpu("Radeon 9000"))


# ---- the file format ----------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(kind="bench"), "not a device profile (kind 'bench'"),
    (lambda d: d.update(schema_version=PROFILE_SCHEMA_VERSION + 1), "is newer than this topoprof reads"),
    (lambda d: d.update(schema_version=0), "is older than this topoprof reads"),
    (lambda d: d.pop("schema_version"), "no schema_version"),
    (lambda d: [d.pop("gemm"), d.pop("sdpa")], "without section(s) gemm, sdpa"),
    (lambda d: d["gemm"][0].pop("flops_per_s"), "gemm[0]: missing 'flops_per_s'"),
    (lambda d: d["memory"][0].update(bytes_per_s=-1), "memory[0]: bytes_per_s must be a positive number"),
    (lambda d: d["sdpa"][0].update(causal="yes"), "sdpa[0]: causal must be true or false"),
    (lambda d: d["host_costs"].update(ranges={"autocast_op": [3e-5, 1e-5]}),
     "host_costs.ranges.autocast_op: must be [low, high] with 0 < low <= high"),
])
def test_a_bad_profile_is_one_line_naming_the_file_and_what_is_wrong(tmp_path, change, message):
    doc = _doc(gemm=[((128, 768, 768), 1e13)], memory=[(("add", 1 << 20), 4e11)], sdpa=[((128, 64, True), 1e13)])
    change(doc)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        load_profile(str(path))
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)


def test_a_file_that_is_not_json_names_its_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"kind": "device_profile",\n oops}')
    with pytest.raises(InputError, match=f"^{path}:2: not JSON"):
        load_profile(str(path))


def test_the_json_round_trip_keeps_everything():
    p = _grid_profile()
    again = profile_from_dict(json.loads(json.dumps(profile_to_json(p))), "round trip")
    assert again == p and profile_to_json(p)["kind"] == "device_profile"


# ---- shared/gpu-facts as a profile --------------------------------------------------------------

def _facts_lines():
    if not os.path.exists(GPU_FACTS):
        pytest.skip(f"{GPU_FACTS} not on this machine")
    with open(GPU_FACTS) as f:
        return f.read().splitlines()


def test_gpu_facts_read_back_as_measured():
    lines = _facts_lines()
    rows = [json.loads(line) for line in lines if line.strip()]
    p = profile_from_dict(profile_from_gpu_facts(lines), GPU_FACTS)
    assert p.citation.startswith("measured on an NVIDIA H200, torch 2.11") and "2026-11-26" in p.citation
    small = next(r for r in rows
                 if r["kind"] == "gemm" and (r["m"], r["n"], r["k"], r["dtype"]) == (128, 768, 768, "bfloat16"))
    read = p.gemm_flops_per_s(128, 768, 768)
    assert read.value == pytest.approx(small["tflops"] * 1e12) and "measured at" in read.basis
    fp32 = next(r for r in rows if r["kind"] == "gemm" and r["dtype"] == "float32")
    assert p.gemm_flops_per_s(fp32["m"], fp32["n"], fp32["k"], "float32").value == pytest.approx(fp32["tflops"] * 1e12)
    for r in (r for r in rows if r["kind"] == "memory"):
        kind = "upcast" if r["op"] == "fp32 upcast" else r["op"]
        got = p.memory_bytes_per_s(kind, (3 if kind in ("add", "upcast") else 2) * r["bytes"])
        assert got.value == pytest.approx(r["gbps"] * 1e9, rel=1e-9), r
    attention = next(r for r in rows if r["kind"] == "attention" and r["t"] == 8192 and not r["causal"])
    assert p.sdpa_flops_per_s(8192, attention["d"], False).value == pytest.approx(attention["tflops"] * 1e12)
    op = next(r for r in rows if r["kind"] == "host" and "no grad" in r["what"])
    assert p.host_seconds("op").value == pytest.approx(op["us_per_op"] * 1e-6)
    assert p.host_seconds("autograd_backward_node") is None and p.optimizer is None
    assert any("absent" in note for note in p.notes) and p.machine.missing["sm_count"]


def test_gpu_facts_bound_the_host_kinds_they_lack_from_their_calls():
    rows = [json.loads(line) for line in _facts_lines() if line.strip()]
    p = profile_from_dict(profile_from_gpu_facts(_facts_lines()), GPU_FACTS)
    host = {r["what"]: r.get("us_per_op", r.get("us_per_call")) * 1e-6 for r in rows if r["kind"] == "host"}
    op, recorded = host["torch.add of 64 floats, no grad"], host["torch.mul recorded by autograd"]
    call = host["tiny Linear forward+sum+backward (about 8 kernels)"]
    # the call less its forward's 2 kernels as recorded ops leaves the backward's 5 nodes of 5 kernels
    low, high, how = p.host_range("autograd_backward_node")
    assert (low, high) == (pytest.approx(op), pytest.approx((call - 2 * recorded - 5 * op) / 5 + op))
    assert how.startswith("derived: ") and "5 backward nodes" in how
    low, high, _ = p.host_range("autocast_op")
    assert (low, high) == (pytest.approx(2 * recorded), pytest.approx(host["tiny Linear under bf16 autocast forward"]))
    assert p.host_range("op") == (pytest.approx(op), pytest.approx(op), p.host_how["op"])


def test_calls_cheaper_than_their_kernels_as_recorded_ops_bound_nothing():
    from topoprof.model.compute.profile_facts import derived_host_ranges

    recorded = 8e-6
    bounded, _ = derived_host_ranges({"tiny Linear under bf16 autocast forward": 20e-6}, {"autograd_forward": recorded})
    assert bounded["autocast_op"] == [2 * recorded, 20e-6]
    contradicting, how = derived_host_ranges({"tiny Linear under bf16 autocast forward": 10e-6},
                                             {"autograd_forward": recorded})
    assert "autocast_op" not in contradicting and "autocast_op" not in how


def test_the_shipped_h200_profile_is_the_conversion_of_the_shared_facts():
    shipped = SHIPPED["h200-2026-11-26.jsonl"]
    path = os.path.join(ROOT, "topoprof", "model", "compute", "profiles", shipped["out"])
    converted = profile_from_gpu_facts(_facts_lines(), "shared/gpu-facts/h200-2026-11-26.jsonl", shipped["citation"],
                                       shipped["machine"])
    assert load_profile(path) == profile_from_dict(converted, "converted")
    assert load_profile(path).citation == "measured on an NVIDIA H200 SXM, torch 2.11, 2026-11-26 (shared/gpu-facts)"


def test_gpu_facts_that_are_not_opbench_lines_are_refused():
    with pytest.raises(InputError, match="x.jsonl:1: not JSON"):
        profile_from_gpu_facts(["not json"], source="x.jsonl")
    with pytest.raises(InputError, match="no 'machine' line"):
        profile_from_gpu_facts(['{"kind": "gemm"}'], source="x.jsonl")


# ---- the probe on this CPU, and the command -----------------------------------------------------

def test_the_driver_version_is_read_alone_or_none_with_why():
    from fake_nvml import make_fake_nvml

    from topoprof.probes.hardware.nvml import query_driver_version

    fake = make_fake_nvml("dgx_h100_nvswitch")
    version, why = query_driver_version(fake)
    assert version == fake.fake_state.machine.driver_version and why is None
    assert fake.fake_state.inits == fake.fake_state.shutdowns == 1
    version, why = query_driver_version(make_fake_nvml("no_driver"))
    assert version is None and why.startswith("NVML unavailable: ")


@pytest.fixture(scope="module")
def cpu_profile():
    pytest.importorskip("torch")
    from topoprof.probes.device_profile.profile_worker import measure_profile

    lines = []
    doc = measure_profile("cpu", quick=True, budget_s=60.0, on_progress=lines.append)
    return doc, lines


@pytest.mark.slow
def test_the_quick_cpu_profile_measures_every_section_and_loads(cpu_profile):
    from topoprof.probes.device_profile.points import CPU_QUICK, gemm_shapes, sdpa_cases

    doc, lines = cpu_profile
    p = profile_from_dict(json.loads(json.dumps(doc)), "the CPU profile")
    assert [line.split(":")[0] for line in lines] == ["host_costs", "gemm", "memory", "sdpa", "optimizer", "cpu"]
    assert all(" s in all)" in line for line in lines)
    assert p.machine.kind == "cpu" and p.dtype == "float32" and p.machine.threads >= 1
    assert set(p.host_seconds_per_op) == set(HOST_KINDS) and all(0 < s < 0.1 for s in p.host_seconds_per_op.values())
    skipped = {(s.section, s.what) for s in p.skipped}
    assert len(p.gemm) + sum(1 for s in skipped if s[0] == "gemm") == len(gemm_shapes(CPU_QUICK)) and p.gemm
    assert {m.kind for m in p.memory} <= set(MEMORY_KINDS) and p.memory
    assert len(p.sdpa) + sum(1 for s in skipped if s[0] == "sdpa") == len(sdpa_cases(CPU_QUICK)) and p.sdpa
    assert p.optimizer.bytes_per_step == 28 * CPU_QUICK.optimizer_params
    assert p.cpu.fresh_page_min_bytes == 32 << 20 and p.cpu.fresh_page_s_per_byte >= 0
    g = p.gemm[0]
    assert p.gemm_flops_per_s(g.m, g.n, g.k).value == pytest.approx(g.flops_per_s)
    for m in p.memory:
        assert p.memory_bytes_per_s(m.kind, m.bytes_moved).basis.startswith(f"{m.kind} (float32): measured")
    assert "3.5 x" in p.conventions["sdpa"] and "fastest block" in p.conventions["timing"]


@pytest.mark.slow
def test_profile_command_end_to_end_on_the_cpu_without_torch_in_the_cli(tmp_path):
    code = ("import sys\nimport topoprof.cli as c\ncode = 0\n"
            "try:\n    c.main(['profile', '--device', 'cpu', '--quick'])\n"
            "except SystemExit as e:\n    code = e.code\n"
            "assert 'torch' not in sys.modules, 'torch imported by the CLI'\nsys.exit(code)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    written = [f.name for f in tmp_path.iterdir()]   # the default name, in the current folder
    assert len(written) == 1 and re.fullmatch(r"profile-cpu-[\w.-]+-\d{8}T\d{6}Z\.json", written[0]), written
    out = tmp_path / written[0]
    assert proc.stdout.startswith("topoprof profile: ") and proc.stdout.endswith(f"wrote {written[0]}\n")
    for what in ("host per op:", "GEMM (float32", "memory-bound:", "attention (SDPA", "optimizer: AdamW"):
        assert what in proc.stdout, what
    assert "gemm: " in proc.stderr and "s in all)" in proc.stderr   # a progress line per section
    p = load_profile(str(out))
    assert p.machine.kind == "cpu" and p.quick and p.gemm


@pytest.mark.slow
def test_profile_command_refuses_a_gpu_that_is_not_there_and_a_folder_it_cannot_write(tmp_path):
    bad = _cli("profile", "--device", "cpu", "--out", str(tmp_path / "no" / "p.json"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    proc = _cli("profile", "--device", "cuda", "--quick", "--out", str(tmp_path / "p.json"), timeout=300)
    assert proc.returncode == 1 and "torch sees no CUDA device" in proc.stderr and "Traceback" not in proc.stderr


def test_profile_help_and_the_profile_model_import_no_torch():
    code = ("import sys\nimport topoprof.cli as c\n"
            "import topoprof.model.compute.profile, topoprof.model.compute.profile_scale, "
            "topoprof.model.compute.profile_facts\n"
            "import topoprof.report.text_profile, topoprof.measure.profile, "
            "topoprof.probes.device_profile.profile_worker, topoprof.probes.device_profile.clock\n"
            "try:\n    c.main(['profile', '--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'matplotlib', 'pynvml') if m in sys.modules]\n"
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    help_text = _cli("profile", "--help").stdout
    assert "--quick" in help_text and "--device" in help_text


def test_the_summary_shows_the_share_of_the_datasheet_peak():
    from topoprof.report.text_profile import render_profile

    p = profile_from_dict(profile_from_gpu_facts(_facts_lines()), GPU_FACTS)
    text = render_profile(p)
    assert "128x768x768" in text and "1.2 % of the datasheet's 989.5 TFLOP/s" in text
    assert "(datasheet 4.8 TB/s)" in text and "optimizer: not measured" in text
    doc = copy.deepcopy(profile_to_json(p))
    assert doc["host_costs"]["seconds_per_op"]["op"] == p.host_seconds_per_op["op"]


def test_a_profile_file_is_read_once_per_version(tmp_path):
    from topoprof.model.compute.profile import load_profile

    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_doc(device="NVIDIA H100 80GB HBM3", gemm=GRID, host=HOST)))
    first = load_profile(str(path))
    assert load_profile(str(path)) is first
    path.write_text(json.dumps(profile_doc(device="NVIDIA A100-SXM4-80GB", gemm=GRID, host=HOST)) + "\n")
    assert load_profile(str(path)).machine.device == "NVIDIA A100-SXM4-80GB"
