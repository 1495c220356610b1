"""Single-GPU optimizer step: topoprof's prediction vs a plain eager training loop written
without topoprof, in the same run (GPU only).

For gpt2, gpt2-medium and bert-base at 1, 4 and 16 sequences per micro-batch (1024 tokens each;
bert-base reads at most 512, so 512 there), K = 4 micro-batches and one optimizer step:
- predicted: what `topoprof model --preset P --world-size 1 --micro-batch-size B --tokens B*T
  --accum 4` predicts for `single` (the preset timed on the GPU by the model's own worker, bf16
  autocast, fused AdamW), through the command's own option parsing, in this process;
- measured: a loop over `torch.nn.TransformerEncoderLayer` blocks of the same width, depth, heads
  and vocabulary (pre-norm and causal for the GPT-2 shapes, post-norm for BERT), bf16 autocast,
  fp32 master weights, fused AdamW; median of STEPS steps after WARMUP_STEPS.
Each row also prints the prediction's own timing: how many passes, and their spread.
Target: every predicted step within 10 % of the measured one.

The whole run keeps to `--budget` seconds (default 150, for a lent GPU's short time): a row that
would start past it is not run, and the result says which rows were left out.

    python tests/benchmarks/bench_gpu_compute.py [--budget SECONDS]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

ACCUM = 4
WARMUP_STEPS, STEPS = 2, 5
# name: (layers, width, heads, vocabulary, positions, causal)
SHAPES = {"gpt2": (12, 768, 12, 50257, 1024, True), "gpt2-medium": (24, 1024, 16, 50257, 1024, True),
          "bert-base": (12, 768, 12, 30522, 512, False)}
BATCHES = (1, 4, 16)


def plain_loop_step_s(name: str, batch: int) -> float:
    import torch
    import torch.nn as nn

    layers, width, heads, vocab, positions, causal = SHAPES[name]
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(positions, width)
            block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=causal)
            self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)

        def forward(self, x):
            h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device) if causal else None
            h = self.norm(self.blocks(h, mask=mask, is_causal=causal))
            return h @ self.tok.weight.t()

    net = Net().cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
    data = torch.randint(0, vocab, (batch, positions), device="cuda")
    times = []
    for step in range(WARMUP_STEPS + STEPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(ACCUM):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(data)
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), data[:, 1:].flatten()) / ACCUM
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= WARMUP_STEPS:
            times.append(time.perf_counter() - t0)
    del net, opt, data
    torch.cuda.empty_cache()
    return statistics.median(times)


def predicted(name: str, batch: int) -> tuple[float, str]:
    """(the `single` step `topoprof model` predicts, where its compute came from)."""
    from topoprof.commands.model import model as command
    from topoprof.model.inputs.gather import gather
    from topoprof.model.inputs.request import ModelRequest
    from topoprof.model.inputs.resolve import resolve
    from topoprof.model.strategies.predict import predict

    args = ["--preset", name, "--world-size", "1", "--micro-batch-size", str(batch),
            "--tokens", str(batch * SHAPES[name][4]), "--accum", str(ACCUM), "--no-sweep"]
    opts = dict(command.make_context("model", args).params)
    inputs, _ = resolve(gather(ModelRequest.from_options(opts)))
    source = inputs.compute.origin("micro_batch_time_s")
    timing = re.search(r"\d+ repeats, median \(spread [^)]*\)", source)
    return predict(inputs).strategies["single"].step_time_s, timing.group(0) if timing else source


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=150.0, help="seconds the whole run may take")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("RESULT skipped: no CUDA GPU here (this benchmark compares GPU timings)")
        return
    start, worst, longest, left_out = time.perf_counter(), 0.0, 0.0, []
    for name in SHAPES:
        for batch in BATCHES:
            row_start = time.perf_counter()
            if row_start - start + longest > args.budget:
                left_out.append(f"{name} x{batch}")
                continue
            measured = plain_loop_step_s(name, batch)
            step_s, timing = predicted(name, batch)
            error = step_s / measured - 1
            worst = max(worst, abs(error))
            longest = max(longest, time.perf_counter() - row_start)
            print(f"{name:<12} micro-batch {batch:>2}: measured {measured * 1e3:8.1f} ms, predicted "
                  f"{step_s * 1e3:8.1f} ms ({100 * error:+.1f} %); compute timed over {timing}; "
                  f"row {time.perf_counter() - row_start:.0f} s", flush=True)
    rows = len(SHAPES) * len(BATCHES) - len(left_out)
    skipped = f"; left out to keep within {args.budget:.0f} s: {', '.join(left_out)}" if left_out else ""
    verdict = "PASS" if worst <= 0.10 and rows else "FAIL"
    print(f"RESULT on {torch.cuda.get_device_name(0)}: {rows} rows in {time.perf_counter() - start:.0f} s, worst "
          f"|error| {100 * worst:.1f} %; within 10 %: {verdict}{skipped}")


if __name__ == "__main__":
    main()
