"""Validation accuracy: the model's step-time predictions vs real DDP loops on gloo ranks.

Cases: 2 ranks on loopback, and 2 ranks across an emulated slow link (two network namespaces
joined by a tc-shaped veth at 1 Gbit/s and 200 Mbit/s, root only), each with three model sizes
chosen to cover communication-bound and compute-bound runs. Each case is one `topoprof validate`
(bench fit, calibration, every DDP mode, predicted vs measured). Prints every mode's error and
the median and worst |error| over all DDP modes; targets: median <= 10 %, worst <= 20 %.

    python tests/benchmarks/bench_validate.py [--links loopback,1000,200] [--steps 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

# (params, micro-batch): small model with little compute (communication-bound), a larger one,
# and a small one with a large micro-batch (compute-bound), per link.
CASES = {
    "loopback": [("1M", 4), ("10M", 4), ("1M", 64)],
    "1000": [("1M", 4), ("4M", 4), ("500K", 64)],
    "200": [("250K", 4), ("1M", 4), ("250K", 64)],
}


def _args(params: str, micro_batch: int, steps: int) -> list[str]:
    return [sys.executable, "-m", "topoprof", "validate", "--params", params, "--micro-batch", str(micro_batch),
            "--accum", "4", "--steps", str(steps), "--warmup-steps", "2", "--no-numerics", "--json"]


def run_loopback(params: str, micro_batch: int, steps: int) -> dict:
    proc = subprocess.run(_args(params, micro_batch, steps), capture_output=True, text=True, timeout=900, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-800:])
    return json.loads(proc.stdout)


def run_shaped(rate_mbit: float, params: str, micro_batch: int, steps: int) -> dict:
    from helpers.netns import run_pair, shaped_link

    with shaped_link(rate_mbit) as link:
        common = {"WORLD_SIZE": "2", "MASTER_ADDR": link.addr_a, "MASTER_PORT": "29613",
                  "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        argv = _args(params, micro_batch, steps)
        a, b = run_pair(link, argv, argv,
                        env_a={**common, "RANK": "0", "LOCAL_RANK": "0", "GLOO_SOCKET_IFNAME": link.if_a},
                        env_b={**common, "RANK": "1", "LOCAL_RANK": "0", "GLOO_SOCKET_IFNAME": link.if_b},
                        timeout_s=1200)
    if a.returncode != 0:
        raise RuntimeError(f"rank 0: {a.stderr[-800:]} / rank 1: {b.stderr[-400:]}")
    return json.loads(a.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--links", default="loopback,1000,200")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    errors = []
    for link in args.links.split(","):
        if link != "loopback":
            from helpers.netns import unavailable_reason

            reason = unavailable_reason()
            if reason:
                print(f"{link} Mbit/s: skipped ({reason})")
                continue
        for params, mb in CASES[link]:
            doc = (run_loopback(params, mb, args.steps) if link == "loopback"
                   else run_shaped(float(link), params, mb, args.steps))
            cal = doc["calibration"]
            head = (f"{link:>8} {'' if link == 'loopback' else 'Mbit/s'} {params:>5} params, micro-batch {mb:>2}: "
                    f"compute {cal['micro_batch_time_s'] * 1e3:7.1f} ms/micro-batch, "
                    f"slowdowns compute x{cal.get('compute_slowdown_during_comm', 1):.2f} comm x{cal.get('comm_slowdown_during_compute', 1):.2f}")
            print(head, flush=True)
            for mode, m in doc["modes"].items():
                errors.append(abs(m["error_pct"]))
                bound = "comm-bound" if m["measured_step_s"] > 1.25 * 4 * cal["micro_batch_time_s"] else "compute-bound"
                print(f"      {mode:<27} measured {m['measured_step_s'] * 1e3:8.1f} ms  predicted "
                      f"{m['predicted_step_s'] * 1e3:8.1f} ms  error {m['error_pct']:+6.1f}%  ({bound})", flush=True)
    if errors:
        med, worst = statistics.median(errors), max(errors)
        ok = med <= 10 and worst <= 20
        print(f"RESULT over {len(errors)} DDP modes: median |error| {med:.1f}%, worst {worst:.1f}%: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    main()
