"""Host facts that shape multi-GPU traffic: CPU sockets, NUMA layout, NICs, RDMA ports.

Everything is read from /proc and /sys under `root`, so tests can use a fake tree;
only the live host's interfaces (root "/") come from psutil, because sysfs holds no
IPv4 addresses. Parsers take plain text; the file reading around them is thin.
Check by hand: `lscpu`, `numactl -H`, `ip -br addr`, `ethtool IFACE`,
`ibstat` / `ibv_devinfo`, `cat /sys/class/infiniband/*/ports/*/rate`.
"""
from __future__ import annotations

import os
import re
import socket
from typing import Mapping

import psutil

from topoprof.specs.host_facts import CpuInfo, HostInfo, IbPort, NetInterface, NumaNode

# Bits of /sys/class/net/X/flags (include/uapi/linux/if.h).
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_ARPHRD_LOOPBACK = "772"
# Speeds drivers report for "unknown": 0, -1 (SPEED_UNKNOWN) and its old u16/u32 forms.
_UNKNOWN_SPEEDS = {0, 0xFFFF, 0xFFFFFFFF}

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\b")
_STATE_RE = re.compile(r"^\s*\d+\s*:\s*(\S(?:.*\S)?)\s*$")
_MEMTOTAL_RE = re.compile(r"^(?:Node\s+\d+\s+)?MemTotal:\s+(\d+)\s+kB\s*$", re.MULTILINE)
_PCI_RE = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
# Keys naming the CPU, best first: x86 "model name", ARM boards "Model", POWER "cpu".
# Lower-case "model" is a number on x86, so it is not used.
_MODEL_KEYS = ("model name", "Model", "cpu")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Sorted CPUs of a kernel CPU list ("0-3,8-11"; `cat /sys/devices/system/node/node0/cpulist`).

    "" gives (). Anything else raises ValueError, so the caller records why.
    """
    text = text.strip()
    if not text:
        return ()
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad cpulist element {part!r} in {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"descending range {part!r} in {text!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def parse_ib_rate(text: str) -> float | None:
    """Gb/s from ports/N/rate: "100 Gb/sec (4X EDR)" -> 100.0, "2.5 Gb/sec (1X SDR)" -> 2.5.

    None when the text is not in that form or the number is not positive.
    """
    match = _RATE_RE.match(text)
    rate = float(match.group(1)) if match else 0.0
    return rate if rate > 0 else None


def parse_ib_state(text: str) -> str | None:
    """Name from ports/N/state or phys_state: "4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp"."""
    match = _STATE_RE.match(text)
    return match.group(1) if match else None


def parse_meminfo_total(text: str) -> int | None:
    """Bytes from /proc/meminfo "MemTotal: N kB" or a node's "Node 0 MemTotal: N kB"."""
    match = _MEMTOTAL_RE.search(text)
    return int(match.group(1)) * 1024 if match else None


def parse_cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """Split /proc/cpuinfo into one key -> value dict per blank-line separated block."""
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not line.strip():
            blocks.append({})
        elif sep:
            blocks[-1].setdefault(key.strip(), value.strip())
    return [b for b in blocks if b]


def _cpu_model(blocks: list[dict[str, str]]) -> tuple[str | None, str]:
    """(model, "") or (None, reason). All blocks are searched: ARM boards put "Model" last."""
    for key in _MODEL_KEYS:
        for block in blocks:
            if block.get(key):
                return block[key], ""
    first = blocks[0] if blocks else {}
    ids = [f"{k} {first[k]}" for k in ("CPU implementer", "CPU part") if k in first]
    hint = f" ({', '.join(ids)})" if ids else ""
    return None, f"no 'model name', 'Model' or 'cpu' line in /proc/cpuinfo{hint}; see lscpu"


def _cpuinfo_topology(procs: list[dict[str, str]]) -> dict[int, tuple[int, int]]:
    """processor -> (physical id, core id) when every processor lists both (x86); else {}."""
    topo: dict[int, tuple[int, int]] = {}
    for block in procs:
        pkg, core = block.get("physical id", ""), block.get("core id", "")
        if not (pkg.isdigit() and core.isdigit()):
            return {}
        topo[int(block["processor"])] = (int(pkg), int(core))
    return topo


