"""Recommendations derived from real fixture topologies and from predictions say the right thing."""
from __future__ import annotations

import glob
import os
from dataclasses import replace

import pytest
from fake_nvml import make_fake_nvml
from helpers.model_reports import model_report

from topoprof.measure.bench import BenchMetadata, BenchReport, NcclNotes
from topoprof.probes.hardware.nvidia_smi import read_topo_file
from topoprof.probes.hardware.nvml import query_nvml
from topoprof.report import recommend as rec
from topoprof.report.verdict import judge, read_ring
from topoprof.specs.collective_spec import BenchRow
from topoprof.topology.build import Topology, build_topology

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "topo")


def _topo(prefix: str, nvml: str | None = None) -> Topology:
    smi = read_topo_file(glob.glob(os.path.join(FIX, f"{prefix}_*[!s].txt"))[0])
    snap = query_nvml(make_fake_nvml(nvml)) if nvml else None
    return build_topology(smi=smi, nvml=snap)


def test_nv12_node_needs_no_gpu_choice_advice():
    topo = _topo("10")  # 8 x A100, NV12 between every pair: every choice is alike
    assert rec.gpu_choice_recommendations(topo) == []
    numa = rec.numa_recommendation(topo)
    assert numa is not None and "NUMA" in numa.title  # GPUs 0-3 on node 0, 4-7 on node 1


def test_sys_split_picks_gpus_on_one_socket_for_two_gpu_jobs():
    topo = _topo("26")  # 4 x T4: GPU0 alone on socket 0 (SYS), GPUs 1-3 share a node (NODE)
    recs = {r.key: r for r in rec.gpu_choice_recommendations(topo)}
    best = recs["gpus_2"].numbers["best"]
    assert 0 not in best and set(best) <= {1, 2, 3}
    assert "NODE" in recs["gpus_2"].why


def test_phb_pair_with_p2p_off_is_flagged():
    topo = _topo("22", nvml="pcie_pair")  # PIX pair but NVML says P2P is not supported
    recs = {r.key: r for r in rec.environment_recommendations(topo, {}, {})}
    assert "p2p_off" in recs and "0-1" in recs["p2p_off"].why


def test_environment_variables_that_disable_transports_are_flagged():
    recs = {r.key for r in rec.environment_recommendations(build_topology(), {"NCCL_P2P_DISABLE": "1"},
                                                           {"NCCL_IB_DISABLE": "1"})}
    assert recs == {"env_NCCL_P2P_DISABLE", "env_NCCL_IB_DISABLE"}


def _pred(synced, no_sync, dp, fp16, k=8, exposed=0.1):
    def s(step):
        return {"step_time_s": step, "comm_exposed_s": exposed, "samples_per_s": 1 / step, "speedup_vs_ddp_synced": 1.0}
    return model_report(inputs={"accumulation_steps": k, "world_size": 4},
                        strategies={"ddp_synced": s(synced), "ddp_no_sync": s(no_sync),
                                    "dp": s(dp) if dp else {"step_time_s": None}, "ddp_fp16_compress": s(fp16)})


def test_strategy_advice_follows_the_predicted_gains():
    recs = {r.key: r for r in rec.strategy_recommendations(_pred(2.0, 1.0, 3.0, 1.8), "1.3B")}
    assert recs["no_sync"].gain_pct == 50.0 and "forward and backward" in recs["no_sync"].title
    assert "backward()" in recs["no_sync"].why  # warns about wrapping only backward
    assert "accelerator.accumulate" in recs["no_sync"].snippet
    assert recs["ddp_over_dp"].gain_pct == pytest.approx(100 / 3)
    assert recs["fp16_compress"].gain_pct == pytest.approx(10.0)
    ordered = rec.rank(list(recs.values()))
    assert ordered[0].key == "no_sync"


def test_no_advice_when_gains_are_small_or_k_is_1():
    assert rec.strategy_recommendations(_pred(1.0, 0.99, None, 0.99), "x") == []
    assert [r.key for r in rec.strategy_recommendations(_pred(2.0, 1.0, None, 2.0, k=1), "x")] == []


