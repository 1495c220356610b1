"""NVLink meshes without NVSwitch: the rings NCCL runs at once, and --gpu pinning the NVLink
generation of a saved topology (fixture 01 is a DGX-1 with V100s: a hybrid cube-mesh of NV1 and
NV2 pairs, 6 NVLinks per GPU)."""
from __future__ import annotations

import glob
import itertools
import json
import os

import pytest
from fake_nvml import make_fake_nvml

from tests.helpers.cli import topoprof as _cli
from topoprof.model.comm import channels
from topoprof.model.comm.links import comm_from_topology, nvlink_rings
from topoprof.probes.hardware.nvidia_smi import read_topo_file
from topoprof.probes.hardware.nvml import query_nvml
from topoprof.topology.build import build_topology, with_compute_capability

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "topo")
SM70 = 20.0  # NCCL src/graph/topo.h SM70_NVLINK_BW, per link per direction


def _path(prefix: str) -> str:
    return next(p for p in sorted(glob.glob(os.path.join(FIXTURES, f"{prefix}_*.txt")))
                if not p.endswith(".nccl-tests.txt"))


def _topo(prefix: str, nvml: str | None = None):
    return build_topology(smi=read_topo_file(_path(prefix)), nvml=query_nvml(make_fake_nvml(nvml)) if nvml else None)


def _dgx1_sm70():
    topo, notes = with_compute_capability(_topo("01"), (7, 0), "--gpu v100-sxm2")
    assert notes == []
    return topo


def _check_packing(topo, gpus, rings):
    """Each ring passes every chosen GPU once; no directed pair carries more rings than its NV#."""
    used = {}
    for ring in rings:
        assert sorted(ring) == sorted(gpus), ring
        for a, b in zip(ring, ring[1:] + ring[:1]):
            used[(a, b)] = used.get((a, b), 0) + 1
    for (a, b), count in used.items():
        pair = topo.pair(a, b)
        assert pair.path == "NV" and count <= pair.nvlinks, (a, b, count)


# ---- --gpu pins the NVLink generation -------------------------------------------------------

def test_gpu_makes_every_nvlink_pair_exact():
    topo = _dgx1_sm70()
    nv = [p for p in topo.pairs if p.path == "NV"]
    assert len(nv) == 16  # 4 NVLink peers per GPU
    for pair in nv:
        assert pair.bandwidth_gbps == pytest.approx(pair.nvlinks * SM70)
        assert pair.bandwidth_range_gbps is None and not pair.uncertain
        assert "sm70 from --gpu v100-sxm2" in pair.basis
    before = _topo("01")
    for old, new in zip(before.pairs, topo.pairs):  # the other pairs are untouched
        if old.path != "NV":
            assert old == new


def test_a_topology_capability_is_kept_and_a_different_gpu_is_noted():
    topo = _topo("18", nvml="dgx_h100_nvswitch")
    pinned, notes = with_compute_capability(topo, (7, 0), "--gpu v100-sxm2")
    assert pinned == topo
    assert len(notes) == 1 and "--gpu v100-sxm2 is sm70" in notes[0] and "sm90" in notes[0]
    same, none = with_compute_capability(topo, (9, 0), "--gpu h100-sxm")
    assert same == topo and none == []


def test_the_rate_says_where_it_came_from():
    _, pinned = comm_from_topology(_dgx1_sm70(), [0, 1], rate_origin="--gpu v100-sxm2")
    assert pinned["nvlink_rate"] == "NVLink sm70 (20 GB/s per link) per NCCL src/graph/topo.h, from --gpu v100-sxm2"
    assert pinned["bottleneck_gbps"] == [SM70, SM70]
    _, unknown = comm_from_topology(_topo("01"), [0, 1])
    assert "unknown" in unknown["nvlink_rate"] and "--gpu" in unknown["nvlink_rate"]
    _, nvml = comm_from_topology(_topo("18", nvml="dgx_h100_nvswitch"))
    assert nvml["nvlink_rate"].startswith("NVLink sm90 (20.6 GB/s per link)")
    assert nvml["nvlink_rate"].endswith("the topology")
    _, pcie = comm_from_topology(_topo("24"))
    assert "nvlink_rate" not in pcie

# ---- the packing ------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus, count", [(list(range(8)), 6), ([0, 1, 2, 3], 4), ([4, 5, 6, 7], 4), ([0, 1], 1)])
def test_dgx1_rings_at_once(gpus, count):
    topo = _dgx1_sm70()
    comm, links = comm_from_topology(topo, gpus, rate_origin="--gpu v100-sxm2")
    assert len(links["rings"]) == count and links["rings_kind"] == ("nvlink_mesh" if count > 1 else "one_ring")
    assert links["bus_bandwidth_gbps"] == pytest.approx([count * SM70] * 2)
    assert comm.link_bandwidth_gbps == pytest.approx(count * SM70) and comm.bandwidth_range_gbps is None
    _check_packing(topo, gpus, links["rings"])
    assert links["nvlink_rate"] == "NVLink sm70 (20 GB/s per link) per NCCL src/graph/topo.h, from --gpu v100-sxm2"