def _read(path: str) -> tuple[str | None, str]:
    """(text, "") or (None, reason). sysfs reads can fail with EINVAL, e.g. a down link's speed."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(), ""
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"


def _read_int(path: str) -> tuple[int | None, str]:
    text, reason = _read(path)
    value = (text or "").strip()
    try:
        return int(value, 16 if value.startswith("0x") else 10), ""
    except ValueError:
        return None, reason or f"{path} holds {value!r}, not an integer"


def _listdir(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def _sysfs_topology(root: str, cpus: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """processor -> (package, core) from sysfs (ARM, POWER); {} unless every CPU has both."""
    topo: dict[int, tuple[int, int]] = {}
    for cpu in cpus:
        base = os.path.join(root, f"sys/devices/system/cpu/cpu{cpu}/topology")
        pkg, _ = _read_int(os.path.join(base, "physical_package_id"))
        core, _ = _read_int(os.path.join(base, "core_id"))
        # -1 means the firmware named no package; counting it would be a guess.
        if pkg is None or core is None or pkg < 0 or core < 0:
            return {}
        topo[cpu] = (pkg, core)
    return topo


def read_cpu(root: str = "/") -> CpuInfo:
    """CPU model, sockets, physical cores and logical CPUs; compare with `lscpu`."""
    text, reason = _read(os.path.join(root, "proc/cpuinfo"))
    blocks = parse_cpuinfo_blocks(text or "")
    missing: dict[str, str] = {}
    model, model_reason = _cpu_model(blocks) if text is not None else (None, reason)
    if model is None:
        missing["model"] = model_reason
    procs = [b for b in blocks if b.get("processor", "").isdigit()]
    cpus = tuple(sorted(int(b["processor"]) for b in procs))
    if not cpus:
        missing["cpus_logical"] = reason or "no 'processor : N' lines in /proc/cpuinfo"
    topo = _cpuinfo_topology(procs) or _sysfs_topology(root, cpus)
    if not topo:
        why = "no 'physical id'/'core id' in /proc/cpuinfo and no usable sysfs cpu*/topology"
        missing["sockets"] = missing["cores_physical"] = why
    sockets = len({pkg for pkg, _ in topo.values()}) or None
    cores = len(set(topo.values())) or None
    return CpuInfo(model, sockets, cores, len(cpus) or None, missing)


def _numa_node(base: str, num: int, missing: dict[str, str]) -> NumaNode:
    text, reason = _read(os.path.join(base, f"node{num}", "cpulist"))
    cpus: tuple[int, ...] = ()
    try:
        cpus = parse_cpulist(text or "")
    except ValueError as exc:
        reason = str(exc)
    if reason:  # an empty list read cleanly is real: memory-only nodes have no CPUs
        missing[f"numa_nodes[{num}].cpus"] = reason
    mem_text, mem_reason = _read(os.path.join(base, f"node{num}", "meminfo"))
    mem = parse_meminfo_total(mem_text or "")
    if mem is None:
        missing[f"numa_nodes[{num}].memory_total_bytes"] = mem_reason or "no 'MemTotal' line"
    return NumaNode(num, cpus, mem)


def read_numa_nodes(root: str, missing: dict[str, str]) -> tuple[NumaNode, ...]:
    """NUMA nodes with their CPUs and memory; compare with `numactl -H`."""
    base = os.path.join(root, "sys/devices/system/node")
    names = _listdir(base)
    if names is None:
        missing["numa_nodes"] = f"no {base} (kernel built without NUMA)"
        return ()
    nums = sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())
    return tuple(_numa_node(base, num, missing) for num in nums)


def make_interface(name: str, *, is_up: bool, speed_mbps: int | None, mtu: int | None,
                   ipv4: tuple[str, ...], is_loopback: bool, is_virtual: bool) -> NetInterface:
    """Build a NetInterface, turning the drivers' "unknown" speeds and MTUs into None."""
    if speed_mbps is not None and (speed_mbps < 0 or speed_mbps in _UNKNOWN_SPEEDS):
        speed_mbps = None
    if mtu is not None and mtu <= 0:
        mtu = None
    return NetInterface(name, is_up, speed_mbps, mtu, ipv4, is_loopback, is_virtual)


