"""A training step's memory and time on this GPU, beside what `topoprof model` predicts for it.

For each case (presets, the Hugging Face fixtures as committed, and the fixtures' architectures at
published sizes), at K = 1 and 2 micro-batches per step:

- measured on cuda:0: the module built there with fp32 weights, each micro-batch's forward under
  bf16 autocast and its backward, then torch's default AdamW (foreach on CUDA, the optimizer the
  prediction's transient assumes), `zero_grad(set_to_none=True)` before each step. One warm-up
  step puts the optimizer's state and the allocator's blocks in place; then
  `reset_peak_memory_stats` and STEPS steps: `max_memory_allocated`, `max_memory_reserved`, and
  the forward + backward seconds per micro-batch (synchronized wall time, the median step);
- predicted: `python -m topoprof model ... --gpu <this GPU's CUDA name> --world-size 1 --accum K
  --json` for the same shape, on this machine's torch: single's allocated peak (`peak_gb`), its
  reserved range (`reserved_gb`) and the micro-batch's compute (`per_micro_batch.micro_batch_s`),
  priced from the datasheet, and with `--gpu-profile FILE` also from that profile (at K = 1).

The predictions run first, in parallel on the CPU; the GPU steps after them, alone, so that no
prediction takes host time from a timed step. Between cases the caching allocator is emptied.
Nothing is asserted: the ratios are printed and written (`--out`), for the record under reports/.

    python tests/benchmarks/bench_gpu_memory.py --out gpu_memory.json [--gpu-profile profile.json]
    python tests/benchmarks/bench_gpu_memory.py --predict-only   # no GPU: the predictions alone
    python tests/benchmarks/bench_gpu_memory.py --measured OLD.json --out NEW.json
        # no GPU: this tree's predictions beside the measurements an earlier run wrote
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf")
STEPS = 3
ACCUMULATION = (1, 2)

# The fixtures' architectures at published sizes (each model card's config.json), layers cut
# where the full model's weights and AdamW state (16 bytes a parameter) would not fit one 80 GB GPU.
PUBLISHED = {
    "gpt2-124m": ("gpt2", {"n_embd": 768, "n_inner": None, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                           "n_positions": 1024, "n_ctx": 1024}),  # openai-community/gpt2
    "bert-base": ("bert", {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                           "num_attention_heads": 12, "vocab_size": 30522,
                           "max_position_embeddings": 512}),  # google-bert/bert-base-uncased
    "qwen2-0.5b": ("qwen2", {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                             "max_position_embeddings": 32768, "tie_word_embeddings": True}),  # Qwen/Qwen2-0.5B
    "mistral-7b-4l": ("mistral", {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 4,
                                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                                  "max_position_embeddings": 32768,
                                  "tie_word_embeddings": False}),  # mistralai/Mistral-7B-v0.1, 4 of 32 layers
    "llama3.1-8b-4l": ("llama31_8b", {"num_hidden_layers": 4}),  # the committed config, 4 of 32 layers
}


@dataclass(frozen=True)
class Case:
    name: str
    micro_batch: int
    seq_len: int
    preset: str | None = None  # a preset's name, else a Hugging Face config folder
    hf_dir: str | None = None

    def model_args(self) -> list[str]:
        model = ["--preset", self.preset] if self.preset else ["--model", f"hf:{self.hf_dir}"]
        return [*model, "--micro-batch-size", str(self.micro_batch), "--tokens", str(self.micro_batch * self.seq_len)]

    def build(self, device: str):
        from topoprof.zoo.user_callable import call_user_callable

        if self.preset:
            return call_user_callable("topoprof.zoo.preset_modules:build",
                                      {"preset": self.preset, "micro_batch": self.micro_batch,
                                       "seq_len": self.seq_len})
        from topoprof.zoo.hf_models import build_hf

        return build_hf(self.hf_dir, micro_batch=self.micro_batch, seq_len=self.seq_len, device=device)


def published_config(folder: str, name: str) -> str:
    """A config folder of `name` in PUBLISHED: its fixture's config with the published sizes."""
    fixture, sizes = PUBLISHED[name]
    config = json.load(open(os.path.join(FIXTURES, fixture, "config.json")))
    config.update(sizes)
    path = os.path.join(folder, name)
    os.makedirs(path, exist_ok=True)
    json.dump(config, open(os.path.join(path, "config.json"), "w"), indent=1)
    return path


