"""`topoprof profile`'s summary: a device profile (`topoprof.model.compute.profile`) in a few lines."""
from __future__ import annotations

from collections import Counter

from topoprof.model.compute.profile import HOST_KINDS, PRECISION_OF_DTYPE, DeviceProfile


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _size(nbytes: float) -> str:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def datasheet(profile: DeviceProfile) -> tuple[float | None, float | None]:
    """(peak FLOP/s at the profile's dtype, memory bytes/s) of its GPU in the datasheet table
    (`topoprof.model.compute`); (None, None) for a CPU or a GPU not in it."""
    if profile.machine.kind != "cuda":
        return None, None
    spec = profile.gpu.row
    if spec is None:
        return None, None
    precision = PRECISION_OF_DTYPE.get(profile.dtype)
    peak = spec.peak_tflops(precision) if precision else None
    return (peak * 1e12 if peak else None), spec.memory_bandwidth_gbps * 1e9


def _machine_line(p: DeviceProfile) -> str:
    m = p.machine
    facts = [f"{m.sm_count} SMs" if m.sm_count else None,
             f"{m.memory_bytes / 1e9:.0f} GB" if m.memory_bytes else None,
             f"driver {m.driver}" if m.driver else None, f"CUDA {m.cuda}" if m.cuda else None,
             f"{m.threads} thread(s)" if m.kind == "cpu" and m.threads else None,
             f"torch {m.torch}" if m.torch else None]
    took = f"; measured in {p.seconds:.1f} s" if p.seconds is not None else ""
    return (f"topoprof profile: {m.device} ({', '.join(f for f in facts if f)}), {p.dtype}"
            f"{', quick' if p.quick else ''}{took}")


def _host_line(p: DeviceProfile) -> str:
    parts = [f"{kind.replace('_', ' ')} {p.host_seconds_per_op[kind] * 1e6:.3g} us" if kind in p.host_seconds_per_op
             else f"{kind.replace('_', ' ')} {p.host_ranges[kind][0] * 1e6:.3g}-{p.host_ranges[kind][1] * 1e6:.3g} us "
                  "(derived)" for kind in HOST_KINDS if kind in p.host_seconds_per_op or kind in p.host_ranges]
    return "host per op: " + (", ".join(parts) if parts else "not measured")


def _gemm_lines(p: DeviceProfile, peak: float | None) -> list[str]:
    points = [g for g in p.gemm if g.dtype == p.dtype]
    if not points:
        return [f"GEMM ({p.dtype}): not measured"]
    by_work = sorted(points, key=lambda g: (g.m * g.n * g.k, g.m, g.n, g.k))
    chosen = [by_work[0], by_work[len(by_work) // 2], by_work[-1], min(points, key=lambda g: g.flops_per_s),
              max(points, key=lambda g: g.flops_per_s)]
    rates = [g.flops_per_s for g in points]
    lines = [f"GEMM ({p.dtype}, {len(points)} shapes, {_si(min(rates), 'FLOP/s')} .. {_si(max(rates), 'FLOP/s')}):"]
    seen = set()
    for g in sorted(chosen, key=lambda g: g.m * g.n * g.k):
        if (g.m, g.n, g.k) in seen:
            continue
        seen.add((g.m, g.n, g.k))
        share = f"  {100 * g.flops_per_s / peak:5.1f} % of the datasheet's {peak / 1e12:g} TFLOP/s" if peak else ""
        lines.append(f"  {f'{g.m}x{g.n}x{g.k}':>20} {_si(g.flops_per_s, 'FLOP/s'):>14}{share}")
    return lines


def _memory_line(p: DeviceProfile, bandwidth: float | None) -> str:
    points = p.memory
    if not points:
        return "memory-bound: not measured"
    rates = [m.bytes_per_s for m in points]
    top = max(m.tensor_bytes for m in points)
    at_top = ", ".join(f"{m.kind} {_si(m.bytes_per_s, 'B/s')}" for m in points if m.tensor_bytes == top)
    sheet = f" (datasheet {_si(bandwidth, 'B/s')})" if bandwidth else ""
    sizes = sorted({m.tensor_bytes for m in points})
    return (f"memory-bound: {_si(min(rates), 'B/s')} .. {_si(max(rates), 'B/s')} over {_size(sizes[0])} .. "
            f"{_size(sizes[-1])} tensors; at {_size(top)}: {at_top}{sheet}")


def _sdpa_line(p: DeviceProfile) -> str:
    if not p.sdpa:
        return "attention (SDPA forward + backward): not measured"
    rates = [s.flops_per_s for s in p.sdpa]
    seqs = sorted({s.seq for s in p.sdpa})
    dims = sorted({s.head_dim for s in p.sdpa})
    return (f"attention (SDPA forward + backward): {_si(min(rates), 'FLOP/s')} .. {_si(max(rates), 'FLOP/s')} over "
            f"{seqs[0]} .. {seqs[-1]} tokens, head dim {', '.join(map(str, dims))} (causal counts half the FLOPs)")


def _optimizer_line(p: DeviceProfile) -> str:
    o = p.optimizer
    if o is None:
        return "optimizer: not measured"
    return f"optimizer: {o.name} {_si(o.bytes_per_s, 'B/s')} over {o.bytes_per_step // o.params} B per parameter"


def render_profile(p: DeviceProfile) -> str:
    peak, bandwidth = datasheet(p)
    lines = [_machine_line(p), _host_line(p), *_gemm_lines(p, peak), _memory_line(p, bandwidth), _sdpa_line(p),
             _optimizer_line(p)]
    if p.cpu is not None:
        lines.append(f"fresh pages: {p.cpu.fresh_page_s_per_byte * 1e9:.3g} ns per byte of an output of at least "
                     f"{_size(p.cpu.fresh_page_min_bytes)}")
    if p.skipped:
        reasons = Counter(s.reason.split(":")[0] for s in p.skipped)
        lines.append(f"skipped {len(p.skipped)} point(s): " + ", ".join(f"{r} {n}" for r, n in reasons.most_common()))
    lines += [f"note: {n}" for n in p.notes]
    if p.section_seconds:
        lines.append("sections: " + ", ".join(f"{k} {v:.1f} s" for k, v in p.section_seconds.items()))
    return "\n".join(lines)
