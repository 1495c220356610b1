"""Single-GPU optimizer step: topoprof's prediction vs a plain eager training loop written
without topoprof, in the same run (GPU only).

For gpt2, gpt2-medium and bert-base at 1, 4 and 16 sequences per micro-batch (1024 tokens each;
bert-base reads at most 512, so 512 there), K = 4 micro-batches and one optimizer step:
- predicted: `topoprof model --preset P --world-size 1 --micro-batch-size B --tokens B*T --accum 4
  --json`, its `single` step time (the preset timed on the GPU, bf16 autocast, fused AdamW);
- measured: a loop over `torch.nn.TransformerEncoderLayer` blocks of the same width, depth, heads
  and vocabulary (pre-norm and causal for the GPT-2 shapes, post-norm for BERT), bf16 autocast,
  fp32 master weights, fused AdamW; median of 10 steps after 3 warm-up steps.
Target: every predicted step within 10 % of the measured one.

    python tests/benchmarks/bench_gpu_compute.py
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACCUM = 4
# name: (layers, width, heads, vocabulary, positions, causal)
SHAPES = {"gpt2": (12, 768, 12, 50257, 1024, True), "gpt2-medium": (24, 1024, 16, 50257, 1024, True),
          "bert-base": (12, 768, 12, 30522, 512, False)}


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
    for step in range(13):
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
        if step >= 3:
            times.append(time.perf_counter() - t0)
    del net, opt
    torch.cuda.empty_cache()
    return statistics.median(times)


def predicted_step_s(name: str, batch: int) -> float:
    tokens = batch * SHAPES[name][4]
    proc = subprocess.run([sys.executable, "-m", "topoprof", "model", "--preset", name, "--world-size", "1",
                           "--micro-batch-size", str(batch), "--tokens", str(tokens), "--accum", str(ACCUM),
                           "--no-sweep", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-800:])
    return json.loads(proc.stdout)["strategies"]["single"]["step_time_s"]


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("RESULT skipped: no CUDA GPU here (this benchmark compares GPU timings)")
        return
    worst = 0.0
    for name in SHAPES:
        for batch in (1, 4, 16):
            measured = plain_loop_step_s(name, batch)
            predicted = predicted_step_s(name, batch)
            error = predicted / measured - 1
            worst = max(worst, abs(error))
            print(f"{name:<12} micro-batch {batch:>2}: measured {measured * 1e3:8.1f} ms, predicted "
                  f"{predicted * 1e3:8.1f} ms ({100 * error:+.1f} %)", flush=True)
    print(f"RESULT on {torch.cuda.get_device_name(0)}: worst |error| {100 * worst:.1f} %; within 10 %: "
          f"{'PASS' if worst <= 0.10 else 'FAIL'}")


if __name__ == "__main__":
    main()