def cases(folder: str) -> list[Case]:
    tiny = [Case(f"fixture {name}", 2, 64, hf_dir=os.path.join(FIXTURES, name))
            for name in ("llama", "qwen2", "mistral", "gpt2", "bert")]
    shapes = {"gpt2-124m": (4, 1024), "bert-base": (8, 512), "qwen2-0.5b": (2, 2048), "mistral-7b-4l": (1, 2048),
              "llama3.1-8b-4l": (1, 2048)}
    published = [Case(f"hf {name}", *shapes[name], hf_dir=published_config(folder, name)) for name in PUBLISHED]
    presets = [Case("preset gpt2", 4, 1024, preset="gpt2"), Case("preset gpt2-medium", 4, 1024, preset="gpt2-medium")]
    return presets + published + tiny


def predict(case: Case, k: int, gpu: str, profile: str | None) -> dict:
    """`topoprof model`'s single-GPU prediction of the case at K, as its JSON gives it."""
    cmd = [sys.executable, "-m", "topoprof", "model", *case.model_args(), "--gpu", gpu, "--world-size", "1",
           "--accum", str(k), "--json", *(["--gpu-profile", profile] if profile else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1][:300]}
    doc = json.loads(proc.stdout)
    memory = doc["strategies"]["single"]["memory"]
    return {"peak_gb": memory["peak_gb"], "reserved_gb": memory["reserved_gb"], "peak_at": memory.get("peak_at"),
            "micro_batch_s": doc["per_micro_batch"]["micro_batch_s"],
            "optimizer_s": doc["per_micro_batch"]["optimizer_s"]}


def measure(case: Case, k: int, device: str = "cuda:0") -> dict:
    """One warm-up step and STEPS measured steps of K micro-batches on `device`."""
    import torch

    from topoprof.zoo.user_callable import to_device, user_loss

    torch.cuda.empty_cache()
    module, batch, loss_fn = case.build(device)
    module, batch = module.to(device), to_device(batch, device)
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-4)

    def step() -> float:
        module.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(k):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = user_loss(module, batch, loss_fn)
            (loss / k).backward()
        torch.cuda.synchronize(device)
        passes = time.perf_counter() - start
        opt.step()
        return passes / k

    try:
        step()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        times = [step() for _ in range(STEPS)]
        torch.cuda.synchronize(device)
        return {"allocated_gb": torch.cuda.max_memory_allocated(device) / 1e9,
                "reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9,
                "micro_batch_s": statistics.median(times)}
    except torch.cuda.OutOfMemoryError as err:
        return {"error": f"out of memory: {str(err).splitlines()[0][:200]}"}


def measure_alone(case: Case, k: int) -> dict:
    """`measure`, its module and optimizer freed and the allocator's cache emptied after it."""
    import torch

    try:
        return measure(case, k)
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def workspace_bytes(device: str = "cuda:0") -> dict:
    """What the process's first matmuls leave allocated beyond their tensors: the cuBLAS
    workspace torch takes from its caching allocator, one per handle and stream
    (aten/src/ATen/cuda/CublasHandlePool.cpp); the backward runs on autograd's device thread,
    whose handle is its own. Read before any case runs."""
    import torch

    def grown(run) -> int:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        kept = run()
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device) - before - sum(t.numel() * t.element_size() for t in kept)

    a = torch.randn(256, 256, device=device, requires_grad=True)
    b = torch.randn(256, 256, device=device)
    out = {"forward_fp32": grown(lambda: [a @ b])}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out["forward_bf16"] = grown(lambda: [a @ b])
    loss = (a @ b).sum()
    out["backward_thread"] = grown(lambda: [loss.backward(), a.grad][1:])
    return out


def _recorded(path: str) -> dict:
    """(case, K) -> the measurement an earlier run wrote."""
    return {(r["case"], r["k"]): r["measured"] for r in json.load(open(path))["rows"]}


