"""What `probes/device_profile/profile_worker.py` measures on a GPU and on a CPU, in full and quick: the points and the
time each may take. No torch here."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    # GEMM grid (see gemm_shapes)
    tokens: tuple[int, ...]             # rows of activations: micro-batch x sequence
    widths: tuple[int, ...]             # hidden and FFN widths
    model_widths: tuple[int, ...]       # the hidden widths that sit beside a vocabulary
    vocabs: tuple[int, ...]
    vocab_tokens: tuple[int, ...]
    extra: tuple[tuple[int, int, int], ...]
    # memory-bound kinds: input tensor sizes in bytes
    memory_bytes: tuple[int, ...]
    # attention: sequence lengths, head dims; batch = sdpa_tokens // seq (at least 1), heads = sdpa_width // head dim
    sdpa_seqs: tuple[int, ...]
    sdpa_head_dims: tuple[int, ...]
    sdpa_tokens: int
    sdpa_width: int
    optimizer_params: int               # elements of the one large flat parameter
    optimizer_tensors: int              # tiny tensors for the optimizer's host cost per tensor
    budget_s: float                     # the sections together (torch's and the GPU's start-up excluded)
    block_s: float                      # a device point's block of calls lasts about this long
    point_s: float                      # a point stops adding blocks past this (at least one block)
    cpu_repeats: int = 1                # probes/device_profile/device_costs.py's repeats (a CPU only)


KB, MB = 1 << 10, 1 << 20

# The GPU grid. A Linear layer d_in -> d_out on T tokens issues three products (m, n, k of an
# (m x k) @ (k x n)): forward (T, d_out, d_in), input gradient (T, d_in, d_out), weight gradient
# (d_out, d_in, T). So the grid is two full products, tokens x widths x widths (m = tokens) and
# widths x widths x tokens (k = tokens), plus a vocabulary V beside a model width d: (T, V, d),
# (T, d, V), (V, d, T). Full products keep every cell of the interpolation measured
# (topoprof.model.compute.profile_interp): a shape between grid values reads from its cell's corners.
# - tokens 128 .. 32768 in steps of 4: one BERT sequence of 128 to a Llama micro-batch of 8 x 4096;
#   larger token counts saturate the GPU and read as the largest (clamped);
# - widths: GPT-2/BERT-base 768, GPT-2-medium/BERT-large 1024, GPT-3 XL 2048, GPT-2's FFN 3072,
#   Llama's hidden 4096, Llama-2-7B's FFN 11008, Llama-3-8B's FFN 14336 (GPT-2's 2304-wide fused
#   QKV and GPT-3 XL's 8192 FFN lie between and interpolate);
# - vocabularies: Llama-2 32000, GPT-2 50257 (odd: no dimension of 16 bytes, the slow class of
#   shapes that reads only from misaligned points), Llama-3 128256; beside d 768, 2048, 4096.
# About 620 points, each a few ms (3 blocks of ~1 ms), the largest ~0.25 s: estimated at about
# 11 s in all at 650 TFLOP/s and 10 us of host time per call, within the budget's GEMM share
# (points past the share are skipped, with the reason).
GPU_FULL = Plan(
    tokens=(128, 512, 2048, 8192, 32768), widths=(768, 1024, 2048, 3072, 4096, 11008, 14336),
    model_widths=(768, 2048, 4096), vocabs=(32000, 50257, 128256), vocab_tokens=(128, 512, 2048, 8192, 32768),
    extra=(), memory_bytes=(256 * KB, 1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB),
    sdpa_seqs=(128, 256, 512, 1024, 2048, 4096, 8192), sdpa_head_dims=(64, 128), sdpa_tokens=16384,
    sdpa_width=1024, optimizer_params=64 << 20, optimizer_tensors=1000,
    budget_s=45.0, block_s=1e-3, point_s=0.05)
# Quick: the corners of the same grid (about 60 GEMM points) and fewer sizes and lengths.
GPU_QUICK = Plan(
    tokens=(512, 8192), widths=(768, 4096, 14336), model_widths=(768, 4096), vocabs=(50257, 128256),
    vocab_tokens=(512, 8192), extra=(), memory_bytes=(256 * KB, 4 * MB, 64 * MB),
    sdpa_seqs=(128, 1024, 8192), sdpa_head_dims=(64, 128), sdpa_tokens=16384, sdpa_width=1024,
    optimizer_params=16 << 20, optimizer_tensors=500, budget_s=10.0, block_s=1e-3, point_s=0.03)
# The CPU (fp32, a few cores): the shapes of the CPU benchmark (tests/benchmarks/
# bench_whatif_compute.py: GPT-2 and BERT at 64-512 tokens, width 768, FFN 3072, GPT-2's
# vocabulary) and device_costs.py's 2048^3 peak shape. Memory sizes stay below glibc's 32 MiB
# mmap threshold so that no output lands on fresh pages (that cost is the `cpu` section's own).
CPU_FULL = Plan(
    tokens=(64, 256, 1024), widths=(768, 3072), model_widths=(768,), vocabs=(50257,), vocab_tokens=(64, 256),
    extra=((2048, 2048, 2048),), memory_bytes=(256 * KB, 4 * MB, 12 * MB),
    sdpa_seqs=(64, 256, 1024), sdpa_head_dims=(64,), sdpa_tokens=1024, sdpa_width=256,
    optimizer_params=4 << 20, optimizer_tensors=200, budget_s=60.0, block_s=5e-3, point_s=0.3, cpu_repeats=3)
CPU_QUICK = Plan(
    tokens=(64, 256), widths=(256, 768), model_widths=(256,), vocabs=(50257,), vocab_tokens=(64,),
    extra=(), memory_bytes=(256 * KB, 4 * MB), sdpa_seqs=(64, 256), sdpa_head_dims=(64,), sdpa_tokens=256,
    sdpa_width=256, optimizer_params=1 << 20, optimizer_tensors=100, budget_s=8.0, block_s=5e-3, point_s=0.05,
    cpu_repeats=1)
PLANS = {("cuda", False): GPU_FULL, ("cuda", True): GPU_QUICK, ("cpu", False): CPU_FULL, ("cpu", True): CPU_QUICK}


def gemm_shapes(plan: Plan) -> list[tuple[int, int, int]]:
    """Every (m, n, k) of the plan's grid (see GPU_FULL), the cheapest first."""
    shapes = set(plan.extra)
    for t in plan.tokens:
        for a in plan.widths:
            for b in plan.widths:
                shapes |= {(t, a, b), (a, b, t)}
    for t in plan.vocab_tokens:
        for v in plan.vocabs:
            for d in plan.model_widths:
                shapes |= {(t, v, d), (t, d, v), (v, d, t)}
    return sorted(shapes, key=lambda s: (s[0] * s[1] * s[2], s))


def sdpa_cases(plan: Plan) -> list[tuple[int, int, int, int, bool]]:
    """(batch, heads, seq, head dim, causal) of every attention point."""
    return [(max(1, plan.sdpa_tokens // t), max(1, plan.sdpa_width // d), t, d, causal)
            for t in plan.sdpa_seqs for d in plan.sdpa_head_dims for causal in (True, False)]
