"""Charts: every plot function writes a real PNG for typical, partial and empty input."""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest

from topoprof.report import plots
from topoprof.report.plots.base import _byte_ticks, fmt_bytes, fmt_num, nice_log_ticks

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_bytes: int = 5000) -> None:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes


def busbw_rows(collective="all_reduce", factor=1.75, alpha_us=25.0, beta_gbps=200.0, wrong_at=()):
    rows = []
    for k in range(3, 31, 3):
        size = 2 ** k
        t = alpha_us + size / (beta_gbps * 1e3)
        alg = size / t / 1e3
        rows.append({"collective": collective, "size_bytes": size, "time_us": t, "algbw_gbps": alg,
                     "busbw_gbps": alg * factor, "wrong": 1 if size in wrong_at else 0})
    return rows


def pair(a, b, path="NV", nvlinks=18, bw=370.8, rng=None, uncertain=False):
    return {"gpu_a": a, "gpu_b": b, "path": path, "nvlinks": nvlinks, "bandwidth_gbps": bw,
            "bandwidth_range_gbps": rng, "uncertain": uncertain}


def copies(n=2, p2p=True, d2d=True):
    ms = []
    for d in range(n):
        ms.append({"kind": "h2d", "src": "host", "dst": f"cuda:{d}", "bandwidth_gbps": 25.0, "p2p": None})
        ms.append({"kind": "d2h", "src": f"cuda:{d}", "dst": "host", "bandwidth_gbps": 26.0, "p2p": None})
        for e in range(n) if d2d else ():
            ms.append({"kind": "d2d", "src": f"cuda:{d}", "dst": f"cuda:{e}",
                       "bandwidth_gbps": 900.0 if d == e else 20.0, "p2p": None if d == e else p2p})
    return {"measurements": ms, "size_bytes": 256 << 20, "device_names": ["NVIDIA L4"] * n}


SWEEP = {
    "accum": [1, 2, 4, 8],
    "world_size": 4,
    "samples_per_micro_batch": 8,
    "strategies": {
        "single": [0.1, 0.2, 0.4, 0.8],
        "ddp_synced": [0.2, 0.4, 0.8, 1.6],
        "ddp_no_sync_backward_only": [0.2, 0.4, 0.8, 1.6],
        "ddp_no_sync": [0.2, 0.3, 0.5, 0.9],
        "dp": [0.3, 0.6, None, None],
    },
    "ranges": {"ddp_synced": [[0.19, 0.21], None, [0.7, 0.9], [1.5, 1.7]]},
}


# --- typical input -----------------------------------------------------------------------------


def test_busbw_typical(tmp_path):
    rows = busbw_rows(wrong_at=(2 ** 12,)) + busbw_rows("all_gather", factor=0.875)
    fits = {"all_reduce": {"latency_us": 25.0, "bandwidth_gbps": 200.0, "busbw_gbps": 350.0, "r2": 0.999},
            "all_gather": {"latency_us": 20.0, "bandwidth_gbps": None, "busbw_gbps": None, "r2": 0.5}}
    nominal = [{"label": "NV18 pair 370.8 GB/s", "gbps": 370.8},
               {"label": "PHB", "low_gbps": 1.0, "high_gbps": 6.0}]
    out = plots.plot_busbw(rows, fits, nominal, tmp_path / "busbw.png", title="8 x H100")
    assert out == str(tmp_path / "busbw.png")
    assert_png(out)


def test_busbw_without_fits_or_nominal(tmp_path):
    assert_png(plots.plot_busbw(busbw_rows(factor=1.0, beta_gbps=2.0), {}, None, tmp_path / "gloo.png"))


def test_link_matrix_typical(tmp_path):
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]
    pairs = [pair(a, b) for a in range(8) for b in range(a + 1, 8)]
    assert_png(plots.plot_link_matrix(gpus, pairs, tmp_path / "links.png"))


def test_link_matrix_uncertain_mixed_and_16_gpus(tmp_path):
    gpus = [{"index": i, "name": "Tesla T4" if i < 8 else "NVIDIA L4"} for i in range(16)]
    pairs = []
    for a in range(16):
        for b in range(a + 1, 16):
            if a // 8 == b // 8:
                pairs.append(pair(a, b, "NODE", 0, None, [6.0, 12.0], True))
            else:
                pairs.append(pair(a, b, "SYS", 0, None, None, True))  # nothing known: grey cell
    assert_png(plots.plot_link_matrix(gpus, pairs, tmp_path / "links16.png"))


def test_copy_matrix_typical(tmp_path):
    out = plots.plot_copy_matrix(copies(4, p2p=False), tmp_path / "copies.png",
                                 reference={"pcie_gbps": 31.5, "hbm_gbps": 300.0})
    assert_png(out)


