"""Topology from saved nvidia-smi outputs and the fake NVML: paths, P2P and nominal bandwidth."""
from __future__ import annotations

import glob
import os

import pytest
from fake_nvml import make_fake_nvml

from topoprof.errors import InputError
from topoprof.probes.hardware.nvidia_smi import read_topo_file
from topoprof.probes.hardware.nvml import query_nvml
from topoprof.topology.build import build_topology

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "topo")


def _smi(prefix: str):
    return read_topo_file(glob.glob(os.path.join(FIXTURES, f"{prefix}_*[!s].txt"))[0])


def test_nvswitch_h100_node_with_nvml():
    topo = build_topology(smi=_smi("18"), nvml=query_nvml(make_fake_nvml("dgx_h100_nvswitch")))
    assert len(topo.gpus) == 8 and len(topo.pairs) == 28
    for pair in topo.pairs:
        assert (pair.path, pair.nvlinks, pair.p2p, pair.via_nvswitch) == ("NV", 18, "yes", True)
        # NCCL src/graph/topo.h SM90_NVLINK_BW 20.6 per link x 18 links
        assert pair.bandwidth_gbps == pytest.approx(18 * 20.6) and not pair.uncertain
    assert {g.numa_node for g in topo.gpus} == {0, 1}


def test_nvlink_without_nvml_is_a_range_not_a_guess():
    topo = build_topology(smi=_smi("01"))
    pair = topo.pair(0, 3)
    assert pair.path == "NV" and pair.nvlinks == 2
    assert pair.bandwidth_gbps is None and pair.uncertain
    assert pair.bandwidth_range_gbps == pytest.approx((2 * 12.0, 2 * 40.1))
    assert topo.pair(0, 5).path == "SYS" and topo.pair(0, 5).p2p == "no"


def test_phb_pair_is_host_staged_and_uncertain():
    topo = build_topology(smi=_smi("24"), nvml=query_nvml(make_fake_nvml("pcie_pair")))
    pair = topo.pair(0, 1)
    assert pair.path == "PHB" and pair.p2p == "no" and pair.uncertain
    assert pair.bandwidth_gbps is None and pair.bandwidth_range_gbps == (1.0, 6.0)
    assert any("Gen1 below Gen4" in n for n in topo.notes)


def test_pix_pair_uses_pcie_generation_and_width():
    nvml = query_nvml(make_fake_nvml("pcie_pair"))
    topo = build_topology(smi=_smi("22"), nvml=nvml)
    pair = topo.pair(0, 1)
    # P2P reported unavailable by NVML (chipset_not_supported): host-staged despite PIX.
    assert pair.path == "PIX" and pair.p2p == "no" and pair.bandwidth_gbps is None


def test_pix_pair_with_p2p_gets_pcie_nominal():
    from topoprof.topology.build import Gpu, nominal_bandwidth

    a = Gpu(index=0, pcie_gen_max=4, pcie_width_max=16)
    b = Gpu(index=1, pcie_gen_max=3, pcie_width_max=16)
    bw, rng, uncertain, basis = nominal_bandwidth("PIX", 0, "yes", a, b)
    # NCCL: width x lane rate / 80; the slower end (Gen3 x16) bounds the pair: 16 x 60 / 80 = 12
    assert bw == 12.0 and rng is None and not uncertain and "Gen3 x16" in basis


def test_sys_split_and_node_pairs():
    topo = build_topology(smi=_smi("26"), nvml=query_nvml(make_fake_nvml("nvlink_not_supported")))
    assert topo.pair(0, 1).path == "SYS" and topo.pair(1, 2).path == "NODE"
    assert all(p.uncertain for p in topo.pairs)


def test_lost_gpu_is_a_row_and_a_note():
    topo = build_topology(nvml=query_nvml(make_fake_nvml("gpu_lost")))
    lost = [g for g in topo.gpus if g.lost]
    assert [g.index for g in lost] == [2]
    assert any("GPU 2 is lost" in n for n in topo.notes)


def test_subset_keeps_only_chosen_gpus():
    topo = build_topology(smi=_smi("01")).subset([0, 1, 2, 3])
    assert [g.index for g in topo.gpus] == [0, 1, 2, 3] and len(topo.pairs) == 6
    with pytest.raises(InputError, match=r"GPU\(s\) \[9\]"):
        topo.subset([0, 9])


@pytest.mark.parametrize("path", sorted(p for p in glob.glob(os.path.join(FIXTURES, "*.txt"))
                                        if not p.endswith("nccl-tests.txt")))
def test_every_fixture_builds_a_full_pair_table(path):
    topo = build_topology(smi=read_topo_file(path))
    n = len(topo.gpus)
    assert len(topo.pairs) == n * (n - 1) // 2
    for pair in topo.pairs:
        assert pair.path in ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
        assert pair.bandwidth_gbps is not None or pair.bandwidth_range_gbps is not None
        assert pair.basis
