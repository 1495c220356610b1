"""The memory count against what GPUs measured and ran.

1. The GPU point: GPT-2 at 4 x 1024 tokens in bf16 on the H200 of reports/gpu-nvidia-h200-20261126,
   torch.cuda.memory_allocated from before its forward to after it (summary.json,
   `single_activations_gb_measured`), beside what the meta pass counts for the same span (the
   blocks, the logits and loss, autocast's copies held for backward, the embedding) and beside
   Korthikanti's formula (`single_activations_gb_counted` there). Target: the trace within 2 %.
2. With --dev-set: torchtitan's FSDP2 runs of Llama 2 13B/70B and Llama 3 8B/70B on 64 A100 80GB
   (../shared/published/fsdp-llm-dev-set.json), each row through `topoprof model --gpu a100-sxm4-80gb
   --nodes 8 --gpus-per-node 8` with its local batch, sequence and checkpointing mode: does
   `fsdp_full_shard` fit, against the published "ran" or "OOM", with the memory parts. The set is
   for checking mechanisms, never for fitting: nothing here feeds back into the model.

    python tests/benchmarks/bench_memory.py [--dev-set]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

SUMMARY = os.path.join(ROOT, "reports", "gpu-nvidia-h200-20261126", "summary.json")
DEV_SET = os.path.join(ROOT, "..", "shared", "published", "fsdp-llm-dev-set.json")
TARGET = 0.02
# torchtitan's names for its modes (the dev set's "activation_checkpointing")
AC = {"none": "none", "selective layer": "layer:2", "selective op": "op", "full": "full"}


def gpu_point() -> bool:
    from probes.op_trace import trace_user_model

    measured = next(t["measured"] for t in json.load(open(SUMMARY))["tests"]
                    if t["test"] == "test_preset_memory_measured_beside_the_count")
    trace = trace_user_model("probes.preset_models:build", {"micro_batch": 4, "seq_len": 1024}, {"preset": "gpt2"},
                             {"device": "cuda", "precision": "bf16"})
    m = trace["memory"]
    kept = m["kept"]
    counted = (m["activations_bytes"] + m["param_copies_bytes"]) / 1e9
    gpu = float(measured["single_activations_gb_measured"])
    print("GPT-2, 4 x 1024 tokens, bf16 autocast: memory_allocated after the forward less before it, GB")
    print(f"  measured on the H200 (summary.json)           {gpu:8.3f}")
    print(f"  Korthikanti's formula (summary.json)          {float(measured['single_activations_gb_counted']):8.3f}")
    print(f"  the meta pass                                 {counted:8.3f}   ({100 * (counted / gpu - 1):+.1f} %)")
    print(f"    embedding                                   {kept['before_blocks_bytes'] / 1e9:8.3f}")
    print(f"    blocks                                      {sum(kept['blocks_bytes']) / 1e9:8.3f}")
    print(f"    logits and loss                             {kept['after_blocks_bytes'] / 1e9:8.3f}")
    print(f"    autocast's copies                           {m['param_copies_bytes'] / 1e9:8.3f}")
    print(f"  the allocator's rounding at the pass's peak   {(m['rounded_peak_bytes'] - m['peak_bytes']) / 1e9:8.4f}")
    ok = abs(counted / gpu - 1) <= TARGET
    print(f"{'PASS' if ok else 'FAIL'}: within {TARGET:.0%}")
    return ok


def dev_set() -> int:
    """The rows that came out as published (fits where it ran, not where it ran out of memory)."""
    import subprocess

    runs = json.load(open(DEV_SET))["runs"]
    agree = 0
    print("\n| model | local batch x seq | AC | published | fsdp_full_shard GB (range) | counted | agrees |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        args = [sys.executable, "-m", "topoprof", "model", "--preset", r["model"], "--gpu", "a100-sxm4-80gb",
                "--nodes", "8", "--gpus-per-node", "8", "--link-bandwidth", "300", "--network-bandwidth", "25",
                "--micro-batch-size", str(r["local_batch"]), "--tokens", str(r["local_batch"] * r["seq"]),
                "--activation-checkpointing", AC[r["ac"]], "--no-sweep", "--json"]
        proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
        mem = json.loads(proc.stdout)["strategies"]["fsdp_full_shard"]["memory"]
        published = r.get("result", "ran")
        counted = {True: "fits", False: "does not fit", None: "may not fit"}[mem["fits"]]
        ok = (published == "OOM") == (mem["fits"] is False)
        agree += ok
        low, high = mem["range_gb"]
        print(f"| {r['model']} | {r['local_batch']} x {r['seq']} | {r['ac']} | {published} | {low:.1f}-{high:.1f} "
              f"| {counted} | {'yes' if ok else 'NO'} |")
    print(f"{agree} of {len(runs)} rows as published")
    return agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev-set", action="store_true", help="also run the FSDP dev set (minutes)")
    args = parser.parse_args()
    ok = gpu_point()
    if args.dev_set:
        dev_set()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