def _is_virtual(net_dir: str, name: str) -> bool:
    # Physical NICs link `device` to their bus device; software interfaces have none.
    return not os.path.lexists(os.path.join(net_dir, name, "device"))


def interfaces_from_psutil(stats: Mapping, addrs: Mapping,
                           net_dir: str | None) -> tuple[list[NetInterface], dict[str, str]]:
    """Interfaces and reasons from psutil.net_if_stats() / net_if_addrs() output.

    net_dir (/sys/class/net) is only used for is_virtual; None where it does not exist.
    """
    missing: dict[str, str] = {}
    if net_dir is None:
        missing["interfaces.is_virtual"] = "no /sys/class/net to look for device links"
    result = []
    for name in sorted(set(stats) | set(addrs)):
        st = stats.get(name)
        ipv4 = tuple(a.address for a in addrs.get(name, ()) if a.family == socket.AF_INET)
        flags = getattr(st, "flags", "").split(",")  # psutil >= 5.9.3
        iface = make_interface(
            name, is_up=bool(st and st.isup), speed_mbps=getattr(st, "speed", None),
            mtu=getattr(st, "mtu", None), ipv4=ipv4,
            is_loopback="loopback" in flags or any(a.startswith("127.") for a in ipv4),
            is_virtual=_is_virtual(net_dir, name) if net_dir else False)
        if st is None:
            missing[f"interfaces[{name}]"] = "listed by net_if_addrs() but not net_if_stats()"
        elif iface.speed_mbps is None:
            missing[f"interfaces[{name}].speed_mbps"] = f"psutil reports speed {st.speed} (unknown)"
        result.append(iface)
    return result, missing


def _sysfs_interface(net_dir: str, name: str, missing: dict[str, str]) -> NetInterface:
    base = os.path.join(net_dir, name)
    operstate = (_read(os.path.join(base, "operstate"))[0] or "").strip()
    flags, _ = _read_int(os.path.join(base, "flags"))
    speed, speed_reason = _read_int(os.path.join(base, "speed"))
    mtu, mtu_reason = _read_int(os.path.join(base, "mtu"))
    if flags is None:  # loopback then comes from the link type alone
        loopback = (_read(os.path.join(base, "type"))[0] or "").strip() == _ARPHRD_LOOPBACK
    else:
        loopback = bool(flags & _IFF_LOOPBACK)
    # lo and some virtual drivers keep operstate "unknown" while administratively up.
    is_up = operstate == "up" or (operstate == "unknown" and bool((flags or 0) & _IFF_UP))
    iface = make_interface(name, is_up=is_up, speed_mbps=speed, mtu=mtu, ipv4=(),
                           is_loopback=loopback, is_virtual=_is_virtual(net_dir, name))
    if iface.mtu is None:
        missing[f"interfaces[{name}].mtu"] = mtu_reason or f"mtu {mtu}"
    if iface.speed_mbps is None:
        missing[f"interfaces[{name}].speed_mbps"] = (
            speed_reason or f"driver reports {speed} (unknown)")
    return iface


def read_interfaces(root: str, missing: dict[str, str]) -> tuple[NetInterface, ...]:
    """Network interfaces; compare with `ip -br addr` and `ethtool IFACE`.

    The live host (root "/") goes through psutil, which also gives IPv4 addresses;
    a fake root is read from sysfs, which has none.
    """
    net_dir = os.path.join(root, "sys/class/net")
    if os.path.abspath(root) == "/":
        sysfs_net = net_dir if os.path.isdir(net_dir) else None
        result, more = interfaces_from_psutil(psutil.net_if_stats(), psutil.net_if_addrs(), sysfs_net)
        missing.update(more)
        return tuple(result)
    names = _listdir(net_dir)
    if names is None:
        missing["interfaces"] = f"no {net_dir}"
        return ()
    missing["interfaces.ipv4"] = "sysfs holds no addresses; read only on the live host (root '/')"
    return tuple(_sysfs_interface(net_dir, name, missing) for name in names)


