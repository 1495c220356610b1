"""Fidelity: topoprof bench's all-reduce busbw vs the plainest torch.distributed loop.

Same ranks (gloo, 2 on loopback), same sizes, same iterations, alternated round by round in one
run so both see the same machine state. Prints the per-size median ratio topoprof / plain; the
target is >= 0.95 at sizes >= 16 MB.

    python tests/benchmarks/bench_fidelity.py [--rounds 5] [--iters 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from topoprof.measure.bench import BenchOptions, run_bench  # noqa: E402
from topoprof.measure.launch import free_port  # noqa: E402

SIZES = [16 << 20, 32 << 20, 64 << 20]


def plain_round(nproc: int, iters: int, warmup: int) -> dict[int, float]:
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo"}
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "benchmarks", "plain_allreduce.py"),
             ",".join(map(str, SIZES)), str(iters), str(warmup)],
            env=env, stdout=subprocess.PIPE, text=True))
    out = procs[0].communicate(timeout=600)[0]
    for p in procs[1:]:
        p.wait(timeout=60)
    return {r["size_bytes"]: r["busbw_gbps"] for r in map(json.loads, out.splitlines())}


def topoprof_round(nproc: int, iters: int, warmup: int) -> dict[int, float]:
    opts = BenchOptions(backend="gloo", nproc=nproc, sizes=tuple(SIZES), iters=iters, warmup=warmup)
    result = run_bench(opts)
    if result.status != "ok":
        raise SystemExit(f"topoprof bench failed: {result.error}")
    return {r.size_bytes: r.busbw_gbps for r in result.rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    ratios: dict[int, list[float]] = {s: [] for s in SIZES}
    for i in range(args.rounds):
        # Alternate which goes first so drift in machine load does not favour one side.
        order = (topoprof_round, plain_round) if i % 2 == 0 else (plain_round, topoprof_round)
        got = {f.__name__: f(args.nproc, args.iters, args.warmup) for f in order}
        for s in SIZES:
            ratios[s].append(got["topoprof_round"][s] / got["plain_round"][s])
        print(f"round {i}: " + "  ".join(
            f"{s >> 20} MiB topoprof {got['topoprof_round'][s]:.3f} plain {got['plain_round'][s]:.3f} GB/s"
            for s in SIZES), flush=True)
    print("\nsize      median ratio topoprof/plain  (target >= 0.95)")
    worst = min(statistics.median(v) for v in ratios.values())
    for s, v in ratios.items():
        print(f"{s >> 20:4d} MiB  {statistics.median(v):.3f}   (rounds: {', '.join(f'{x:.3f}' for x in v)})")
    print(f"RESULT fidelity ratio (worst size median) = {worst:.3f}: {'PASS' if worst >= 0.95 else 'FAIL'}")


if __name__ == "__main__":
    main()
