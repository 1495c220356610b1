"""A one-GPU node (the H100 VM's driver output and NVML, faked): the scan says there is no link
to measure, draws no bus-bandwidth chart, and shows what more such GPUs or nodes would do,
from nominal links, as ranges labelled what-if."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.cli import topoprof
from helpers.fake_driver import driver_env, fixture_body
from helpers.profiles import modelled

from topoprof.model.compute.timing import Compute
from topoprof.model.strategies.job import Workload
from topoprof.model.strategies.whatif import GPU_COUNTS, NETWORK_GBIT, NODE_COUNTS, what_ifs

H100_VM = Path(__file__).parent / "fixtures" / "topo" / "28_h100-1x-vm-driver580-ansi-raw.txt"
H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), pcie_gen_max=5, pcie_width_max=16)


def _what_if(gpu=H100, accum=8):
    workload = Workload.from_preset("gpt2", tokens_per_micro_batch=1024)
    return what_ifs(workload, Compute(micro_batch_time_s=0.03, optimizer_time_s=0.004), gpu, accum)


def test_every_case_is_a_range_that_orders_as_the_links_do():
    w = _what_if()
    assert len(w["cases"]) == 2 * len(GPU_COUNTS) + len(NODE_COUNTS) * len(NETWORK_GBIT)
    for case in w["cases"]:
        low, high = case["bandwidth_gbps"]
        assert 0 < low < high                                    # nominal low and high, never one number
        for name in ("ddp_synced", "ddp_no_sync"):
            fast, slow = case["step_time_s"][name]
            assert w["single_step_s"] <= fast <= slow            # never faster than one GPU's own step
    by_label = {c["label"]: c for c in w["cases"]}
    name = H100.name
    # NVLink beats PCIe beats a 25 Gbit/s network for the same count, at the slow end
    nv, pci = by_label[f"2 x {name} over NVLink"], by_label[f"2 x {name} over PCIe"]
    net = by_label[f"2 nodes x 1 {name}, 25 Gbit/s"]
    assert (nv["step_time_s"]["ddp_synced"][1] < pci["step_time_s"]["ddp_synced"][1]
            < net["step_time_s"]["ddp_synced"][1])
    # on a slow network, no_sync saves most of the step: K - 1 fewer all-reduces of 124M gradients
    assert min(net["no_sync_saving"]) > 0.5


def test_unknown_gpu_says_which_links_cannot_be_priced():
    w = _what_if(SimpleNamespace(name="mystery", compute_capability=None, pcie_gen_max=None, pcie_width_max=None))
    assert len(w["missing"]) == 2 and all("mystery" in m for m in w["missing"])
    assert {c["kind"] for c in w["cases"]} == {"network"}


def test_a_pcie_card_of_an_nvlink_generation_gets_no_nvlink_what_if():
    """An L4 (sm89, the generation of the A100's NVLink table row) is a PCIe card: no NVLink
    jobs are offered for it, and the reason is said."""
    w = _what_if(SimpleNamespace(name="NVIDIA L4", compute_capability=(8, 9), pcie_gen_max=4, pcie_width_max=16))
    assert {c["kind"] for c in w["cases"]} == {"PCIe", "network"}
    assert any(m.startswith("nvlink:") and "not an SXM part" in m for m in w["missing"])


def _scan(tmp_path, *extra):
    env = driver_env(tmp_path, smi_output=fixture_body(H100_VM), nvml_scenario="h100_vm_1x")
    out = tmp_path / "report"
    proc = topoprof("scan", "--backend", "gloo", "--nproc", "1", "--quick", "--preset", "gpt2", "--out", str(out),
                    *extra, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text(), out


@pytest.mark.slow
def test_one_gpu_scan_reports_no_link_and_what_ifs(tmp_path):
    report, md, out = _scan(tmp_path, "--micro-batch-time", "0.03")
    assert "One GPU: no GPU-to-GPU link to measure." in md
    assert not (out / "busbw.png").exists()
    assert "## What if: more GPUs like this one" in md and "not measured" in md
    w = report["what_if"]
    assert w["compute_source"] == "given" and w["label"] == "gpt2"
    assert any(c["kind"] == "NVLink" for c in w["cases"]) and any(c["kind"] == "PCIe" for c in w["cases"])
    assert "PCIe Gen5 x16" in md


@pytest.mark.slow
def test_one_gpu_scan_without_compute_says_what_to_give(tmp_path):
    report, md, _ = _scan(tmp_path)
    assert "--micro-batch-time" in report["what_if"]["skipped"]
    assert "No what-if:" in md
    # and the summary's statuses name it, as any probe that gave nothing
    (status,) = [p for p in report["probes"] if p["name"] == "what-if"]
    assert status["status"] == "skipped" and "--micro-batch-time" in status["detail"]


def _copy_case(measured, gen_now=5, width_now=16):
    from topoprof.jsonio import from_jsonable
    from topoprof.measure.bench import CopiesReport
    from topoprof.report.verdict import copy_verdicts
    from topoprof.topology.build import Gpu, Topology

    topology = Topology((), (Gpu(0, pcie_gen_current=gen_now, pcie_gen_max=5, pcie_width_current=width_now,
                                 pcie_width_max=16),), (), (), {})
    copies = {"status": "ok", "measurements": [
        {"kind": "h2d", "src": "host", "dst": "cuda:0", "size_bytes": 1 << 28, "bandwidth_gbps": measured, "p2p": None},
        {"kind": "d2d", "src": "cuda:0", "dst": "cuda:0", "size_bytes": 1 << 28, "bandwidth_gbps": 1479.0,
         "p2p": None}]}
    return copy_verdicts(from_jsonable(CopiesReport, copies), topology)


def test_copies_are_judged_against_the_pcie_link():
    # the H100 VM of fixture 28: host->GPU 54.8 GB/s measured on Gen5 x16 (raw 63.0 GB/s)
    (row,) = _copy_case(54.8)
    assert row.status == "ok" and row.link == "Gen5 x16"
    assert row.nominal_gbps == pytest.approx(16 * 32 * 128 / 130 / 8)
    assert row.ratio == pytest.approx(54.8 / row.nominal_gbps) and row.cause is None
    # an idle GPU's lower current generation is not a fault when the copy is fast
    assert _copy_case(54.8, gen_now=1)[0].cause is None
    low = _copy_case(20.0, width_now=8)[0]
    assert low.status == "low" and low.cause is not None and "x8 of x16" in low.cause


def test_bench_prints_the_copies_with_pairs_staged_through_the_host_marked():
    from topoprof.measure.bench import CopiesReport
    from topoprof.probes.ranks.copy_bandwidth import CopyMeasurement
    from topoprof.report.text_bench import copy_lines

    def d2d(src: str, dst: str, gbps: float, p2p: bool | None) -> CopyMeasurement:
        return CopyMeasurement("d2d", src, dst, 1 << 28, gbps, p2p)

    copies = CopiesReport("ok", size_bytes=1 << 28, iters=10, measurements=(
        CopyMeasurement("h2d", "host", "cuda:0", 1 << 28, 54.8, None),
        d2d("cuda:0", "cuda:0", 2074.0, None), d2d("cuda:0", "cuda:1", 11.9, False),
        d2d("cuda:1", "cuda:0", 12.1, False), d2d("cuda:1", "cuda:1", 2070.0, None)))
    lines = copy_lines(copies)
    assert lines[:2] == ["# copies (268435456 B, 10 iterations, GB/s)", "#   h2d host -> cuda:0: 54.8"]
    assert lines[-3].split() == ["#", "cuda:0", "2074.0", "11.9*"]
    assert lines[-1] == "#   (* = no peer access: staged through host memory)"
    assert copy_lines(CopiesReport("unsupported", "no CUDA device")) == ["# copies: skipped: no CUDA device"]


def test_one_rank_all_reduce_is_not_judged_as_a_zero_bus_bandwidth():
    from topoprof.measure.bench import BenchMetadata, BenchReport
    from topoprof.report.verdict import judge
    from topoprof.specs.collective_spec import BenchRow

    rows = [BenchRow("all_reduce", 8 << 20, 2 << 20, "float32", 9.3, algbw_gbps=900.0, busbw_gbps=0.0, wrong=0)]
    verdict = judge(BenchReport(metadata=BenchMetadata(world_size=1, backend="nccl"), rows=rows), None, None)
    assert verdict.status == "unknown" and "one rank: nothing crosses a link" in verdict.summary
    assert "0.000" not in verdict.summary


def test_what_if_shows_this_gpus_measured_compute_beside_the_modelled_range():
    """Every one-GPU scan checks the what-if method: the compute timed here beside the range its
    own ops are priced at, in the report's what-if section."""
    from topoprof.jsonio import to_jsonable
    from topoprof.model.inputs.scan import compute_check
    from topoprof.report.markdown import _what_if
    from topoprof.report.scan_report import read_scan_parts

    assert compute_check(Compute(micro_batch_time_s=0.03)) is None  # nothing modelled beside it
    compute = Compute(micro_batch_time_s=0.03, optimizer_time_s=0.004,
                      modelled=modelled((0.02, 0.025, 0.04), basis="its op trace",
                                        summary="h100-sxm (bf16, eager): ..."))
    check = compute_check(compute)
    assert check["inside"] and check["error_vs_middle"] == pytest.approx(0.2)
    outside = compute_check(Compute(micro_batch_time_s=0.05, modelled=modelled((0.02, 0.025, 0.04))))
    assert not outside["inside"]
    report = {"what_if": {**_what_if_payload(), "compute_source": "timed on GPU0", "compute_check": check}}
    md = "\n".join(_what_if(read_scan_parts(to_jsonable(report))))
    assert ("Compute per micro-batch measured 30.0 ms; modelled from its own ops 20.0 – 40.0 ms, middle 25.0 ms: "
            "measured is +20 % of the middle, inside the range.") in md


def _what_if_payload():
    return {**_what_if(), "label": "gpt2"}
