"""The host's facts as records: what `topoprof.probes.hardware.host.query_host` reads from /proc
and /sys (CPU sockets, NUMA layout, network interfaces, RDMA ports), what a `Topology` holds and
reads back from its JSON, and what the advice and report.md read. Below the hardware reader and
the topology both, so that a reader of a saved topology imports no probe."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class CpuInfo:
    """CPU package facts; check with `lscpu`."""
    model: str | None
    sockets: int | None
    cores_physical: int | None
    cpus_logical: int | None
    missing: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node; check with `numactl -H`. A node may have no CPUs (GPU or CXL memory)."""
    node: int
    cpus: tuple[int, ...]
    memory_total_bytes: int | None


@dataclass(frozen=True)
class NetInterface:
    """One network interface; check with `ip -br addr` and `ethtool IFACE`."""
    name: str
    is_up: bool
    speed_mbps: int | None
    mtu: int | None
    ipv4: tuple[str, ...]
    is_loopback: bool
    is_virtual: bool  # no /sys/class/net/X/device link: veth, bridge, lo, docker, ifb


@dataclass(frozen=True)
class IbPort:
    """One RDMA port; check with `ibstat`, `ibv_devinfo`,
    `cat /sys/class/infiniband/*/ports/*/rate`."""
    device: str
    port: int
    rate_gbps: float | None
    state: str | None
    phys_state: str | None
    link_layer: str | None  # "InfiniBand", or "Ethernet" for RoCE
    netdevs: tuple[str, ...]  # every netdev of the PCI function, not only this port's
    numa_node: int | None
    pci_bus_id: str | None
    missing: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class HostInfo:
    """Everything `query_host` reads. Gaps inside lists are keyed like
    "numa_nodes[0].cpus" or "interfaces[eth0].speed_mbps"."""
    hostname: str
    cpu: CpuInfo
    numa_nodes: tuple[NumaNode, ...]
    memory_total_bytes: int | None
    interfaces: tuple[NetInterface, ...]
    ib_ports: tuple[IbPort, ...]
    # net.ipv4.tcp_slow_start_after_idle: 1 (the kernel's default) makes TCP restart from its
    # initial window after a connection idled longer than its retransmission timeout.
    tcp_slow_start_after_idle: int | None = None
    missing: Mapping[str, str] = field(default_factory=dict, hash=False)
