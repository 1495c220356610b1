"""Timing a model by its blocks vs timing it whole, on a shape that fits.

A preset too large for one GPU is timed at 2 and 4 blocks and extended linearly to its depth
(`topoprof/model/compute/measured.py`). Here the whole model fits, so both are measured in the same run,
alternating, and compared: forward+backward per micro-batch and the optimizer step.
Target: the scaled forward+backward within 5 % of the whole model's.

On a GPU (the first one), in bf16 autocast; on a CPU, in fp32 and with a shorter sequence.

    python tests/benchmarks/bench_scaled_timing.py [--preset gpt2] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main() -> None:
    from topoprof.measure.runner import visible_gpus
    from topoprof.measure.user_model import measure_user_model
    from topoprof.model.compute.measured import scaled_compute
    from topoprof.model.inputs.user_model import PRESET_SPEC, SCALED_DEPTHS
    from topoprof.model.inputs.user_record import user_compute
    from topoprof.workload.presets import PRESET_DEPTH

    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    gpu = visible_gpus() > 0
    device, batch, seq_len = ("cuda:0", 4, 1024) if gpu else ("cpu", 1, 128)
    kwargs = {"preset": args.preset, "micro_batch": batch, "seq_len": seq_len}

    def timed(**more):
        record = measure_user_model(PRESET_SPEC, device, repeats=5, kwargs={**kwargs, **more})
        return user_compute(replace(record, spec=args.preset))

    whole, scaled = [], []
    for r in range(args.rounds):
        full = timed()
        extended = scaled_compute(*(timed(n_layer=n) for n in SCALED_DEPTHS), SCALED_DEPTHS, PRESET_DEPTH[args.preset])
        whole.append(full)
        scaled.append(extended)
        print(f"round {r + 1}: forward+backward whole {full.micro_batch_time_s * 1e3:.1f} ms, scaled "
              f"{extended.micro_batch_time_s * 1e3:.1f} ms; optimizer whole {full.optimizer_time_s * 1e3:.1f} "
              f"ms, scaled {extended.optimizer_time_s * 1e3:.1f} ms", flush=True)
    ratio = (statistics.median(s.micro_batch_time_s for s in scaled)
             / statistics.median(w.micro_batch_time_s for w in whole))
    opt = (statistics.median(s.optimizer_time_s for s in scaled)
           / statistics.median(w.optimizer_time_s for w in whole))
    print(f"RESULT {args.preset} on {device}, micro-batch {batch} x {seq_len} tokens: scaled/whole forward+backward "
          f"{ratio:.3f}, optimizer {opt:.3f}; within 5 %: {'PASS' if abs(ratio - 1) <= 0.05 else 'FAIL'}")


if __name__ == "__main__":
    main()
