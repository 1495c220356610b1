"""Tests for topoprof.measure.nccl_log against real NCCL_DEBUG=INFO logs (tests/fixtures/nccl_logs)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoprof.measure.nccl_log import (
                                       ChannelConnection,
                                       NcclLogSummary,
                                       PairTransport,
                                       explain,
                                       parse_nccl_info,
                                       transport_family,
                                       transport_kind,
                                       version_tuple,
                                       )

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_logs"
ALL_FIXTURES = sorted(p.name for p in FIXTURES.glob("*.log"))


def fixture_text(name: str) -> str:
    """The log as published: everything after the "# ---" line that ends the source header."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if line.rstrip("\r\n") == "# ---")
    return "".join(lines[end + 1 :])


def parse_fixture(prefix: str) -> NcclLogSummary:
    (name,) = [n for n in ALL_FIXTURES if n.startswith(prefix)]
    return parse_nccl_info(fixture_text(name), source=name)


def pair(summary: NcclLogSummary, a: int, b: int) -> PairTransport:
    (found,) = [p for p in summary.pairs if (p.rank_a, p.rank_b) == (a, b)]
    return found


def pair_keys(summary: NcclLogSummary) -> set[tuple[int, int]]:
    return {(p.rank_a, p.rank_b) for p in summary.pairs}


# ---------------------------------------------------------------- every fixture


def test_fixture_set_is_complete():
    assert len(ALL_FIXTURES) >= 5
    for name in ALL_FIXTURES:
        head = (FIXTURES / name).read_text(encoding="utf-8").splitlines()[0]
        assert head.startswith("# source: "), name


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_fixture_parses_and_points_at_its_lines(name):
    text = fixture_text(name)
    summary = parse_nccl_info(text, source=name)
    lines = text.splitlines()
    assert summary.lines_read == len(lines)
    assert summary.source == name
    for conn in summary.connections:
        printed = lines[conn.line - 1]
        assert f"via {conn.detail}" in printed
        assert f"{conn.src_rank}" in printed and "->" in printed
        assert conn.transport == transport_family(conn.detail)
    assert sum(p.channels for p in summary.pairs) <= len(summary.connections)
    assert all(e and isinstance(e, str) for e in explain(summary))


# ---------------------------------------------------------------- fixture by fixture