def test_dgx1_every_subset_never_below_one_ring_nor_above_its_links():
    topo = _dgx1_sm70()
    for n in range(2, 9):
        for gpus in map(list, itertools.combinations(range(8), n)):
            comm, links = comm_from_topology(topo, gpus)
            bus, one = links["bus_bandwidth_gbps"], links["bottleneck_gbps"]
            assert bus[0] >= one[0] and bus[1] >= one[1], gpus
            assert comm.link_bandwidth_gbps == pytest.approx(bus[0] if bus[0] == bus[1] else (bus[0] * bus[1]) ** 0.5)
            if len(links["rings"]) > 1:
                _check_packing(topo, gpus, links["rings"])
                # no GPU sends more than its NVLinks to the other chosen GPUs carry
                out = min(sum(topo.pair(g, h).nvlinks for h in gpus if h != g and topo.pair(g, h).path == "NV")
                          for g in gpus)
                assert bus[0] <= out * SM70 + 1e-9, gpus


def test_unknown_generation_packs_the_same_rings_over_a_range():
    comm, links = comm_from_topology(_topo("01"))
    assert len(links["rings"]) == 6
    assert links["bus_bandwidth_gbps"] == pytest.approx([6 * 12.0, 6 * 40.1])  # NCCL's sm86 .. sm100 per link
    assert comm.bandwidth_range_gbps == pytest.approx((6 * 12.0, 6 * 40.1))
    assert "unknown" in links["nvlink_rate"] and "--gpu" in links["nvlink_rate"]


def test_full_nvlink_mesh_without_switch_uses_every_link():
    # HGX A100 4-GPU: NV4 between every pair, 12 NVLinks per GPU, read by NVML (no --gpu)
    comm, links = comm_from_topology(_topo("13", nvml="a100_nvlink_pairs"))
    assert len(links["rings"]) == 12 and links["bus_bandwidth_gbps"] == pytest.approx([240.0, 240.0])
    assert links["bottleneck_gbps"] == pytest.approx([80.0, 80.0])  # one ring alone: NV4 x 20
    assert links["nvlink_rate"].endswith("from the topology")


@pytest.mark.parametrize("prefix, nvml", [("18", None), ("18", "dgx_h100_nvswitch"), ("07", None), ("10", None)])
def test_nvswitch_is_one_ring_at_full_bandwidth_as_before(prefix, nvml):
    topo = _topo(prefix, nvml)
    for gpus in (None, [0, 1, 2, 3]):
        comm, links = comm_from_topology(topo, gpus)
        assert nvlink_rings(topo, gpus or [g.index for g in topo.gpus]) is None
        assert links["rings"] == [links["ring"]] and links["rings_kind"] == "nvswitch"
        assert links["bus_bandwidth_gbps"] == links["bottleneck_gbps"]
        lo, hi = links["bottleneck_gbps"]
        assert comm.link_bandwidth_gbps == pytest.approx(lo if lo == hi else (lo * hi) ** 0.5)


def test_nvswitch_with_gpu_is_nv_count_times_the_rate():
    topo, _ = with_compute_capability(_topo("07"), (8, 0), "--gpu a100-sxm4-80gb")
    comm, links = comm_from_topology(topo, rate_origin="--gpu a100-sxm4-80gb")
    assert links["bus_bandwidth_gbps"] == pytest.approx([12 * 20.0] * 2) and len(links["rings"]) == 1


@pytest.mark.parametrize("prefix", ["20", "22", "24", "26"])
def test_pcie_only_is_one_ring_at_its_slowest_edge(prefix):
    comm, links = comm_from_topology(_topo(prefix))
    assert links["rings"] == [links["ring"]] and links["rings_kind"] == "one_ring"
    assert links["bus_bandwidth_gbps"] == links["bottleneck_gbps"] and "nvlink_rate" not in links


def test_a_host_hop_means_one_ring_as_before():
    topo = _dgx1_sm70()
    for gpus in ([0, 5], [0, 1, 5], [0, 1, 2, 3, 4]):  # 0-5 is SYS; 1-2-3 reach 4 only through 0
        _, links = comm_from_topology(topo, gpus)
        assert links["hop"] == "PCIE" and links["rings"] == [links["ring"]]
        assert links["bus_bandwidth_gbps"] == links["bottleneck_gbps"]