def _ib_device_facts(dev_dir: str) -> tuple:
    """(netdevs, numa_node, pci_bus_id, missing), shared by all ports of one device."""
    missing: dict[str, str] = {}
    device = os.path.join(dev_dir, "device")
    net = _listdir(os.path.join(device, "net"))
    if net is None:
        missing["netdevs"] = "no device/net directory (IB without IPoIB loaded, or no netdev)"
    numa, reason = _read_int(os.path.join(device, "numa_node"))
    if numa is not None and numa < 0:
        numa, reason = None, "device/numa_node is -1 (firmware gave no NUMA affinity)"
    if numa is None:
        missing["numa_node"] = reason
    pci = os.path.basename(os.path.realpath(device)) if os.path.lexists(device) else None
    if pci is None:
        missing["pci_bus_id"] = f"no {device} link"
    elif not _PCI_RE.match(pci):
        missing["pci_bus_id"] = f"device link resolves to {pci!r}, not a PCI address"
        pci = None
    return tuple(net or ()), numa, pci, missing


# ports/N file -> (IbPort field, parser)
_PORT_FILES = {
    "rate": ("rate_gbps", parse_ib_rate),
    "state": ("state", parse_ib_state),
    "phys_state": ("phys_state", parse_ib_state),
    "link_layer": ("link_layer", lambda text: text.strip() or None),
}


def _ib_port(dev_dir: str, device: str, port: int, shared: tuple) -> IbPort:
    netdevs, numa, pci, dev_missing = shared
    missing = dict(dev_missing)
    values: dict = {}
    for fname, (attr, parse) in _PORT_FILES.items():
        text, reason = _read(os.path.join(dev_dir, "ports", str(port), fname))
        values[attr] = parse(text) if text is not None else None
        if values[attr] is None:
            missing[attr] = reason or f"ports/{port}/{fname} holds {(text or '').strip()!r}, unrecognised"
    return IbPort(device=device, port=port, netdevs=netdevs, numa_node=numa,
                  pci_bus_id=pci, missing=missing, **values)


def read_ib_ports(root: str, missing: dict[str, str]) -> tuple[IbPort, ...]:
    """RDMA ports, InfiniBand and RoCE; compare with `ibstat` / `ibv_devinfo`."""
    base = os.path.join(root, "sys/class/infiniband")
    devices = _listdir(base)
    if devices is None:
        missing["ib_ports"] = f"no {base} (no RDMA devices, or ib_core not loaded)"
        return ()
    ports = []
    for device in devices:
        dev_dir = os.path.join(base, device)
        port_names = _listdir(os.path.join(dev_dir, "ports"))
        if port_names is None:
            missing[f"ib_ports[{device}]"] = f"no {dev_dir}/ports directory"
            continue
        shared = _ib_device_facts(dev_dir)
        nums = sorted(int(p) for p in port_names if p.isdigit())
        ports += [_ib_port(dev_dir, device, num, shared) for num in nums]
    return tuple(ports)


def _hostname(root: str, missing: dict[str, str]) -> str:
    if os.path.abspath(root) == "/":
        return socket.gethostname()
    for rel in ("proc/sys/kernel/hostname", "etc/hostname"):
        text, _ = _read(os.path.join(root, rel))
        if text and text.strip():
            return text.strip()
    missing["hostname"] = f"no proc/sys/kernel/hostname or etc/hostname under {root}"
    return ""


def query_host(root: str = "/") -> HostInfo:
    """CPU, NUMA, memory, interfaces and RDMA ports of the host whose /proc and /sys are
    under `root`. Compare with `lscpu`, `numactl -H`, `ip -br addr`, `ibstat`."""
    missing: dict[str, str] = {}
    hostname = _hostname(root, missing)
    cpu = read_cpu(root)
    numa_nodes = read_numa_nodes(root, missing)
    mem_text, mem_reason = _read(os.path.join(root, "proc/meminfo"))
    memory = parse_meminfo_total(mem_text or "")
    if memory is None:
        missing["memory_total_bytes"] = mem_reason or "no 'MemTotal' line in /proc/meminfo"
    interfaces = read_interfaces(root, missing)
    ib_ports = read_ib_ports(root, missing)
    slow_start, reason = _read_int(os.path.join(root, "proc/sys/net/ipv4/tcp_slow_start_after_idle"))
    if slow_start is None:
        missing["tcp_slow_start_after_idle"] = reason
    return HostInfo(hostname, cpu, numa_nodes, memory, interfaces, ib_ports, slow_start, missing)