def _all_reduce(busbw_gbps: float, size_bytes: int = 1 << 30) -> BenchRow:
    """A bench row of the all-reduce at `size_bytes` reaching `busbw_gbps` (its time does not matter here)."""
    return BenchRow("all_reduce", size_bytes, size_bytes // 4, "float32", 1e3, None, busbw_gbps, 0)


def test_verdict_low_nvlink_names_causes():
    topo = _topo("18", nvml="dgx_h100_nvswitch")
    ring = read_ring({"ring": list(range(8)), "bottleneck_gbps": [370.8, 370.8], "hop": "NV"})
    bench = BenchReport(rows=[_all_reduce(150.0)], metadata=BenchMetadata(world_size=8, backend="nccl"),
                        nccl=NcclNotes(explained=["ranks 0<->1 used SHM (host memory): GPU peer-to-peer was not used"]))
    v = judge(bench, topo, ring)
    assert v.status == "low" and round(v.ratio, 2) == 0.40
    assert any("SHM" in c for c in v.causes)
    ok = judge(replace(bench, rows=[_all_reduce(360.0)]), topo, ring)
    assert ok.status == "ok"


def test_verdict_for_gloo_says_there_is_no_nominal():
    bench = BenchReport(rows=[_all_reduce(1.2, 1 << 24)], metadata=BenchMetadata(world_size=2, backend="gloo"))
    v = judge(bench, build_topology(), None)
    assert v.status == "unknown" and "no nominal figure" in v.summary


# ---------------------------------------------------------------- TCP slow start after idle

def _multi_node(*, backend="gloo", sysctl=1, micro_batch_s=0.06, accum=8, step_s=0.6,
                latency_us=5000.0, busbw_gbps=12.5, ib_state=None, nodes=2) -> tuple:
    """`slow_start_recommendation`'s arguments for a job on `nodes` nodes over a network of
    `busbw_gbps` and `latency_us`, whose hosts have `tcp_slow_start_after_idle` = `sysctl`."""
    from topoprof.measure.cluster import ClusterNode, ClusterReport, ClusterSummary, LevelFit
    from topoprof.measure.fit import FitLine
    from topoprof.specs.host_facts import CpuInfo, HostInfo, IbPort
    from topoprof.topology.build import Topology

    ports = (IbPort("mlx5_0", 1, 200.0, ib_state, None, "InfiniBand", (), None, None),) if ib_state else ()

    def node(name: str, rank: int) -> ClusterNode:
        host = HostInfo(name, CpuInfo(None, None, None, None), (), None, (), ports, tcp_slow_start_after_idle=sysctl)
        return ClusterNode(name, [rank], Topology(("this machine",), (), (), (), {}, host=host))

    hosts = ("a", "b", "c")[:nodes]
    inter = LevelFit(FitLine(latency_us, busbw_gbps), tuple(range(nodes)), busbw_gbps, 1 << 26)
    cluster = ClusterReport(ClusterSummary(nodes, (1,) * nodes, (0,) * nodes, (), ()),
                            levels={"inter": {"inter": inter}}, nodes=[node(h, i) for i, h in enumerate(hosts)])
    predictions = [model_report(inputs={"micro_batch_time_s": micro_batch_s, "accumulation_steps": accum},
                                strategies={"ddp_no_sync": {"step_time_s": step_s},
                                            "ddp_synced": {"step_time_s": 2 * step_s}})]
    return cluster, predictions, backend, {}


def test_slow_start_restart_costs_one_round_trip_per_doubling():
    from topoprof.model.comm import tcp

    # the initial window already covers a LAN round trip at 1 Gbit/s: nothing to regrow
    assert tcp.restart_cost_s(125e6, 50e-6) == 0.0
    # 12.5 GB/s x 1 ms = 12.5 MB = 2^10 x 12 KiB... ceil(log2(12.5e6 / 14600)) = 10 round trips
    assert tcp.restart_cost_s(12.5e9, 1e-3) == pytest.approx(10 * 1e-3)
    assert tcp.restarts_per_step(0.05, 1, 8) == 0          # 50 ms gaps: shorter than the minimum RTO
    assert tcp.restarts_per_step(0.05, 8, 1) == 1          # no_sync: 400 ms of silence, one restart


def test_slow_start_is_advised_only_when_it_costs_a_share_of_the_step():
    advice = rec.slow_start_recommendation(*_multi_node())
    assert advice is not None and advice.numbers["mode"] == "ddp_no_sync"
    # 62.5 MB in flight over 14.6 KB: 13 doublings of a 5 ms round trip, once per no_sync step
    assert advice.gain_pct == pytest.approx(100 * 13 * 5e-3 / 0.6)
    assert "tcp_slow_start_after_idle=0" in advice.snippet
    for quiet in (dict(sysctl=0), dict(latency_us=50.0), dict(micro_batch_s=0.02),
                  dict(backend="nccl", ib_state="ACTIVE"), dict(step_s=100.0)):
        assert rec.slow_start_recommendation(*_multi_node(**quiet)) is None, quiet
    # NCCL without an active RDMA port falls back to sockets: TCP again
    assert rec.slow_start_recommendation(*_multi_node(backend="nccl", ib_state="DOWN")) is not None
    _, predictions, backend, env = _multi_node()
    assert rec.slow_start_recommendation(None, predictions, backend, env) is None  # one node: no cluster


def test_a_dp_row_says_what_it_leaves_out_until_its_thread_cost_is_given():
    from topoprof.report.text_model import dp_note

    def payload(dp_step, overhead):
        return model_report(strategies={"dp": {"step_time_s": dp_step}}, inputs={"dp_thread_overhead_s": overhead})

    assert "lower bound" in " ".join(dp_note(payload(0.02, 0.0)))
    assert dp_note(payload(0.02, 0.004)) == [] and dp_note(payload(None, 0.0)) == []
