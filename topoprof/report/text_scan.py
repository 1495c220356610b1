"""What `topoprof scan` prints when it is done: where the report is, what failed, the verdict,
the validation and the three things to do first."""
from __future__ import annotations


def summary_lines(report: dict, out_dir: str) -> list[str]:
    out = [f"topoprof scan: {report['mode']['summary']}; report in {out_dir}/report.md "
           f"({report['timing']['total_s']:.1f} s)", f"  {report['mode']['banner']}"]
    out += [f"  {p['name']}: {p['status']}: {p['detail']}" for p in report.get("probes") or []
            if p["status"] == "error"]
    v = report.get("verdict") or {}
    if v:
        out.append(f"  bandwidth: {v['summary']}")
    val = report.get("validation") or {}
    if val.get("summary", {}).get("cases"):
        s = val["summary"]
        out.append(f"  validation: median |error| {s['median_abs_error_pct']:.1f}%, worst "
                   f"{s['worst_abs_error_pct']:.1f}%")
    out += [f"  {i}. {r['title']}" for i, r in enumerate(report.get("recommendations", [])[:3], 1)]
    return out
