"""The what-if compute on real GPUs (`bench_whatif_compute.py --device cuda` and `--committed`):
GPU_SHAPES traced for the GPU in bf16 and priced from a device profile, beside times measured on
such a GPU, per shape measured / predicted middle / range / error, and the targets.

- `--device cuda`: this GPU's profile measured first in the same run (`topoprof profile --quick`'s
  probe), then every shape priced with it and timed here (forward + backward under bf16 autocast,
  the fastest of REPEATS after a warm-up, the device synchronized);
- `--committed [FILE]`: the times measured on an NVIDIA H200 and committed in
  reports/gpu-nvidia-h200-20261126/bench_whatif_compute.txt (read from that file, each row by its
  shape's name), priced with the profile shipped for that GPU (shared/gpu-facts converted,
  `topoprof/model/compute/profiles/`), chosen as `model --gpu` chooses it.
Targets (printed, not asserted): every shape within TARGET_EACH of the predicted middle, the
median within TARGET_MEDIAN, the modelled range holding every measurement.
"""
from __future__ import annotations

import os
import re
import statistics

from topoprof.specs.traced_pass import TraceTarget

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMITTED = os.path.join(ROOT, "reports", "gpu-nvidia-h200-20261126", "bench_whatif_compute.txt")
TARGET_EACH = 0.25
TARGET_MEDIAN = 0.12
_ROW = re.compile(r"^(?P<shape>\S.*?)\s+(?P<kernels>\d+)\s+(?P<gflop>[\d.]+)\s+(?P<measured>[\d.]+)\s+[\d.]+\s")
_GPU = re.compile(r", (?P<cuda_name>[^,]+?) as (?P<gpu>[\w.-]+);")


def committed_rows(path: str, shapes) -> tuple[str, dict[str, float]]:
    """(the datasheet name of the GPU it ran on, {shape name: measured seconds}) from a committed
    `--device cuda` output; the shapes are GPU_SHAPES' names (`describe`)."""
    with open(path) as f:
        lines = f.read().splitlines()
    gpu = next((m.group("gpu") for m in map(_GPU.search, lines[:3]) if m), None)
    if gpu is None:
        raise SystemExit(f"{path}: no '<CUDA name> as <GPU>;' in its header")
    measured = {}
    for line in lines:
        m = _ROW.match(line)
        if m and m.group("shape").strip() in shapes:
            measured[m.group("shape").strip()] = float(m.group("measured")) / 1e3
    if not measured:
        raise SystemExit(f"{path}: no row of a known shape ({', '.join(shapes)})")
    return gpu, measured


def header(versions: str, cuda_name: str, repeats: int, priced: str) -> str:
    """The first line of a `--device cuda` output, as `committed_rows` reads it back: the GPU's
    CUDA name and its datasheet name ("<CUDA name> as <GPU>;")."""
    from topoprof.model.compute.datasheet import lookup_gpu

    spec = lookup_gpu(cuda_name)
    return (f"# {versions}, {cuda_name} as {spec.name if spec else 'unknown'}; bf16 autocast, forward + backward, "
            f"fastest of {repeats}; priced: {priced}")


def print_rows(rows: list[tuple[str, float, object]]) -> None:
    """rows: (shape, measured seconds, Roofline). The table, then the targets."""
    print(f"{'shape':<30}{'kernels':>8}{'GFLOP':>8}{'measured ms':>13}{'predicted ms':>14}{'range ms':>18}"
          f"{'error':>9}{'in range':>10}   bound")
    errors, inside = [], 0
    for name, measured, result in rows:
        fast, middle, slow = result.seconds
        error = measured / middle - 1
        within = fast <= measured <= slow
        errors.append(abs(error))
        inside += within
        print(f"{name:<30}{result.kernels:>8}{result.flops / 1e9:>8.1f}{measured * 1e3:>13.2f}{middle * 1e3:>14.2f}"
              f"{f'{fast * 1e3:.2f}-{slow * 1e3:.2f}':>18}{100 * error:>+8.1f}%{'yes' if within else 'NO':>10}   "
              f"{'host' if result.host_bound else 'device'}", flush=True)
    each = sum(e <= TARGET_EACH for e in errors)
    median = statistics.median(errors)
    verdicts = [("every shape within", f"{100 * TARGET_EACH:.0f} %", each == len(errors), f"{each} of {len(errors)}"),
                ("median within", f"{100 * TARGET_MEDIAN:.0f} %", median <= TARGET_MEDIAN, f"{100 * median:.1f} %"),
                ("range holds every measurement", "", inside == len(errors), f"{inside} of {len(errors)}")]
    for what, target, ok, got in verdicts:
        print(f"TARGET {' '.join(filter(None, (what, target)))}: {got}: {'PASS' if ok else 'FAIL'}")
    print(f"RESULT |measured/middle - 1| median {100 * median:.1f} %, worst {100 * max(errors):.1f} %; "
          f"{inside} of {len(errors)} inside the range: {'PASS' if all(v[2] for v in verdicts) else 'FAIL'}")


def main_committed(path: str, shapes, traced, describe) -> None:
    from topoprof.model.compute.datasheet import named_gpu
    from topoprof.model.compute.profile_choice import pricer_for
    from topoprof.model.compute.roofline import roofline

    names = {describe(p, kw): (p, kw) for p, kw in shapes}
    gpu, measured = committed_rows(path, names)
    pricer, notes = pricer_for(named_gpu(gpu), "bf16", False)
    print(f"# measured: {os.path.relpath(path, ROOT)} ({gpu}); priced: {pricer.name}")
    for line in pricer.basis_lines()[:2]:
        print(f"# {line}")
    for note in notes:
        print(f"# note: {note}")
    rows = []
    for name, seconds in measured.items():
        preset, kwargs = names[name]
        rows.append((name, seconds, roofline(traced(preset, kwargs, TraceTarget("cuda", "bf16")), pricer)))
    print_rows(rows)


def main_cuda(shapes, traced, describe, measured_on_gpu_s, repeats: int) -> None:
    import torch

    from topoprof.model.compute.profile import profile_from_dict
    from topoprof.model.compute.profile_choice import pricer_for
    from topoprof.model.compute.roofline import roofline
    from topoprof.probes.device_profile.profile_worker import measure_profile

    name = torch.cuda.get_device_name(0)
    doc = measure_profile("cuda", quick=True, on_progress=lambda line: print(f"# profile: {line}", flush=True))
    profile = profile_from_dict(doc, "this GPU's quick profile")
    pricer, _ = pricer_for(None, "bf16", False, profile, "measured in this run (quick)")
    print(header(f"torch {torch.__version__}, CUDA {torch.version.cuda}", name, repeats,
                 f"{pricer.name}, its profile measured in this run in {doc['seconds']:.1f} s"))
    rows = []
    for preset, kwargs in shapes:
        result = roofline(traced(preset, kwargs, TraceTarget("cuda", "bf16")), pricer)
        rows.append((describe(preset, kwargs), measured_on_gpu_s(preset, kwargs), result))
    print_rows(rows)