def _ratio(a, b) -> str:
    return f"{a / b:6.3f}" if a and b else "     -"


def table(rows: list[dict]) -> str:
    head = (f"{'case':<22} {'K':>2} {'alloc GB':>9} {'pred':>9} {'ratio':>6}  {'reserved GB':>11} {'pred range':>17}"
            f"  {'mb ms':>8} {'pred':>8} {'ratio':>6} {'profiled':>8} {'ratio':>6}")
    lines = [head]
    for r in rows:
        m, p, q = r["measured"], r["predicted"], r.get("profiled") or {}
        if "error" in m or "error" in p:
            lines.append(f"{r['case']:<22} {r['k']:>2}  {m.get('error') or p.get('error')}")
            continue
        lo, hi = p["reserved_gb"]
        lines.append(f"{r['case']:<22} {r['k']:>2} {m['allocated_gb']:9.3f} {p['peak_gb']:9.3f} "
                     f"{_ratio(p['peak_gb'], m['allocated_gb'])}  {m['reserved_gb']:11.3f} {lo:8.3f}-{hi:8.3f}  "
                     f"{m['micro_batch_s'] * 1e3:8.2f} {p['micro_batch_s'] * 1e3:8.2f} "
                     f"{_ratio(p['micro_batch_s'], m['micro_batch_s'])} "
                     f"{(q.get('micro_batch_s') or 0) * 1e3:8.2f} {_ratio(q.get('micro_batch_s'), m['micro_batch_s'])}")
    lines.append("ratio: predicted / measured")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--gpu-profile", help="also predict the compute from this device profile")
    parser.add_argument("--gpu", help="the GPU to predict for (default: cuda:0's name)")
    parser.add_argument("--predict-only", action="store_true", help="no GPU: the predictions alone")
    parser.add_argument("--measured", help="no GPU: the measurements of an earlier run's --out JSON, beside this "
                                           "tree's predictions")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    args = parser.parse_args()
    import torch

    recorded = _recorded(args.measured) if args.measured else None
    if recorded is not None:
        args.predict_only = True
    if not args.predict_only and not torch.cuda.is_available():
        print("bench_gpu_memory: no CUDA device here (--predict-only runs the predictions alone)", file=sys.stderr)
        return 2
    workspace = workspace_bytes() if not args.predict_only else None
    print(f"cuBLAS workspace (bytes allocated by the first matmuls beyond their tensors): {workspace}", flush=True)
    gpu = args.gpu or (json.load(open(args.measured))["machine"]["gpu"] if args.measured else
                       torch.cuda.get_device_name(0) if torch.cuda.is_available() else "H100 SXM")
    with tempfile.TemporaryDirectory() as folder:
        todo = [(c, k) for c in cases(folder) for k in ACCUMULATION]
        print(f"{len(todo)} predictions for {gpu}, {args.jobs} at a time", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            predicted = list(pool.map(lambda ck: predict(*ck, gpu, None), todo))
            # the compute does not depend on K: the profile's pricing once per case
            profiled = [pool.submit(predict, c, k, gpu, args.gpu_profile) if args.gpu_profile and k == 1 else None
                        for c, k in todo]
            profiled = [f.result() if f else None for f in profiled]
        rows = []
        for (case, k), p, q in zip(todo, predicted, profiled):
            m = (recorded.get((case.name, k), {"error": "not in " + args.measured}) if recorded is not None
                 else {"error": "not measured (--predict-only)"} if args.predict_only else measure_alone(case, k))
            rows.append({"case": case.name, "k": k, "micro_batch": case.micro_batch, "seq_len": case.seq_len,
                         "measured": m, "predicted": p, "profiled": q})
            print(f"{case.name} K={k}: measured {m}; predicted {p}", flush=True)
    facts = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda, "steps": STEPS,
             "profile": args.gpu_profile, "workspace_bytes": workspace}
    if args.measured:  # the machine that measured, and this one that predicted
        facts = {"predicted_here": facts, "measured": json.load(open(args.measured))["machine"]}
    print(table(rows))
    if args.out:
        json.dump({"machine": facts, "rows": rows}, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