def test_01_multinode_ib_gdrdma_and_cumem():
    s = parse_fixture("01_")
    assert s.nccl_version == "2.23.4+cuda12.4"
    assert version_tuple(s.nccl_version) == (2, 23, 4)
    assert s.nranks == 8
    assert s.ranks_seen == tuple(range(8))
    assert s.network == "IBext_v8"
    assert (s.coll_channels, s.p2p_channels) == (3, 4)
    assert dict(s.env_overrides) == {"NCCL_COLLNET_ENABLE": "1"}
    assert s.warnings == (
        "NET/IB : SHARP coll init error: Cannot create SHARP job(-11)",
        "Cannot initialize CollNet, using point-to-point network instead",
    )
    assert s.algorithms == ()
    assert len(s.connections) == 82
    assert len(s.pairs) == 23
    # Two GPUs per node: ranks 2k and 2k+1 share a node and use CUMEM peer-to-peer both ways.
    for a in range(0, 8, 2):
        for x, y in ((a, a + 1), (a + 1, a)):
            p = pair(s, x, y)
            assert p.transports == ("P2P/CUMEM/read",)
            assert p.kind == "P2P (CUMEM)"
            assert p.channels == 3
    others = [p for p in s.pairs if p.rank_a // 2 != p.rank_b // 2]
    assert len(others) == 15
    assert {p.kind for p in others} == {"NET/IBext_v8 (GPUDirect RDMA)"}
    ring_edge = pair(s, 3, 4)  # seen from both ends: the sender names its PXN proxy "5(2)"
    assert ring_edge.transports == ("NET/IBext_v8/0/GDRDMA", "NET/IBext_v8/5(2)/GDRDMA")
    assert ring_edge.channels == 3
    first = s.connections[0]
    assert first == ChannelConnection(0, 7, 0, "NET", "NET/IBext_v8/1/GDRDMA", "receive", first.line)
    assert {c.direction for c in s.connections if c.transport == "P2P"} == {None}


def test_02_socket_with_p2p_and_shm_disabled():
    s = parse_fixture("02_")
    assert s.nccl_version == "2.29.2+cuda12.8"
    assert s.nranks == 2
    assert s.ranks_seen == (0, 1)
    assert s.network == "Socket"
    assert (s.coll_channels, s.p2p_channels) == (2, 2)
    assert dict(s.env_overrides) == {
        "NCCL_COMM_ID": "172.17.16.64:23456",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
    }
    assert s.pairs == (PairTransport(0, 1, ("NET/Socket/0/Shared",), 1, "NET/Socket"),)
    (conn,) = s.connections
    assert (conn.channel, conn.direction, conn.transport) == (1, "send", "NET")
    assert s.warnings == (
        "ncclSocketInit: connecting to address  with family 1 is neither AF_INET(2) nor AF_INET6(10)",
    )
    assert "NET/IB : No device found" in s.notes
    text = "\n".join(explain(s))
    assert "ranks 0->1 used NET/Socket on 1 channel: NCCL found no InfiniBand device" in text
    assert "NCCL_SHM_DISABLE=1" in text and "NCCL_P2P_DISABLE=1" in text


def test_03_shm_because_p2p_disabled_in_a_noisy_vllm_log():
    s = parse_fixture("03_")
    assert s.nccl_version == "2.28.9+cuda13.0"
    assert s.nranks == 2
    assert s.ranks_seen == (0, 1)
    assert s.network == "Socket"
    assert (s.coll_channels, s.p2p_channels) == (2, 2)
    assert dict(s.env_overrides) == {"NCCL_CUMEM_ENABLE": "1", "NCCL_P2P_DISABLE": "1"}
    assert s.pairs == (
        PairTransport(0, 1, ("SHM/direct/direct",), 2, "SHM (host memory)"),
        PairTransport(1, 0, ("SHM/direct/direct",), 2, "SHM (host memory)"),
    )
    assert s.warnings == ()
    assert s.lines_read == 86
    assert (
        "ranks 0<->1 used SHM (host memory) on 2 channels: "
        "GPU peer-to-peer was not used; P2P disabled by NCCL_P2P_DISABLE=1"
    ) in explain(s)


def test_04_tuning_table_and_chosen_algorithms():
    s = parse_fixture("04_")
    assert s.nccl_version == "2.29.7+cuda12.9"
    assert s.algorithms == ("Ring/LL", "Ring/Simple")
    assert s.pairs == () and s.connections == ()
    assert dict(s.env_overrides) == {"NCCL_P2P_DISABLE": "1"}
    assert (s.nranks, s.network, s.coll_channels) == (None, None, None)
    sentences = explain(s)
    assert "algorithm/protocol chosen: Ring/LL, Ring/Simple" in sentences
    assert any("does not show which transport" in e for e in sentences)


def test_05_multinode_socket_and_p2p_ipc_read():
    s = parse_fixture("05_")
    assert s.nccl_version is None
    assert s.network == "Socket"
    assert s.ranks_seen == (0, 8, 9, 10)
    assert pair(s, 9, 10) == PairTransport(9, 10, ("P2P/IPC/read",), 3, "P2P (IPC)")
    assert pair(s, 0, 8) == PairTransport(0, 8, ("NET/Socket/0",), 2, "NET/Socket")
    assert pair(s, 8, 0) == PairTransport(8, 0, ("NET/Socket/0",), 2, "NET/Socket")
    directions = {(c.src_rank, c.direction) for c in s.connections if c.transport == "NET"}
    assert directions == {(0, "receive"), (8, "send")}
    assert len(s.warnings) == 3
    assert s.warnings[-1] == "socketProgress: Connection closed by remote peer <cluster_name>.ibnet<53735>"
    assert "ranks 0<->8 used NET/Socket on 2 channels" in explain(s)


def test_06_old_format_ib_gdrdma_with_bus_ids():
    s = parse_fixture("06_")
    assert s.network == "IB"
    assert s.ranks_seen == (0, 1, 2, 3)
    assert len(s.connections) == 12
    assert pair_keys(s) == {(0, 1), (0, 2), (2, 0), (2, 1), (2, 3), (3, 0), (3, 2)}
    assert {p.kind for p in s.pairs} == {"NET/IB (GPUDirect RDMA)"}
    assert pair(s, 0, 2).transports == ("NET/IB/5/GDRDMA", "NET/IB/2/GDRDMA")
    assert pair(s, 2, 3).channels == 1 and pair(s, 3, 2).channels == 1
    assert "ranks 2<->3 used NET/IB (GPUDirect RDMA) on 2 channels" in explain(s)


def test_07_ring_format_with_direct_shared_memory_and_plain_ranks():
    s = parse_fixture("07_")
    assert len(s.pairs) == 7
    assert pair(s, 39, 88) == PairTransport(39, 88, ("direct shared memory",), 1, "SHM (host memory)")
    ib = pair(s, 16, 32)  # 2.4 printed no device in brackets for network peers
    assert ib.transports == ("NET/IB/0",) and ib.kind == "NET/IB"
    assert pair(s, 34, 36).kind == "P2P (IPC)"
    assert {c.channel for c in s.connections} == {0}
    assert s.warnings == ("Cuda failure 'invalid argument'",)
    sentences = explain(s)
    assert "ranks 39->88 used SHM (host memory) on 1 channel: GPU peer-to-peer was not used" in sentences
    assert "ranks 16->32 used NET/IB on 1 channel: GPUDirect RDMA was not used" in sentences


def test_08_fused_lines_from_eight_processes():
    s = parse_fixture("08_")
    assert len(s.connections) == 17
    assert s.ranks_seen == tuple(range(8))
    assert len(s.pairs) == 15
    assert {p.kind for p in s.pairs} == {"P2P (IPC)"}
    # "... [6] NCCL INFO learnfair062:... [7] NCCL INFO Ring 04 : 7[7] -> 3[3] via P2P/IPC"
    assert pair(s, 7, 3).channels == 1
    # "Ring 04 : 6[6] -> 5[5] via P2P/IPC" (a tail without prefix) plus a whole line for ring 5
    assert pair(s, 6, 5).channels == 2
    assert pair(s, 1, 2).channels == 2


def test_09_environment_and_ring_order_without_connections():
    s = parse_fixture("09_")
    assert dict(s.env_overrides) == {"NCCL_MAX_NCHANNELS": "1", "NCCL_NTHREADS": "256"}
    assert s.coll_channels == 1  # from "Channel 00/01 :    0   1"
    assert s.ranks_seen == (0, 1)
    assert s.pairs == ()
    assert s.algorithms == ()  # the table lists candidates, not a choice


def test_10_direct_pointer_and_old_channel_summary_line():
    s = parse_fixture("10_")
    assert (s.coll_channels, s.p2p_channels) == (6, 8)
    assert pair(s, 13, 12) == PairTransport(13, 12, ("P2P/direct pointer",), 5, "P2P (direct pointer)")
    assert pair(s, 15, 13).channels == 2
    assert pair(s, 6, 14) == PairTransport(6, 14, ("NET/IB/0/GDRDMA",), 2, "NET/IB (GPUDirect RDMA)")
    assert s.network == "IB"


def test_11_multinode_ipc_read_and_socket_send():
    s = parse_fixture("11_")
    assert s.network == "Socket"
    assert pair(s, 5, 8) == PairTransport(5, 8, ("NET/Socket/0",), 1, "NET/Socket")
    assert pair(s, 0, 3).channels == 4 and pair(s, 4, 7).channels == 4
    assert pair(s, 10, 11).channels == 3
    assert len(s.pairs) == 6


def test_12_ring_and_tree_graph_lines_are_not_connections():
    s = parse_fixture("12_")
    assert s.nranks == 2
    assert s.coll_channels == 2
    assert s.pairs == (PairTransport(1, 0, ("P2P/direct pointer",), 1, "P2P (direct pointer)"),)
    assert explain(s)[1] == "ranks 1->0 used P2P (direct pointer) on 1 channel"


# ---------------------------------------------------------------- interleaving


def test_line_order_does_not_change_the_pairs():
    text = fixture_text(ALL_FIXTURES[0])
    lines = text.splitlines()
    random.Random(7).shuffle(lines)
    shuffled = parse_nccl_info("\n".join(lines))
    original = parse_nccl_info(text)
    assert pair_keys(shuffled) == pair_keys(original)
    assert {(p.rank_a, p.rank_b, p.channels, p.kind) for p in shuffled.pairs} == {
        (p.rank_a, p.rank_b, p.channels, p.kind) for p in original.pairs
    }
    assert (shuffled.nranks, shuffled.coll_channels, shuffled.network) == (8, 3, "IBext_v8")


def test_two_rank_outputs_interleaved_with_launcher_prefixes():
    rank0 = [
        "[1,0]<stdout>:node-a:101:201 [0] NCCL INFO NCCL version 2.18.5+cuda12.2",
        "[1,0]<stdout>:node-a:101:201 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
        "[1,0]<stdout>:node-a:101:201 [0] NCCL INFO Channel 00/0 : 0[1000] -> 1[2000] via P2P/IPC/read",
        "[1,0]<stdout>:node-a:101:201 [0] NCCL INFO Channel 01/0 : 0[1000] -> 1[2000] via P2P/IPC/read",
    ]
    rank1 = [
        "2025-11-12 20:42:20,261 - INFO - node-a:102:202 [1] NCCL INFO Using network IB",
        "2025-11-12 20:42:20,262 - INFO - node-a:102:202 [1] NCCL INFO Channel 00/0 : 1[2000] -> 0[1000] via "
        "P2P/IPC/read",
        # Two writers on one stream: rank 1's line is cut by rank 0's
        "node-a:102:202 [1] NCCL INFO Channel 01/0 : 1[2000] -> 0[1000] via P2P/IPC/readnode-a:101:201 [0] NCCL INFO "
        "Connected all rings",
    ]
    mixed = [line for pair_of_lines in zip(rank0, rank1) for line in pair_of_lines] + rank0[len(rank1):]
    s = parse_nccl_info("\n".join(mixed))
    assert s.nccl_version == "2.18.5+cuda12.2"
    assert s.network == "IB"
    assert s.nranks == 2
    assert pair(s, 0, 1).channels == 2
    back = pair(s, 1, 0)
    assert back.channels == 2
    # "read" runs into the next host name; the transport text cannot be told apart from it
    assert back.transports[0] == "P2P/IPC/read"
    assert explain(s)[1] == "ranks 0<->1 used P2P (IPC) on 2 channels"


# ---------------------------------------------------------------- single lines


@pytest.mark.parametrize(
    ("detail", "family", "kind"),
    [
        ("P2P/IPC", "P2P", "P2P (IPC)"),
        ("P2P/IPC/read", "P2P", "P2P (IPC)"),
        ("P2P/CUMEM/read", "P2P", "P2P (CUMEM)"),
        ("P2P/direct pointer", "P2P", "P2P (direct pointer)"),
        ("SHM/direct/direct", "SHM", "SHM (host memory)"),
        ("direct shared memory", "SHM", "SHM (host memory)"),
        ("NET/IB/0", "NET", "NET/IB"),
        ("NET/IB/0/GDRDMA", "NET", "NET/IB (GPUDirect RDMA)"),
        ("NET/IBext_v8/5(2)/GDRDMA", "NET", "NET/IBext_v8 (GPUDirect RDMA)"),
        ("NET/Socket/0", "NET", "NET/Socket"),
        ("NET/Socket/0/Shared", "NET", "NET/Socket"),
        ("NET/AWS Libfabric/0/GDRDMA", "NET", "NET/AWS Libfabric (GPUDirect RDMA)"),
        ("COLLNET/SHARP/1/GDRDMA", "COLLNET", "CollNet/SHARP (GPUDirect RDMA)"),
    ],
)
def test_transport_names(detail, family, kind):
    assert transport_family(detail) == family
    assert transport_kind(detail) == kind
    line = f"h:1:2 [0] NCCL INFO Channel 03/1 : 4[4] -> 5[5] [send] via {detail}"
    (conn,) = parse_nccl_info(line).connections
    assert (conn.detail, conn.channel, conn.src_rank, conn.dst_rank, conn.direction) == (detail, 3, 4, 5, "send")


def test_transport_text_stops_before_appended_comm_and_other_text():
    s = parse_nccl_info(
        "ruijie:1122:1663 [1] NCCL INFO Channel 32 : 1[c3000] -> 0[3000] via SHM/direct/direct comm 0x557519a97630\n"
        "x:1:1 [0] NCCL INFO Channel 00 : 0[1] -> 1[2] via SHM/direct/direct(Worker_TP0 pid=1) INFO ..."
    )
    assert [c.detail for c in s.connections] == ["SHM/direct/direct", "SHM/direct/direct"]


@pytest.mark.parametrize(
    ("line", "version", "expected"),
    [
        ("node-0:309:309 [0] NCCL INFO AllGather: 37756928 Bytes -> Algo 1 proto 2 time 2860.208008", "2.18.5",
         "Ring/Simple"),
        ("h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 0 proto 0 time 12.5", None, "Tree/LL"),
        ("h:1:1 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo 4 proto 2 time 1.0", "2.18.5", "NVLS/Simple"),
        ("h:1:1 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo 4 proto 2 time 1.0", None, "Algo4/Simple"),
        ("h:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo 2 proto 1 time 1.0", "2.8.4", "CollNet/LL128"),
        ("h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..1}", None, "Tree/LL"),
        ("h:1:1 [0] NCCL INFO AllReduce: 8388608 Bytes -> Algo NVLS_TREE proto LL128 channel{Lo..Hi}={0..15}", None,
         "NVLSTree/LL128"),
    ],
)
def test_algorithm_lines(line, version, expected):
    head = f"h:1:1 [0] NCCL INFO NCCL version {version}+cuda12.2\n" if version else ""
    assert parse_nccl_info(head + line).algorithms == (expected,)


def test_environment_values_keep_inner_dots_and_drop_the_final_one():
    s = parse_nccl_info(
        "h:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to en,eth,em,bond\n"
        "h:1:1 [0] NCCL INFO NCCL_COMM_ID set by environment to 10.0.0.1:29500\n"
        "h:1:1 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n"
    )
    assert dict(s.env_overrides) == {
        "NCCL_SOCKET_IFNAME": "en,eth,em,bond",
        "NCCL_COMM_ID": "10.0.0.1:29500",
        "NCCL_IB_DISABLE": "1",
    }


def test_nranks_from_nccl_tests_collective_lines_and_bytes_input():
    line = (b"h:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f recvbuff 0x7f count 100 datatype 7 op 0 root 0 "
            b"comm 0x55 [nranks=4] stream 0x55\n")
    s = parse_nccl_info(line)
    assert s.nranks == 4
    assert s.algorithms == ()


# ---------------------------------------------------------------- explain


def test_explain_names_the_reason_for_shm_when_p2p_could_not_be_enabled():
    s = parse_nccl_info(
        "h:1:9 [1] NCCL INFO Could not enable P2P between dev 1(=3d000) and dev 0(=1a000)\n"
        "h:1:9 [1] NCCL INFO Channel 00 : 1[3d000] -> 2[89000] via direct shared memory\n"
    )
    assert explain(s)[1] == (
        "ranks 1->2 used SHM (host memory) on 1 channel: GPU peer-to-peer was not used; "
        "NCCL reported it could not enable P2P between the GPUs"
    )


def test_explain_on_sockets_with_ib_disabled_and_on_mixed_transports():
    s = parse_nccl_info(
        "user:852750:852802 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n"
        "user:852750:852802 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/Socket/0\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n"
        "h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC\n"
    )
    assert pair(s, 0, 1).kind == "SHM (host memory) + P2P (IPC)"
    sentences = explain(s)
    assert "ranks 0->1 used SHM (host memory) + P2P (IPC) on 2 channels" in sentences
    assert "ranks 3->4 used NET/Socket on 1 channel: InfiniBand disabled by NCCL_IB_DISABLE=1" in sentences


def test_explain_makes_no_p2p_claims_for_p2p_pairs():
    s = parse_fixture("01_")
    text = " ".join(explain(s))
    assert "disabled" not in text and "not used" not in text
    assert "4 rank pairs used P2P (CUMEM) (0<->1, 2<->3, 4<->5, 6<->7)" in text


def test_explain_on_text_with_nothing_in_it():
    s = parse_nccl_info("", source="empty.log")
    assert s == NcclLogSummary(None, None, (), (), None, None, None, {}, (), (), 0, source="empty.log")
    assert explain(s) == [
        "NCCL version not printed (empty.log, 0 lines).",
        "no per-channel transport lines were found, so the log does not show which transport each rank pair used",
    ]


# ---------------------------------------------------------------- never raises

_FRAGMENTS = [
    "NCCL INFO ", "Channel ", "Ring ", "00", "/0", "/02", " : ", "0", "1[1a000]", "[", "]", " -> ",
    " [send] ", "[receive]", " via ", "P2P/IPC/read", "NET/IB/0/GDRDMA", "(2)", "/", "SHM", "direct shared memory",
    "rank 3 nranks ", "nRanks ", "coll channels,", " p2p channels,", "NCCL version 2.", "Using network ",
    "set by environment to ", "NCCL_P2P_DISABLE", "NCCL WARN ", "Bytes -> Algo ", " proto ", "9" * 30, "\n", " ", "\t",
]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_never_raises_on_any_text(text):
    s = parse_nccl_info(text)
    assert s.lines_read == len(text.splitlines())
    explain(s)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=60))
def test_parse_never_raises_on_log_like_text(parts):
    s = parse_nccl_info("".join(parts))
    for p in s.pairs:
        assert p.channels >= 1 and p.transports
    explain(s)
