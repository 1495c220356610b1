"""Physical limit: all-reduce busbw across a tc-shaped veth between two network namespaces.

One gloo rank in each namespace, started as a torchrun-style job (RANK/WORLD_SIZE/MASTER_ADDR in
the environment, GLOO_SOCKET_IFNAME on the veth), each running `topoprof bench`. Prints busbw at
each size >= 16 MB as a ratio of the shaped rate; the target is >= 0.85. Needs root, ip and tc.
With --slurm the two ranks are tasks of `srun -N2 -n2` in the real two-node SLURM cluster of
tests/helpers/slurm.py (its nodes joined by the same shaped veth), which finds its rendezvous from
SLURM's own variables; that also needs slurm-wlm and munge.

    python tests/benchmarks/bench_shaped_link.py [--rates 1000,200] [--slurm]
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


def bench_under_slurm(cluster, sizes: str, iters: int, timeout_s: float = 600) -> dict:
    """`srun -N2 -n2 topoprof bench` in the cluster; rank 0's JSON document."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
        proc = cluster.run(["srun", "-N2", "-n2", "python", "-m", "topoprof", "bench", "--backend", "gloo",
                            "-b", sizes.split(":")[0], "-e", sizes.split(":")[1], "-n", str(iters), "-w", "1",
                            "--out", out], timeout=timeout_s, env=env, cwd=tmp)
        if proc.returncode != 0:
            raise RuntimeError(f"srun bench failed ({proc.returncode}): {proc.stderr[-800:]}")
        with open(out) as f:
            doc = json.load(f)
    # one rank per node: the whole job is the network level; report it once
    doc["rows"] = [r for r in doc["rows"] if r["level"] == "inter"]
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="1000,200", help="Mbit/s, comma-separated")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--slurm", action="store_true", help="start the ranks with srun in a real two-node SLURM cluster")
    args = ap.parse_args()
    if args.slurm:
        from helpers import slurm

        reason = slurm.unavailable_reason()
    else:
        reason = unavailable_reason()
    if reason:
        raise SystemExit(f"skipped: {reason}")
    worst = 1.0
    for rate in (float(r) for r in args.rates.split(",")):
        if args.slurm:
            with slurm.slurm_cluster(rate) as cluster:
                doc = bench_under_slurm(cluster, "16M:64M", args.iters)
        else:
            with shaped_link(rate) as link:
                doc = bench_across(link, "16M:64M", args.iters)
        shaped_gbps = rate * 1e6 / 8 / 1e9
        print(f"link shaped to {rate:g} Mbit/s = {shaped_gbps:.4f} GB/s per direction")
        for row in doc["rows"]:
            ratio = row["busbw_gbps"] / shaped_gbps
            worst = min(worst, ratio)
            print(f"  {row['size_bytes'] >> 20:3d} MiB  busbw {row['busbw_gbps']:.4f} GB/s  = {ratio:.3f} of the "
                  f"shaped rate")
    print(f"RESULT physical-limit ratio (worst) = {worst:.3f}: {'PASS' if worst >= 0.85 else 'FAIL'}")


if __name__ == "__main__":
    main()