def test_pack_rings_pure():
    rate = {(0, 1): (20.0, 20.0)}
    assert channels.pack_rings([0, 1], {(0, 1): 3}, rate, 9).total_gbps == (60.0, 60.0)
    assert channels.pack_rings([0, 1, 2], {(0, 1): 1}, {**rate, (1, 2): (20.0, 20.0)}, 9).rings == ()
    # beyond the exhaustive limit: a 12-GPU cycle of NV2 pairs, two rings each way, found greedily
    links = {(min(i, (i + 1) % 12), max(i, (i + 1) % 12)): 2 for i in range(12)}
    per_link = {key: (20.0, 20.0) for key in links}
    packing = channels.pack_rings(list(range(12)), links, per_link, 9)
    assert len(packing.rings) == 4 and packing.total_gbps == (80.0, 80.0)
    assert channels.link_bound(list(range(12)), links, per_link) == (80.0, 80.0)


# ---- the model command and the scan's verdict -------------------------------------------------


MODEL = ["model", "--params", "25557032", "--micro-batch-time", "0.0964", "--optimizer-time", "0.0008",
         "--precision", "fp32", "--no-sweep", "--topology", _path("01")]


def test_model_text_says_where_the_rate_came_from():
    proc = _cli(*MODEL, "--gpu", "v100-sxm2", "--gpus", "0,1")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("links: "))
    assert "NVLink 20.0 GB/s per direction" in line and "uncertain" not in line
    assert "NVLink sm70 (20 GB/s per link) per NCCL src/graph/topo.h, from --gpu v100-sxm2" in line


def test_model_text_says_how_many_rings_and_where_the_rate_came_from():
    proc = _cli(*MODEL, "--gpu", "v100-sxm2")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("links: "))
    assert "6 rings over NVLink" in line and "together 120.0 GB/s" in line and "uncertain" not in line
    assert "NVLink sm70 (20 GB/s per link) per NCCL src/graph/topo.h, from --gpu v100-sxm2" in line
    pair = _cli(*MODEL, "--gpu", "v100-sxm2", "--gpus", "0,1", "--json")
    links = json.loads(pair.stdout)["links"]
    assert links["rings"] == [[0, 1]] and links["bus_bandwidth_gbps"] == [SM70, SM70]


def test_model_notes_a_gpu_that_disagrees_with_the_topology(tmp_path):
    from topoprof.jsonio import dumps, to_jsonable

    saved = tmp_path / "topo.json"
    saved.write_text(dumps(to_jsonable(_topo("18", nvml="dgx_h100_nvswitch"))))
    proc = _cli(*MODEL[:-1], str(saved), "--gpu", "v100-sxm2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert any("--gpu v100-sxm2 is sm70" in w for w in doc["warnings"])
    assert doc["links"]["bus_bandwidth_gbps"] == pytest.approx([18 * 20.6] * 2)  # the topology's sm90 kept


def test_model_refuses_an_unknown_gpu_with_a_topology():
    proc = _cli(*MODEL, "--gpu", "b300-sxm")
    assert proc.returncode == 2 and "--gpu" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_scan_verdict_compares_with_the_rings_together():
    from topoprof.jsonio import to_jsonable
    from topoprof.measure.bench import BenchMetadata, BenchReport
    from topoprof.report.verdict import judge, read_ring
    from topoprof.scan.pipeline import _ring
    from topoprof.specs.collective_spec import BenchRow

    topo = _topo("13", nvml="a100_nvlink_pairs")  # what a scan reads: NVML gives sm80
    ring = to_jsonable(_ring(topo, [0, 1, 2, 3]))
    assert ring["bus_bandwidth_gbps"] == pytest.approx([240.0, 240.0])

    def bench(busbw):
        return BenchReport(rows=[BenchRow("all_reduce", 1 << 30, 1 << 28, "float32", 1e3, None, busbw, 0)],
                           metadata=BenchMetadata(world_size=4, backend="nccl"))

    ok = judge(bench(220.0), topo, read_ring(ring))
    assert ok.status == "ok" and ok.expected_gbps == pytest.approx(240.0) and "12 at once" in ok.level
    low = judge(bench(100.0), topo, read_ring(ring))  # above one ring's 80, below the rings together
    assert low.status == "low" and low.ratio == pytest.approx(100 / 240)
    switch = to_jsonable(_ring(_topo("18", nvml="dgx_h100_nvswitch"), list(range(8))))
    assert switch["bus_bandwidth_gbps"] == switch["bottleneck_gbps"] == pytest.approx([370.8, 370.8])


def test_busbw_chart_draws_the_rings_together():
    from topoprof.jsonio import to_jsonable
    from topoprof.report.files import _nominal
    from topoprof.report.verdict import read_ring

    ring = comm_from_topology(_dgx1_sm70())[1]
    assert _nominal(read_ring(to_jsonable(ring))) == [{"label": "nominal 6 NVLink rings together 120 GB/s",
                                                        "gbps": 120.0}]
    old = {"ring": [0, 1], "bottleneck_gbps": [20.0, 20.0], "hop": "NV"}  # a report from before
    assert _nominal(read_ring(old))[0]["gbps"] == 20.0