def test_copy_matrix_host_copies_only(tmp_path):
    out = plots.plot_copy_matrix(copies(2, d2d=False), tmp_path / "host.png",
                                 reference={"pcie_gbps": None, "hbm_gbps": 3350.0})
    assert_png(out)


def test_step_vs_accum_typical(tmp_path):
    assert_png(plots.plot_step_vs_accum(SWEEP, tmp_path / "steps.png", title="gpt2"))


def test_pred_vs_measured_typical(tmp_path):
    cases = [{"label": f"model{i} / 1 Gbit", "mode": mode, "predicted_step_s": t * (1 + 0.01 * i),
              "measured_step_s": t}
             for i, (mode, t) in enumerate((m, 0.1 * 2 ** k) for k in range(4)
                                            for m in ("ddp_synced", "ddp_no_sync", "dp"))]
    cases.append({"label": "no run", "mode": "ddp_synced", "predicted_step_s": 1.0, "measured_step_s": None})
    assert_png(plots.plot_pred_vs_measured(cases, tmp_path / "pred.png"))


# --- empty and degenerate input ----------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda p: plots.plot_busbw([], {}, [], p),
    lambda p: plots.plot_busbw([{"collective": "x", "size_bytes": 0, "busbw_gbps": None}], None, None, p),
    lambda p: plots.plot_link_matrix([], [], p),
    lambda p: plots.plot_copy_matrix({"measurements": [], "size_bytes": 0, "device_names": []}, p),
    lambda p: plots.plot_copy_matrix(None, p),
    lambda p: plots.plot_step_vs_accum({"accum": [], "strategies": {}, "samples_per_micro_batch": 1}, p),
    lambda p: plots.plot_step_vs_accum({"accum": [1, 2], "strategies": {"dp": [None, None]},
                                        "samples_per_micro_batch": 1}, p),
    lambda p: plots.plot_pred_vs_measured([], p),
    lambda p: plots.plot_pred_vs_measured([{"label": "x", "mode": "dp", "predicted_step_s": None,
                                            "measured_step_s": 1.0}], p),
], ids=["busbw", "busbw-unusable-rows", "links", "copies", "copies-none", "steps", "steps-all-null",
        "pred", "pred-unusable"])
def test_empty_input_writes_no_data_png(tmp_path, call):
    out = call(tmp_path / "sub" / "empty.png")  # the parent folder is created too
    assert_png(out)


def test_single_gpu_link_matrix(tmp_path):
    assert_png(plots.plot_link_matrix([{"index": 0, "name": "NVIDIA A10"}], [], tmp_path / "one.png"))


# --- numbers behind the charts -----------------------------------------------------------------


def test_single_strategy_uses_world_size_one():
    assert plots.world_size_for("single", SWEEP) == 1
    assert plots.world_size_for("ddp_synced", SWEEP) == 4
    assert plots.world_size_for("ddp_synced", {"accum": [1]}) == 1
    # 8 samples x K=4 micro-batches x 4 ranks in 0.8 s
    assert plots.throughput(0.8, 4, 8, 4) == pytest.approx(160.0)
    assert math.isnan(plots.throughput(None, 4, 8, 4))


def test_step_sweep_draws_gaps_for_nulls_and_single_rate(tmp_path, monkeypatch):
    from topoprof.report.plots import steps as plots_steps

    drawn = {}
    real = plots_steps._draw_strategy

    def spy(axes, name, accum, times, sweep, seen):
        real(axes, name, accum, times, sweep, seen)
        drawn[name] = list(axes[1].get_lines()[-1].get_ydata())

    monkeypatch.setattr(plots_steps, "_draw_strategy", spy)
    plots.plot_step_vs_accum(SWEEP, tmp_path / "s.png")
    assert drawn["single"] == pytest.approx([80.0, 80.0, 80.0, 80.0])       # 8 x K x 1 / t
    assert drawn["ddp_synced"] == pytest.approx([160.0, 160.0, 160.0, 160.0])  # 8 x K x 4 / t
    assert drawn["dp"][:2] == pytest.approx([8 * 4 / 0.3, 8 * 2 * 4 / 0.6])
    assert all(math.isnan(v) for v in drawn["dp"][2:])


def test_fit_curve_matches_alpha_beta_model():
    fit = {"latency_us": 10.0, "bandwidth_gbps": 100.0, "busbw_gbps": 175.0}
    # 1 MB: t = 10 us + 1e6 B / (100e3 B/us) = 20 us -> algbw 50 GB/s, busbw x1.75
    assert plots.fit_busbw_gbps(1e6, fit, 1.75) == pytest.approx(87.5)
    assert plots.fit_busbw_gbps(1e6, {"latency_us": 10.0, "bandwidth_gbps": None}, 1.0) == pytest.approx(100.0)


