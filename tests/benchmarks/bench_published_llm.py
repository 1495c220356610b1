"""torchtitan's FSDP2 Llama runs on 64 A100 80GB beside what `topoprof model` predicts for them.

The development set `../shared/published/fsdp-llm-dev-set.json` (torchtitan docs/performance.md):
Llama 2 13B and 70B at 2 x 4096 or 1 x 4096 tokens, Llama 3 8B and 70B at 1 x 8192, on 8 nodes of
8 A100 SXM 80GB, FSDP2 per transformer block, bf16 parameters and fp32 reductions, with and without
activation checkpointing, and the runs that ran out of memory. Each row goes through

    topoprof model --preset MODEL --gpu a100-sxm4-80gb --nodes 8 --gpus-per-node 8
        --micro-batch-size B --tokens B x SEQ --activation-checkpointing MODE
        --fsdp-param-dtype bf16 --fsdp-reduce-dtype fp32 --rmsnorm NORM

and its `fsdp_full_shard` row gives the tokens per second per GPU (B x SEQ over the step) and
whether it fits. The A100's compute is the H200 profile the tool ships, scaled by the datasheets'
ratios (`topoprof.model.compute.profile_scale`): nothing here was measured on an A100, and nothing
from the set feeds back into the model.

NORM is the run's own: torchtitan's train_configs when the numbers were first published (the Llama 2
table in 395a52627 of 2024-04-18, the Llama 3 table in 1ea476e9f of 2024-04-24; unchanged since)
set `norm_type = "fused_rmsnorm"` for the 13B and the 8B and `"rmsnorm"` for both 70B. The set's
own note cites the configs of 3faaa1a0d, by when every model had moved to `rmsnorm`.

The links: NVSwitch inside a node, 300 GB/s per direction per GPU (A100 datasheet: third-generation
NVLink, 600 GB/s total). Between nodes the source prints nothing; the default is the DGX A100's
eight 200 Gb/s HDR InfiniBand adapters, 200 GB/s per node per direction (NVIDIA DGX A100 datasheet),
and --network-bandwidth runs it at another (25: one such adapter per node). Each row prints the
communication the step leaves exposed, so what the assumption moves is in the table.

Targets (issue 31): every OOM row "does not fit" and every run that ran "fits" on 80 GB; tokens per
second within 10 %.

    python tests/benchmarks/bench_published_llm.py [--network-bandwidth GBPS] [--only MODEL]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV_SET = os.path.join(ROOT, "..", "shared", "published", "fsdp-llm-dev-set.json")
# torchtitan's names for its modes (the set's "activation_checkpointing" entry): its integer
# "selective layer" option was 2 at those commits, every second block wrapped
AC = {"none": "none", "selective layer": "layer:2", "selective op": "op", "full": "full"}
NVLINK_GBPS = 300.0        # A100 SXM: 600 GB/s total NVLink bandwidth, per direction half (A100 datasheet)
DGX_A100_NETWORK_GBPS = 200.0   # DGX A100: 8 x ConnectX-6 200 Gb/s HDR InfiniBand per node (its datasheet)
# torchtitan's norm_type per model at the commits that first published the rows (docstring)
RMSNORM = {"llama2-13b": "fused", "llama3-8b": "fused", "llama2-70b": "eager", "llama3-70b": "eager"}
TOKENS_TARGET = 0.10
RUN_TIMEOUT_S = 600
STRATEGY = "fsdp_full_shard"   # torchtitan: fully_shard per block, resharded after forward


def model_args(run: dict, network_gbps: float) -> list[str]:
    b, seq = run["local_batch"], run["seq"]
    return ["--preset", run["model"], "--gpu", "a100-sxm4-80gb", "--nodes", "8", "--gpus-per-node", "8",
            "--link-bandwidth", f"{NVLINK_GBPS:g}", "--network-bandwidth", f"{network_gbps:g}",
            "--micro-batch-size", str(b), "--tokens", str(b * seq), "--activation-checkpointing", AC[run["ac"]],
            "--fsdp-param-dtype", "bf16", "--fsdp-reduce-dtype", "fp32", "--rmsnorm", RMSNORM[run["model"]],
            "--no-sweep", "--json"]


def predict(run: dict, network_gbps: float) -> dict:
    """The model's `fsdp_full_shard` row for one run, or {"error": ...}."""
    args = [sys.executable, "-m", "topoprof", "model", *model_args(run, network_gbps)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=RUN_TIMEOUT_S,
                              env={**os.environ, "PYTHONPATH": ROOT})
    except subprocess.TimeoutExpired:
        return {"error": f"no answer in {RUN_TIMEOUT_S} s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout)["strategies"][STRATEGY]


def tokens_per_s(run: dict, step_s: float | None) -> float | None:
    return run["local_batch"] * run["seq"] / step_s if step_s else None


def verdict(fits) -> str:
    return {True: "fits", False: "does not fit", None: "may not fit"}[fits]


def row(run: dict, got: dict) -> tuple[str, bool, bool | None]:
    """(table row, memory as published, tokens within target or None where not comparable)."""
    published = run.get("result", "ran")
    head = f"| {run['model']} | {run['local_batch']} x {run['seq']} | {run['ac']} | {RMSNORM[run['model']]} |"
    if "error" in got:
        return f"{head} {published} | - | - | - | error: {got['error']} | - | NO |", False, None
    mem = got.get("memory") or {}
    low, high = mem.get("range_gb") or (mem.get("total_gb"), mem.get("total_gb"))
    fits = mem.get("fits")
    memory_ok = (fits is False) if published == "OOM" else (fits is True)
    mem_text = f"{verdict(fits)} ({low:.1f}-{high:.1f} GB)" if low is not None else verdict(fits)
    if published == "OOM" or got.get("step_time_s") is None:
        return (f"{head} {published} | - | - | - | {mem_text} | - | {'yes' if memory_ok else 'NO'} |", memory_ok,
                None)
    predicted = tokens_per_s(run, got["step_time_s"])
    rng = got.get("range") or {}
    fast_s, slow_s = rng.get("step_time_s") or (None, None)
    slow, fast = tokens_per_s(run, slow_s), tokens_per_s(run, fast_s)
    spread = f"{slow:,.0f}-{fast:,.0f}" if slow and fast else "-"
    ratio = predicted / run["tokens_per_s_per_gpu"] - 1
    exposed = got.get("comm_exposed_s") or 0.0
    return (f"{head} {run['tokens_per_s_per_gpu']:,} "
            f"| {predicted:,.0f} ({spread}) | {ratio:+.1%} | {exposed * 1e3:.0f} ms | {mem_text} | "
            f"{'yes' if abs(ratio) <= TOKENS_TARGET else 'NO'} | {'yes' if memory_ok else 'NO'} |",
            memory_ok, abs(ratio) <= TOKENS_TARGET)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network-bandwidth", type=float, default=DGX_A100_NETWORK_GBPS,
                        help="each node's NICs together, GB/s per direction (default: the DGX A100's)")
    parser.add_argument("--only", help="the runs of one model (e.g. llama3-8b)")
    parser.add_argument("--dev-set", default=DEV_SET)
    args = parser.parse_args()
    runs = [r for r in json.load(open(args.dev_set))["runs"] if not args.only or r["model"] == args.only]
    print(f"torchtitan FSDP2 on 64 A100 SXM 80GB ({os.path.relpath(args.dev_set, ROOT)}) beside `topoprof model` "
          f"{STRATEGY}: NVLink {NVLINK_GBPS:g} GB/s, network {args.network_bandwidth:g} GB/s per node; "
          "the A100's compute scaled from the shipped H200 profile", flush=True)
    lines, memory_ok, tokens_ok = [], 0, []
    for i, run in enumerate(runs, 1):
        started = time.monotonic()
        print(f"  [{i}/{len(runs)}] {run['model']} {run['local_batch']} x {run['seq']} {run['ac']} ...",
              file=sys.stderr, end="", flush=True)
        line, mem, tok = row(run, predict(run, args.network_bandwidth))
        print(f" {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        lines.append(line)
        memory_ok += mem
        if tok is not None:
            tokens_ok.append(tok)
    print("\n| model | local batch x seq | AC | RMSNorm | published tokens/s/GPU | predicted (range) "
          "| predicted vs published | exposed comm | memory per GPU | tokens within 10 % | memory as published |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    print(f"\nmemory: {memory_ok} of {len(runs)} rows as published (OOM: does not fit; ran: fits) - "
          f"{'PASS' if memory_ok == len(runs) else 'FAIL'}")
    print(f"tokens per second: {sum(tokens_ok)} of {len(tokens_ok)} runs within {TOKENS_TARGET:.0%} - "
          f"{'PASS' if tokens_ok and all(tokens_ok) else 'FAIL'}")
    return 0 if memory_ok == len(runs) and tokens_ok and all(tokens_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
