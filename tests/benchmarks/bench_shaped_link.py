"""Physical limit: all-reduce busbw across a tc-shaped veth between two network namespaces.

One gloo rank in each namespace, started as a torchrun-style job (RANK/WORLD_SIZE/MASTER_ADDR in
the environment, GLOO_SOCKET_IFNAME on the veth), each running `topoprof bench`. Prints busbw at
each size >= 16 MB as a ratio of the shaped rate; the target is >= 0.85. Needs root, ip and tc.

    python tests/benchmarks/bench_shaped_link.py [--rates 1000,200]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

from helpers.netns import run_pair, shaped_link, unavailable_reason  # noqa: E402


def bench_across(link, sizes: str, iters: int, timeout_s: float = 600) -> dict:
    """Run `topoprof bench` with rank 0 in namespace A and rank 1 in B; rank 0's JSON document."""
    port = "29611"
    argv = [sys.executable, "-m", "topoprof", "bench", "--backend", "gloo", "-b", sizes.split(":")[0],
            "-e", sizes.split(":")[1], "-n", str(iters), "-w", "1", "--json"]
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": link.addr_a, "MASTER_PORT": port,
              "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    a, b = run_pair(link, argv, argv,
                    env_a={**common, "RANK": "0", "LOCAL_RANK": "0", "GLOO_SOCKET_IFNAME": link.if_a},
                    env_b={**common, "RANK": "1", "LOCAL_RANK": "0", "GLOO_SOCKET_IFNAME": link.if_b},
                    timeout_s=timeout_s)
    if a.returncode != 0 or b.returncode != 0:
        raise RuntimeError(f"bench across the link failed: rank0 {a.returncode} {a.stderr[-500:]} / "
                           f"rank1 {b.returncode} {b.stderr[-500:]}")
    return json.loads(a.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1000,200", help="Mbit/s, comma-separated")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"skipped: {reason}")
    worst = 1.0
    for rate in (float(r) for r in args.rates.split(",")):
        with shaped_link(rate) as link:
            doc = bench_across(link, "16M:64M", args.iters)
        shaped_gbps = rate * 1e6 / 8 / 1e9
        print(f"link shaped to {rate:g} Mbit/s = {shaped_gbps:.4f} GB/s per direction")
        for row in doc["rows"]:
            ratio = row["busbw_gbps"] / shaped_gbps
            worst = min(worst, ratio)
            print(f"  {row['size_bytes'] >> 20:3d} MiB  busbw {row['busbw_gbps']:.4f} GB/s  = {ratio:.3f} of the shaped rate")
    print(f"RESULT physical-limit ratio (worst) = {worst:.3f}: {'PASS' if worst >= 0.85 else 'FAIL'}")


if __name__ == "__main__":
    main()
