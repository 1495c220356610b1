"""The model against DDP measured on real GPUs by others: each published ratio of the development
set (`../shared/published/ddp-gpu-dev-set.json`) beside the model's prediction, side by side.

The set is for finding and checking mechanisms, never for fitting a constant: nothing here feeds
back into the model. Every prediction goes through `topoprof model`'s own option parsing.

1. PyTorch's DDP benchmark on a DGX-1 (8 x V100, NVLink hybrid cube-mesh), batch 32 x 224 x 224,
   fp32, SGD with momentum: T(n GPUs)/T(1 GPU) for n = 2, 4, 8 and T(1 GPU under DDP)/T(1 GPU),
   for resnet50, resnet101, resnext50_32x4d and resnext101_32x8d. The compute per micro-batch is
   the published 1-GPU time less the optimizer step the model estimates for SGD with momentum on a
   V100 (memory traffic over the datasheet bandwidth). Target: within +-3 % of each ratio.
2. Li et al. (VLDB 2020) Fig. 10a: ResNet50 on 32 V100s (4 nodes of 8), NCCL. The network
   bandwidth is bisected until `ddp_synced` at K = 1 takes the published synced iteration, then
   `ddp_no_sync` at K = 2, 4, 8 is predicted; speedup = synced per iteration / no_sync per
   iteration. Target: within +-8 %.
3. The what-if compute itself (`topoprof.model.compute.roofline` over each preset's op trace, as
   `topoprof model --gpu v100-sxm2 --precision fp32` prices it from the V100's datasheet alone)
   against the compute of entry 1: the published 1-GPU time less the optimizer step, at 32 images
   of 224 x 224 in fp32. The op trace and its pricing are not fed the published times. Target: the
   published compute inside the modelled range, as for a GPU that is here
   (`bench_whatif_compute.py --device cuda`).

    python tests/benchmarks/bench_published.py [--dev-set PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

DEV_SET = os.path.join(ROOT, "..", "shared", "published", "ddp-gpu-dev-set.json")
DGX1 = os.path.join(ROOT, "tests", "fixtures", "topo", "01_dgx1-v100-8x-nv1nv2-4mlx5-oldfmt.txt")
GPU = "v100-sxm2"
DGX1_TARGET = 0.03
FIG10_TARGET = 0.08
GPU_COLUMNS = {"2 GPUs": 2, "4 GPUs": 4, "8 GPUs": 8}


def model_inputs(args: list[str]):
    """ModelInputs exactly as `topoprof model ARGS` builds them."""
    from topoprof.commands.model import model as command
    from topoprof.model.inputs.gather import gather
    from topoprof.model.inputs.request import ModelRequest
    from topoprof.model.inputs.resolve import resolve

    opts = dict(command.make_context("model", list(args)).params)
    inputs, _ = resolve(gather(ModelRequest.from_options(opts)))
    return inputs


def sgd_optimizer_s(preset: str) -> float:
    """The optimizer step the model itself estimates for SGD with momentum on a V100."""
    from topoprof.model.strategies.resolve import resolve

    inputs = model_inputs(["--preset", preset, "--micro-batch-time", "1", "--gpu", GPU, "--precision", "fp32",
                           "--optimizer", "sgd_momentum", "--world-size", "1"])
    return resolve(inputs).optimizer_s


def _common(preset: str, compute_s: float, t_opt: float) -> list[str]:
    return ["--preset", preset, "--image-size", "224", "--micro-batch-size", "32", "--gpu", GPU,
            "--precision", "fp32", "--optimizer", "sgd_momentum", "--micro-batch-time", repr(compute_s),
            "--optimizer-time", repr(t_opt), "--no-sweep"]


def _synced(inputs) -> tuple[float, tuple[float, float] | None]:
    from topoprof.model.strategies.predict import predict

    result = predict(inputs).strategies["ddp_synced"]
    return result.step_time_s, result.range.step_time_s if result.range else None


def dgx1(entry: dict) -> list[tuple[str, float, float, tuple | None]]:
    """(label, published ratio, predicted ratio, predicted range) for every DGX-1 ratio."""
    from topoprof.model.strategies.steps import ddp_one_gpu_s

    columns, out = entry["columns"], []
    for preset, times in entry["p50_s_per_iteration"].items():
        one = times[columns.index("1 GPU no ddp")]
        t_opt = sgd_optimizer_s(preset)
        common = _common(preset, one - t_opt, t_opt)
        alone = model_inputs(common + ["--world-size", "1"])
        ddp_one = [(ddp_one_gpu_s(alone, end) + t_opt) / one for end in (None, "fast", "slow")]
        out.append((f"{preset} T(1 DDP)/T(1)", times[columns.index("1 GPU DDP")] / one, ddp_one[0], tuple(ddp_one[1:])))
        for column, n in GPU_COLUMNS.items():
            gpus = ",".join(str(g) for g in range(n))
            step, rng = _synced(model_inputs(common + ["--topology", DGX1, "--gpus", gpus]))
            ratio_range = None if rng is None else (rng[0] / one, rng[1] / one)
            out.append((f"{preset} T({n})/T(1)", times[columns.index(column)] / one, step / one, ratio_range))
    return out


def fig10a(entry: dict) -> tuple[float, list[tuple[str, float, float]]]:
    """(bisected network GB/s, [(label, published speedup, predicted speedup)])."""
    from topoprof.model.strategies.predict import predict

    lat = entry["per_iteration_latency_s"]
    one, synced = lat["1 GPU"], lat["synced every iteration"]
    t_opt = sgd_optimizer_s("resnet50")
    base = _common("resnet50", one - t_opt, t_opt) + ["--topology", DGX1, "--nodes", "4", "--gpus-per-node", "8"]

    def at(bandwidth: float, k: int, mode: str) -> float:
        inputs = model_inputs(base + ["--network-bandwidth", repr(bandwidth), "--accum", str(k)])
        return predict(inputs).strategies[mode].step_time_s

    low, high = 0.01, 1000.0  # GB/s; the synced step falls as the network gets faster
    for _ in range(60):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if at(mid, 1, "ddp_synced") > synced else (low, mid)
    bandwidth = (low * high) ** 0.5
    per_iteration_synced = at(bandwidth, 1, "ddp_synced")
    out = []
    for k, key in ((2, "no_sync, synced every 2"), (4, "every 4"), (8, "every 8")):
        published = synced / lat[key]
        predicted = per_iteration_synced / (at(bandwidth, k, "ddp_no_sync") / k)
        out.append((f"no_sync every {k}", published, predicted))
    return bandwidth, out


def whatif_compute(entry: dict) -> list[tuple[str, float, tuple[float, float, float], str]]:
    """(preset, published compute, modelled (fast, middle, slow), what bounds it) per DGX-1 model."""
    from topoprof.model.compute.datasheet import named_gpu
    from topoprof.model.compute.profile_choice import pricing_for
    from topoprof.model.compute.traced import preset_request
    from topoprof.model.inputs.traces import model_on_gpu

    columns, out = entry["columns"], []
    for preset, times in entry["p50_s_per_iteration"].items():
        compute = times[columns.index("1 GPU no ddp")] - sgd_optimizer_s(preset)
        modelled, why = model_on_gpu(preset_request(preset, 32, None, 224),
                                   pricing_for(named_gpu(GPU), "fp32", compiled=False))
        if why:
            raise SystemExit(f"{preset}: the what-if compute could not be modelled: {why}")
        assert modelled is not None
        out.append((preset, compute, modelled.seconds, modelled.detail.summary))
    return out


def _verdict(published: float, predicted: float, target: float) -> tuple[float, str]:
    err = predicted / published - 1
    return err, "ok" if abs(err) <= target else "MISS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev-set", default=DEV_SET)
    args = parser.parse_args()
    with open(args.dev_set) as f:
        entries = {e["id"]: e for e in json.load(f)["entries"]}
    misses = 0
    print(f"DGX-1, 8 x V100 (PyTorch's DDP benchmark): published vs predicted, target +-{DGX1_TARGET:.0%}")
    print(f"  {'ratio':<34}{'published':>10}{'predicted':>10}{'error':>9}  {'predicted range':<18}")
    for label, published, predicted, rng in dgx1(entries["pytorch-ddp-benchmark-dgx1-v100"]):
        err, verdict = _verdict(published, predicted, DGX1_TARGET)
        misses += verdict != "ok"
        span = "-" if rng is None else f"{rng[0]:.3f}-{rng[1]:.3f}"
        inside = "" if rng is None else ("  inside" if rng[0] <= published <= rng[1] else "  outside")
        print(f"  {label:<34}{published:>10.3f}{predicted:>10.3f}{err:>+9.1%}  {span:<18}{verdict}{inside}")
    bandwidth, rows = fig10a(entries["li2020-vldb-fig10a-no-sync-resnet50-nccl-32gpu"])
    print(f"\nLi et al. 2020 Fig. 10a, ResNet50 on 4 x 8 V100: network bisected to {bandwidth:.2f} GB/s per node "
          f"so that ddp_synced = the published synced iteration; target +-{FIG10_TARGET:.0%}")
    for label, published, predicted in rows:
        err, verdict = _verdict(published, predicted, FIG10_TARGET)
        misses += verdict != "ok"
        print(f"  {label:<34}{published:>10.3f}{predicted:>10.3f}{err:>+9.1%}  {verdict}")
    print(f"\nWhat-if compute, {GPU} fp32 from its datasheet: the published 1-GPU compute (entry 1, 32 x 224 px, "
          "less the optimizer step) vs the op trace's roofline; target: inside the modelled range")
    print(f"  {'model':<34}{'published':>10}{'middle':>10}{'error':>9}  {'modelled range':<18}")
    for preset, published, (fast, middle, slow), summary in whatif_compute(entries["pytorch-ddp-benchmark-dgx1-v100"]):
        inside = fast <= published <= slow
        misses += not inside
        print(f"  {preset:<34}{published * 1e3:>8.1f}ms{middle * 1e3:>8.1f}ms{middle / published - 1:>+9.1%}  "
              f"{f'{fast * 1e3:.1f}-{slow * 1e3:.1f} ms':<18}{'inside' if inside else 'OUTSIDE'}")
        print(f"    {summary}")
    print(f"\n{misses} of the ratios and compute times outside their target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