def test_labels():
    assert [fmt_bytes(2 ** k) for k in (3, 10, 20, 30)] == ["8 B", "1 KiB", "1 MiB", "1 GiB"]
    assert fmt_num(370.8) == "371" and fmt_num(12.0) == "12" and fmt_num(1.5) == "1.5"
    ticks = _byte_ticks(3, 30, 10)
    assert {10, 20, 30} <= set(ticks) and len(ticks) <= 10
    assert nice_log_ticks(10, 26) == [10, 15, 20]


def test_strategy_colours_are_fixed_per_name():
    assert set(plots.STRATEGY_COLORS) >= {"single", "dp", "ddp_synced", "ddp_no_sync",
                                          "ddp_no_sync_backward_only", "ddp_fp16_compress"}
    assert len(set(plots.STRATEGY_COLORS.values())) == len(plots.STRATEGY_COLORS)


def test_import_does_not_load_matplotlib():
    code = textwrap.dedent("""
        import sys
        import topoprof.report.plots
        assert not any(m == "matplotlib" or m.startswith("matplotlib.") for m in sys.modules), "early"
        import tempfile, os
        topoprof.report.plots.plot_pred_vs_measured([], os.path.join(tempfile.mkdtemp(), "x.png"))
        assert "matplotlib" in sys.modules
        assert "matplotlib.pyplot" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_repo_root())


def _repo_root() -> str:
    import os

    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_copy_cells_mark_missing_peer_access():
    from topoprof.report.plots.copies import _cell_texts, _d2d_grid

    ms = copies(2, p2p=False)["measurements"]
    grid, no_p2p = _d2d_grid(ms, [0, 1])
    assert no_p2p == {(0, 1), (1, 0)}
    assert _cell_texts(grid, no_p2p, 2) == [["900", "20\nno P2P"], ["20\nno P2P", "900"]]


def test_copy_chart_says_what_its_diagonal_counts_and_draws_a_copys_ceiling():
    """A copy within one GPU is timed as bytes copied per second; the datasheet's memory bandwidth
    counts reads and writes together, so the chart's reference mark is half of it."""
    from topoprof.report.plots.copies import _copy_notes, _d2d_grid

    grid, no_p2p = _d2d_grid(copies(1)["measurements"], [0])
    notes = " ".join(_copy_notes(grid, no_p2p, 4800.0))
    assert "bytes copied per second" in notes and "(read + write)" not in notes
    assert "HBM\u00f72 2400" in notes and "nominal 4800 GB/s" in notes


def test_a_scan_draws_its_copies_against_the_gpus_pcie_link_and_memory():
    """The references the scan gives the copies chart, from the real H200 scan's own JSON: the
    PCIe link NVML reported (Gen5 x16) and the H200's datasheet memory bandwidth."""
    import json
    import os

    from topoprof.report.files import _copy_reference
    from topoprof.report.scan_report import read_scan_parts

    path = os.path.join(_repo_root(), "reports", "gpu-nvidia-h200-20261126", "scan", "report.json")
    with open(path) as f:
        report = json.load(f)
    parts = read_scan_parts(report)
    assert parts.copies is not None
    reference = _copy_reference(parts.copies, parts.topology)
    assert reference["pcie_gbps"] == pytest.approx(63.0, abs=0.05) and reference["hbm_gbps"] == 4800.0
    report["copies"]["device_names"] = ["NVIDIA H200", "Some Unknown GPU"]
    unknown = read_scan_parts(report).copies
    assert unknown is not None
    assert _copy_reference(unknown, parts.topology)["hbm_gbps"] is None  # no figure is borrowed for an unknown GPU


def test_what_if_chart_from_a_real_one_gpu_scan(tmp_path):
    """A one-GPU scan draws its what-if table: the real H200 scan's JSON re-rendered."""
    import json
    import os

    from topoprof.report.files import render_charts
    from topoprof.report.plots.whatif import _speedups
    from topoprof.report.scan_report import read_scan_parts

    path = os.path.join(_repo_root(), "reports", "gpu-nvidia-h200-20261126", "scan-standalone", "report.json")
    with open(path) as f:
        report = json.load(f)
    assert render_charts(read_scan_parts(report), str(tmp_path))["what_if"] == "what_if.png"
    assert_png(tmp_path / "what_if.png")
    # 2 GPUs over NVLink: 2 x 193.7 ms / (217.0..217.7 ms) for DDP synced every micro-batch
    case, single = report["what_if"]["cases"][0], report["what_if"]["single_step_s"]
    middle, low, high = _speedups(case, single, "ddp_synced")
    assert low < middle < high and middle == pytest.approx(2 * single / sum(case["step_time_s"]["ddp_synced"]) * 2)
    assert _speedups({"world_size": 2, "step_time_s": {}}, single, "ddp_synced") is None
    assert_png(plots.plot_what_if({"cases": [], "single_step_s": 0.1}, tmp_path / "empty.png"))
