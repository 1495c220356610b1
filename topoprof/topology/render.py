"""Plain-text rendering of a Topology for the terminal."""
from __future__ import annotations

from topoprof.specs.host_facts import HostInfo
from topoprof.topology.build import PATH_MEANING, Topology
from topoprof.topology.visible import describe, gpu_marks, job_devices


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip()] + [fmt.format(*map(str, r)).rstrip() for r in rows]


def _cpus(cpus: tuple[int, ...] | None) -> str:
    if not cpus:
        return "-"
    runs, start, prev = [], cpus[0], cpus[0]
    for c in list(cpus[1:]) + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(runs)


def _opt(value, fmt="{}") -> str:
    return "-" if value is None else fmt.format(value)


def _job_legend(topology: Topology) -> list[str]:
    return [f"* = visible to this job (CUDA_VISIBLE_DEVICES={topology.visible_devices}): "
            f"{describe(job_devices(topology))}"]


def _label(index: int, marks: dict[int, str] | None) -> str:
    return f"GPU{index}" + ("*" if index in (marks or {}) else "")


def _gpu_rows(topology: Topology) -> list[str]:
    marks = gpu_marks(topology)
    rows = []
    for g in topology.gpus:
        pcie = "-"
        if g.pcie_gen_max is not None:
            pcie = (f"Gen{_opt(g.pcie_gen_current)}x{_opt(g.pcie_width_current)} "
                    f"/ Gen{g.pcie_gen_max}x{_opt(g.pcie_width_max)}")
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "-"
        name = "LOST" if g.lost else _opt(g.name)
        job = [marks.get(g.index, "-")] if marks is not None else []
        rows.append([_label(g.index, marks), *job, name, _opt(g.pci_bus_id), cc, pcie, _opt(g.numa_node),
                     _cpus(g.cpu_affinity), _opt(g.nvlinks_active)])
    headers = ["GPU", *(["this job"] if marks is not None else []),
               "name", "bus id", "cc", "PCIe now / max", "NUMA", "CPU affinity", "NVLinks"]
    return _table(headers, rows) + (_job_legend(topology) if marks is not None else [])


def _cell(link) -> str:
    kind = link.path or "?"
    label = f"NV{link.nvlinks}" if kind == "NV" else kind
    if link.bandwidth_gbps is not None:
        return f"{label} {link.bandwidth_gbps:.0f}" + ("?" if link.uncertain else "")
    if link.bandwidth_range_gbps is not None:
        lo, hi = link.bandwidth_range_gbps
        return f"{label} {lo:.0f}-{hi:.0f}?"
    return f"{label} ?"


def _matrix(topology: Topology) -> list[str]:
    marks = gpu_marks(topology)
    labels = [_label(g.index, marks) for g in topology.gpus]
    rows = []
    for g in topology.gpus:
        row = [_label(g.index, marks)]
        for h in topology.gpus:
            row.append("X" if g.index == h.index else _cell(topology.pair(g.index, h.index)))
        rows.append(row)
    return _table([""] + labels, rows)


def _bases(topology: Topology) -> list[str]:
    seen: dict[str, list[str]] = {}
    for p in topology.pairs:
        seen.setdefault(p.basis, []).append(f"{p.gpu_a}-{p.gpu_b}")
    out = []
    for basis, pairs in seen.items():
        shown = ", ".join(pairs[:6]) + (f" (+{len(pairs) - 6} more)" if len(pairs) > 6 else "")
        out.append(f"  {basis}   [pairs {shown}]")
    p2p: dict[str, list[str]] = {}
    for p in topology.pairs:
        p2p.setdefault(f"P2P {p.p2p}: {p.p2p_basis}", []).append(f"{p.gpu_a}-{p.gpu_b}")
    for text, pairs in p2p.items():
        out.append(f"  {text}   [{len(pairs)} pair(s)]")
    return out


def _nic_rows(topology: Topology) -> list[str]:
    rows = []
    for n in topology.nics:
        near = [k.split(":")[0] for k, v in topology.gpu_nic_paths.items()
                if k.endswith(f":{n.device}") and v in ("PIX", "PXB")]
        rate = f"{n.rate_gbit:g} Gb/s" if n.rate_gbit is not None else "-"
        rows.append([n.label, n.device, rate, _opt(n.link_layer), _opt(n.state), _opt(n.numa_node),
                     ",".join(f"GPU{i}" for i in near) or "-"])
    return _table(["NIC", "device", "rate", "link layer", "state", "NUMA", "PCIe-near GPUs"], rows)


def _host_lines(host: HostInfo) -> list[str]:
    cpu = host.cpu
    lines = [f"  {host.hostname}: {cpu.model or 'CPU model unknown'}, "
             f"{_opt(cpu.sockets)} socket(s), {_opt(cpu.cores_physical)} cores, "
             f"{_opt(cpu.cpus_logical)} logical CPUs, "
             f"{(host.memory_total_bytes or 0) / 2**30:.0f} GiB"]
    for node in host.numa_nodes:
        lines.append(f"  NUMA node {node.node}: CPUs {_cpus(tuple(node.cpus))}")
    for i in (i for i in host.interfaces if not i.is_loopback and not i.is_virtual):
        speed = f"{i.speed_mbps / 1000:g} Gb/s" if i.speed_mbps else "speed unknown"
        lines.append(f"  {i.name}: {'up' if i.is_up else 'down'}, {speed}")
    return lines


def _probe_lines(topology: Topology) -> list[str]:
    """Every source that was asked, and what became of it."""
    if not topology.probes:
        return [f"sources: {', '.join(topology.sources) or 'none'}"]
    return ["sources:"] + [f"  {p.name}: {p.status}" + (f" ({p.detail})" if p.detail else "")
                           for p in topology.probes]


def render_topology(topology: Topology) -> str:
    out = [f"topoprof topo: {len(topology.gpus)} GPU(s), {len(topology.nics)} NIC(s)",
           *_probe_lines(topology), ""]
    if topology.gpus:
        out += ["GPUs"] + _gpu_rows(topology) + [""]
    if topology.pairs:
        out += ["GPU pairs: path and nominal GB/s per direction (? = uncertain until measured)"]
        out += _matrix(topology)
        out += ["", "Basis"] + _bases(topology) + [""]
        kinds = sorted({p.path for p in topology.pairs if p.path})
        out += ["Legend"] + [f"  {k:<4} = {PATH_MEANING[k]}" for k in kinds if k in PATH_MEANING] + [""]
    elif not topology.gpus:
        out += ["No NVIDIA GPU found on this machine.", ""]
    if topology.nics:
        out += ["NICs"] + _nic_rows(topology) + [""]
    if topology.host:
        out += ["Host"] + _host_lines(topology.host) + [""]
    if topology.notes:
        out += ["Notes"] + [f"  - {n}" for n in topology.notes]
    return "\n".join(out).rstrip() + "\n"
