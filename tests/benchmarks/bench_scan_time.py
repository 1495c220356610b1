"""Scan wall time on this machine: the default scan (target <= 60 s on a 2-core CPU machine)
and `--quick` (target <= 20 s), each run once, back to back; prints time / target ratios, and
each scan's own stage times (on one GPU, "what-if for more GPUs" is the time spent timing the
compute there and pricing its ops).

    python tests/benchmarks/bench_scan_time.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

TARGETS = {"default": 60.0, "quick": 20.0}


def stage_times(out: str) -> str:
    """The scan's own timing of its stages (report.json), e.g. how long timing the compute took."""
    import json

    try:
        with open(os.path.join(out, "report.json")) as f:
            timing = json.load(f).get("timing") or {}
    except (OSError, ValueError) as err:
        return f"(no report.json: {err})"
    return ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in timing.items() if stage != "total_s")


def main() -> None:
    ratios = {}
    for name, extra in (("quick", ["--quick"]), ("default", [])):
        out = tempfile.mkdtemp(prefix=f"topoprof-scan-{name}-")
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "topoprof", "scan", "--out", out, *extra],
                              capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"scan {name} failed: {proc.stderr[-500:]}")
        ratios[name] = wall / TARGETS[name]
        print(f"{name:>8}: {wall:5.1f} s (target {TARGETS[name]:.0f} s, ratio {ratios[name]:.2f})  report {out}")
        print(f"{'':>10}stages: {stage_times(out)}")
    print(f"RESULT scan time / target: worst ratio {max(ratios.values()):.2f}: "
          f"{'PASS' if max(ratios.values()) <= 1 else 'FAIL'}")


if __name__ == "__main__":
    main()
