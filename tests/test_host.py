"""Tests for topoprof.probes.hardware.host against fake /proc and /sys trees, plus one run on this machine."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topoprof.probes.hardware.host import (
    HostInfo,
    interfaces_from_psutil,
    make_interface,
    parse_cpuinfo_blocks,
    parse_cpulist,
    parse_ib_rate,
    parse_ib_state,
    parse_meminfo_total,
    query_host,
)

# ---------------------------------------------------------------- fake tree helpers


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def x86_cpuinfo(sockets: int, cores: int, threads: int) -> str:
    """cpuinfo numbered like Linux does on x86: all first threads, then the siblings."""
    blocks = []
    cpu = 0
    for _thread in range(threads):
        for pkg in range(sockets):
            for core in range(cores):
                blocks.append(
                    f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel\t\t: 106\n"
                    f"model name\t: Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz\n"
                    f"physical id\t: {pkg}\nsiblings\t: {cores * threads}\ncore id\t\t: {core}\n"
                    f"cpu cores\t: {cores}\n")
                cpu += 1
    return "\n".join(blocks) + "\n"


ARM_CPUINFO = "".join(
    f"processor\t: {n}\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm\n"
    f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
    f"CPU part\t: 0xd4f\nCPU revision\t: 0\n\n"
    for n in range(4)
)


def add_pci_device(root: Path, bus_id: str, numa: int, netdevs: tuple[str, ...] = ()) -> Path:
    dev = root / "sys/devices/pci0000:00" / bus_id
    write(root, f"sys/devices/pci0000:00/{bus_id}/numa_node", f"{numa}\n")
    for name in netdevs:
        (dev / "net" / name).mkdir(parents=True)
    return dev


def add_ib_port(root: Path, device: str, port: int, *, rate: str, state: str,
                phys_state: str, link_layer: str) -> None:
    base = f"sys/class/infiniband/{device}/ports/{port}"
    write(root, f"{base}/rate", rate)
    write(root, f"{base}/state", state)
    write(root, f"{base}/phys_state", phys_state)
    write(root, f"{base}/link_layer", link_layer)


def link_ib_device(root: Path, device: str, pci_dir: Path) -> None:
    os.symlink(pci_dir, root / "sys/class/infiniband" / device / "device")


def add_netdev(root: Path, name: str, *, operstate: str, flags: str, speed: str,
               mtu: str, pci_dir: Path | None = None) -> None:
    base = f"sys/class/net/{name}"
    write(root, f"{base}/operstate", operstate + "\n")
    write(root, f"{base}/flags", flags + "\n")
    write(root, f"{base}/speed", speed + "\n")
    write(root, f"{base}/mtu", mtu + "\n")
    if pci_dir is not None:
        os.symlink(pci_dir, root / base / "device")


@pytest.fixture
def x86_host(tmp_path: Path) -> Path:
    """2 sockets x 2 cores x 2 threads, 2 NUMA nodes, 2 IB ports (one down) and one RoCE port."""
    root = tmp_path
    write(root, "proc/cpuinfo", x86_cpuinfo(sockets=2, cores=2, threads=2))
    write(root, "proc/meminfo", "MemTotal:       527958132 kB\nMemFree:        1000 kB\n")
    write(root, "proc/sys/kernel/hostname", "gpu-node-07\n")
    write(root, "proc/sys/net/ipv4/tcp_slow_start_after_idle", "1\n")
    node = "sys/devices/system/node"
    write(root, f"{node}/node0/cpulist", "0-1,4-5\n")
    write(root, f"{node}/node0/meminfo", "Node 0 MemTotal:       263833672 kB\nNode 0 MemFree: 1 kB\n")
    write(root, f"{node}/node1/cpulist", "2-3,6-7\n")
    write(root, f"{node}/node1/meminfo", "Node 1 MemTotal:       264124460 kB\n")
    write(root, f"{node}/online", "0-1\n")

    hca0 = add_pci_device(root, "0000:3b:00.0", 0, ("ib0",))
    hca1 = add_pci_device(root, "0000:86:00.0", 1)
    roce = add_pci_device(root, "0000:af:00.0", -1, ("ens1f0",))
    add_ib_port(root, "mlx5_0", 1, rate="200 Gb/sec (4X HDR)\n", state="4: ACTIVE\n",
                phys_state="5: LinkUp\n", link_layer="InfiniBand\n")
    add_ib_port(root, "mlx5_1", 1, rate="10 Gb/sec (4X SDR)\n", state="1: DOWN\n",
                phys_state="3: Disabled\n", link_layer="InfiniBand\n")
    add_ib_port(root, "mlx5_2", 1, rate="100 Gb/sec (4X EDR)\n", state="4: ACTIVE\n",
                phys_state="5: LinkUp\n", link_layer="Ethernet\n")
    link_ib_device(root, "mlx5_0", hca0)
    link_ib_device(root, "mlx5_1", hca1)
    link_ib_device(root, "mlx5_2", roce)

    add_netdev(root, "lo", operstate="unknown", flags="0x9", speed="-1", mtu="65536")
    add_netdev(root, "docker0", operstate="down", flags="0x1003", speed="-1", mtu="1500")
    add_netdev(root, "ens1f0", operstate="up", flags="0x1003", speed="100000", mtu="9000",
               pci_dir=roce)
    add_netdev(root, "ib0", operstate="up", flags="0x1003", speed="200000", mtu="4092",
               pci_dir=hca0)
    return root


# ---------------------------------------------------------------- fake hosts


def test_x86_two_socket_host(x86_host: Path) -> None:
    info = query_host(str(x86_host))
    assert info.hostname == "gpu-node-07"
    assert info.cpu.model == "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz"
    assert (info.cpu.sockets, info.cpu.cores_physical, info.cpu.cpus_logical) == (2, 4, 8)
    assert info.cpu.missing == {}
    assert [n.node for n in info.numa_nodes] == [0, 1]
    assert info.numa_nodes[0].cpus == (0, 1, 4, 5)
    assert info.numa_nodes[1].cpus == (2, 3, 6, 7)
    assert info.numa_nodes[0].memory_total_bytes == 263833672 * 1024
    assert info.memory_total_bytes == 527958132 * 1024
    assert "numa_nodes" not in info.missing and "memory_total_bytes" not in info.missing


def test_x86_ib_ports(x86_host: Path) -> None:
    ports = {p.device: p for p in query_host(str(x86_host)).ib_ports}
    assert sorted(ports) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    ib = ports["mlx5_0"]
    assert (ib.port, ib.rate_gbps, ib.state, ib.phys_state) == (1, 200.0, "ACTIVE", "LinkUp")
    assert (ib.link_layer, ib.netdevs, ib.numa_node) == ("InfiniBand", ("ib0",), 0)
    assert ib.pci_bus_id == "0000:3b:00.0"
    assert ib.missing == {}

    down = ports["mlx5_1"]
    assert (down.state, down.phys_state, down.numa_node) == ("DOWN", "Disabled", 1)
    assert down.netdevs == () and "netdevs" in down.missing

    roce = ports["mlx5_2"]
    assert (roce.link_layer, roce.netdevs, roce.rate_gbps) == ("Ethernet", ("ens1f0",), 100.0)
    assert roce.numa_node is None and "-1" in roce.missing["numa_node"]
    assert roce.pci_bus_id == "0000:af:00.0"


def test_x86_interfaces_from_sysfs(x86_host: Path) -> None:
    info = query_host(str(x86_host))
    ifaces = {i.name: i for i in info.interfaces}
    assert sorted(ifaces) == ["docker0", "ens1f0", "ib0", "lo"]
    lo, docker, ens = ifaces["lo"], ifaces["docker0"], ifaces["ens1f0"]
    assert lo.is_loopback and lo.is_virtual and lo.is_up and lo.speed_mbps is None
    assert docker.is_virtual and not docker.is_loopback and not docker.is_up
    assert (ens.is_up, ens.speed_mbps, ens.mtu, ens.is_virtual) == (True, 100000, 9000, False)
    assert ens.ipv4 == () and "interfaces.ipv4" in info.missing
    assert "interfaces[lo].speed_mbps" in info.missing
    assert "interfaces[ens1f0].speed_mbps" not in info.missing


def test_host_info_is_json_serializable_and_frozen(x86_host: Path) -> None:
    info = query_host(str(x86_host))
    json.dumps(dataclasses.asdict(info))
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.hostname = "other"  # type: ignore[misc]
    assert hash(info.numa_nodes[0]) == hash(info.numa_nodes[0])


def test_arm_host_without_model_name_or_numa(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", ARM_CPUINFO)
    write(tmp_path, "proc/meminfo", "MemTotal:        8000000 kB\n")
    for cpu in range(4):
        topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
        write(tmp_path, f"{topo}/physical_package_id", "0\n")
        write(tmp_path, f"{topo}/core_id", f"{cpu}\n")
    info = query_host(str(tmp_path))
    assert info.cpu.model is None
    assert "CPU implementer 0x41" in info.cpu.missing["model"]
    assert (info.cpu.sockets, info.cpu.cores_physical, info.cpu.cpus_logical) == (1, 4, 4)
    assert info.numa_nodes == () and "numa_nodes" in info.missing
    assert info.hostname == "" and "hostname" in info.missing
    assert info.tcp_slow_start_after_idle is None and "tcp_slow_start_after_idle" in info.missing


def test_tcp_slow_start_after_idle_is_read(x86_host: Path) -> None:
    assert query_host(str(x86_host)).tcp_slow_start_after_idle == 1
    write(x86_host, "proc/sys/net/ipv4/tcp_slow_start_after_idle", "0\n")
    assert query_host(str(x86_host)).tcp_slow_start_after_idle == 0


def test_arm_host_with_unknown_package_leaves_sockets_unknown(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", ARM_CPUINFO)
    for cpu in range(4):
        topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
        write(tmp_path, f"{topo}/physical_package_id", "-1\n")
        write(tmp_path, f"{topo}/core_id", f"{cpu}\n")
    cpu = query_host(str(tmp_path)).cpu
    assert cpu.sockets is None and cpu.cores_physical is None and cpu.cpus_logical == 4
    assert "sockets" in cpu.missing and "cores_physical" in cpu.missing


@pytest.mark.parametrize("text, model", [
    ("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\nclock\t\t: 3800MHz\n\n"
     "timebase\t: 512000000\nplatform\t: PowerNV\n", "POWER9 (raw), altivec supported"),
    ("processor\t: 0\nBogoMIPS\t: 108.00\n\nHardware\t: BCM2835\n"
     "Model\t\t: Raspberry Pi 4 Model B Rev 1.4\n", "Raspberry Pi 4 Model B Rev 1.4"),
])
def test_cpu_model_fallback_keys(tmp_path: Path, text: str, model: str) -> None:
    write(tmp_path, "proc/cpuinfo", text)
    assert query_host(str(tmp_path)).cpu.model == model


def test_no_infiniband_class_gives_empty_ports(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", x86_cpuinfo(1, 2, 1))
    info = query_host(str(tmp_path))
    assert info.ib_ports == ()
    assert "ib_ports" in info.missing
    assert info.interfaces == () and "interfaces" in info.missing


def test_empty_tree_records_reasons_without_crashing(tmp_path: Path) -> None:
    info = query_host(str(tmp_path))
    assert isinstance(info, HostInfo)
    assert info.cpu.model is None and info.cpu.cpus_logical is None
    assert {"model", "cpus_logical", "sockets"} <= set(info.cpu.missing)
    assert info.memory_total_bytes is None and "memory_total_bytes" in info.missing


def test_malformed_rate_gives_none_with_reason(x86_host: Path) -> None:
    write(x86_host, "sys/class/infiniband/mlx5_0/ports/1/rate", "fast as heck\n")
    port = next(p for p in query_host(str(x86_host)).ib_ports if p.device == "mlx5_0")
    assert port.rate_gbps is None
    assert "fast as heck" in port.missing["rate_gbps"]
    assert port.state == "ACTIVE"  # the other files are still read


def test_unreadable_port_files_and_missing_device_link(tmp_path: Path) -> None:
    (tmp_path / "sys/class/infiniband/rxe0/ports/1").mkdir(parents=True)
    port, = query_host(str(tmp_path)).ib_ports
    assert (port.device, port.port) == ("rxe0", 1)
    assert port.rate_gbps is None and port.state is None and port.link_layer is None
    assert port.pci_bus_id is None and port.numa_node is None
    assert {"rate_gbps", "state", "phys_state", "link_layer", "pci_bus_id",
            "numa_node"} <= set(port.missing)


def test_bad_numa_cpulist_recorded(x86_host: Path) -> None:
    write(x86_host, "sys/devices/system/node/node1/cpulist", "2-x\n")
    info = query_host(str(x86_host))
    assert info.numa_nodes[1].cpus == ()
    assert "2-x" in info.missing["numa_nodes[1].cpus"]


def test_memory_only_numa_node_is_not_a_gap(x86_host: Path) -> None:
    write(x86_host, "sys/devices/system/node/node2/cpulist", "\n")
    write(x86_host, "sys/devices/system/node/node2/meminfo", "Node 2 MemTotal: 100663296 kB\n")
    info = query_host(str(x86_host))
    assert info.numa_nodes[2].cpus == ()
    assert info.numa_nodes[2].memory_total_bytes == 100663296 * 1024
    assert "numa_nodes[2].cpus" not in info.missing


# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize("text, expected", [
    ("", ()),
    ("\n", ()),
    ("0", (0,)),
    ("0-3,8-11\n", (0, 1, 2, 3, 8, 9, 10, 11)),
    ("5,1-2", (1, 2, 5)),
    ("0-0", (0,)),
])
def test_parse_cpulist(text: str, expected: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "0-15:2", "1,,2", "1 2"])
def test_parse_cpulist_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


def format_cpulist(cpus: set[int]) -> str:
    """Kernel-style ranges ("0-3,8"), written independently of the parser under test."""
    parts, ordered = [], sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


@given(st.sets(st.integers(min_value=0, max_value=1023), max_size=200))
def test_parse_cpulist_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus) + "\n") == tuple(sorted(cpus))


@pytest.mark.parametrize("text, expected", [
    ("100 Gb/sec (4X EDR)\n", 100.0),
    ("25 Gb/sec (1X EDR)", 25.0),
    ("2.5 Gb/sec (1X SDR)", 2.5),
    ("200 Gb/sec (4X HDR)", 200.0),
    ("400 Gb/sec (4X NDR)", 400.0),
    ("56 Gb/sec (4X FDR)", 56.0),
    ("0 Gb/sec (1X SDR)", None),
    ("", None),
    ("fast", None),
    ("100 Mb/sec", None),
])
def test_parse_ib_rate(text: str, expected: float | None) -> None:
    assert parse_ib_rate(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("4: ACTIVE\n", "ACTIVE"),
    ("1: DOWN", "DOWN"),
    ("5: LinkUp\n", "LinkUp"),
    ("3: Disabled", "Disabled"),
    ("ACTIVE", None),
    ("", None),
])
def test_parse_ib_state(text: str, expected: str | None) -> None:
    assert parse_ib_state(text) == expected


def test_parse_meminfo_total() -> None:
    assert parse_meminfo_total("MemTotal:       16384 kB\nMemFree: 1 kB\n") == 16384 * 1024
    assert parse_meminfo_total("Node 3 MemTotal:  2048 kB\n") == 2048 * 1024
    assert parse_meminfo_total("MemFree: 1 kB\n") is None


def test_parse_cpuinfo_blocks_keeps_trailing_block() -> None:
    blocks = parse_cpuinfo_blocks("processor : 0\n\n\nprocessor : 1\n\nHardware : X\n")
    assert blocks == [{"processor": "0"}, {"processor": "1"}, {"Hardware": "X"}]


@pytest.mark.parametrize("speed, expected", [
    (0, None), (-1, None), (0xFFFF, None), (0xFFFFFFFF, None), (None, None), (25000, 25000)])
def test_make_interface_normalises_unknown_speed(speed: int | None, expected: int | None) -> None:
    iface = make_interface("eth0", is_up=True, speed_mbps=speed, mtu=0, ipv4=(),
                           is_loopback=False, is_virtual=False)
    assert iface.speed_mbps == expected and iface.mtu is None


def test_interfaces_from_psutil_output() -> None:
    stats = {
        "lo": SimpleNamespace(isup=True, speed=0, mtu=65536, flags="up,loopback,running"),
        "eth0": SimpleNamespace(isup=True, speed=25000, mtu=1500, flags="up,running"),
    }
    addr = SimpleNamespace
    addrs = {
        "lo": [addr(family=socket.AF_INET, address="127.0.0.1"),
               addr(family=socket.AF_INET6, address="::1")],
        "eth0": [addr(family=socket.AF_INET, address="10.0.0.5")],
        "tun9": [addr(family=socket.AF_INET, address="10.8.0.1")],
    }
    ifaces, missing = interfaces_from_psutil(stats, addrs, None)
    by_name = {i.name: i for i in ifaces}
    assert by_name["lo"].is_loopback and by_name["lo"].ipv4 == ("127.0.0.1",)
    assert by_name["lo"].speed_mbps is None and "interfaces[lo].speed_mbps" in missing
    assert (by_name["eth0"].speed_mbps, by_name["eth0"].ipv4) == (25000, ("10.0.0.5",))
    assert not by_name["tun9"].is_up and "interfaces[tun9]" in missing
    assert "interfaces.is_virtual" in missing


# ---------------------------------------------------------------- this machine


def test_query_host_on_this_machine() -> None:
    info = query_host()
    assert isinstance(info, HostInfo)
    assert info.hostname
    assert info.cpu.cpus_logical is not None and info.cpu.cpus_logical >= 1
    assert any(i.is_loopback for i in info.interfaces)
    json.dumps(dataclasses.asdict(info))
