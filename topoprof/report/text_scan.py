"""What `topoprof scan` prints when it is done: where the report is, what failed, the verdict,
the validation and the three things to do first, from the report's typed parts
(`topoprof.report.scan_report.read_scan_parts`)."""
from __future__ import annotations

from topoprof.report.scan_report import ScanParts


def summary_lines(parts: ScanParts, out_dir: str) -> list[str]:
    out = [f"topoprof scan: {parts.mode.summary}; report in {out_dir}/report.md "
           f"({parts.timing['total_s']:.1f} s)", f"  {parts.mode.banner}"]
    out += [f"  {p.name}: {p.status}: {p.detail}" for p in parts.probes if p.status == "error"]
    if parts.verdict is not None:
        out.append(f"  bandwidth: {parts.verdict.summary}")
    s = parts.validation.summary
    if s is not None and s.cases:
        out.append(f"  validation: median |error| {s.median_abs_error_pct:.1f}%, worst {s.worst_abs_error_pct:.1f}%")
    out += [f"  {i}. {r.title}" for i, r in enumerate(parts.recommendations[:3], 1)]
    return out
