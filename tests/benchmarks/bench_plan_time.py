"""How long `topoprof model` takes to plan a user's own 70B model, traced on the meta device.

Llama 2 70B (276 GB of fp32 weights, past this machine's memory) from a user's callable that
refuses to build for real (`tests/fixtures/user_models/llama70b.py`), on 8 H100s: the trace, the
prediction of every strategy, and the search for what fits per checkpointing mode. Target: 60 s,
the minute a plan should take. Prints the time of each stage the command reports.

    python tests/benchmarks/bench_plan_time.py
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tests", "fixtures", "user_models", "llama70b.py:build")
TARGET_S = 60.0


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cmd = [sys.executable, "-m", "topoprof", "model", "--model", MODEL, "--gpu", "h100-sxm", "--tokens", "4096",
           "--world-size", "8", "--link-bandwidth", "450", "--no-sweep", "--json"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    took = time.monotonic() - start
    if proc.returncode != 0:
        print(f"FAIL: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        return 1
    ok = took <= TARGET_S
    print(f"planning Llama 2 70B from a user's callable on 8 H100s: {took:.1f} s (target {TARGET_S:.0f} s)")
    print(f"{'PASS' if ok else 'FAIL'}: within {TARGET_S:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
