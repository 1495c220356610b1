"""Predictions inside a scan: the user's model (or a default set of sizes) on the measured links.

Communication comes from the all-reduce fit the scan just measured on these ranks. Compute per
micro-batch comes, in order of preference, from --micro-batch-time (measured by the user); from
the user's --model timed here; on a GPU, from the preset (or, for the default sizes, the real
architecture of that size) built and timed on GPU0; from the scan's own calibration, as the FLOP
rate this device reached on the synthetic model applied to the model's FLOPs; or from the GPU's
datasheet figures as a what-if range: priced from the model's own ops (`topoprof.model.compute.traced`),
or where they cannot be, the datasheet peak x a utilization range. A compute timed on GPU0 has the
range priced from its ops beside it, so that every GPU scan also checks the what-if. On a GPU the
scan measures the GPU's own quick device profile first (`ScanOptions.device_profile`), and the
ops are priced with it, as that GPU; elsewhere with the profiles shipped with topoprof.
"""
from __future__ import annotations

from dataclasses import replace

from topoprof.errors import InputError
from topoprof.model.comm.collectives import HierarchicalComm, RingComm
from topoprof.model.comm.links import measured_comm
from topoprof.model.compute.datasheet import named_gpu
from topoprof.model.compute.measured import MeasuredCompute
from topoprof.model.compute.modelled import ModelledCompute
from topoprof.model.compute.profile import profile_from_dict
from topoprof.model.compute.profile_choice import Pricing, pricing_for
from topoprof.model.compute.timing import Compute
from topoprof.model.compute.traced import params_request, preset_request, priced
from topoprof.model.inputs.request import parse_count
from topoprof.model.inputs.traces import model_on_gpu
from topoprof.model.inputs.user_model import measure_preset
from topoprof.model.inputs.user_record import trained_micro_batch, user_compute, user_layout
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.model_plan import plan_model
from topoprof.model.strategies.model_report import model_payload
from topoprof.model.strategies.search import search, searched_strategies
from topoprof.model.strategies.whatif import what_ifs
from topoprof.workload.presets import context_sequences, is_vision

DEFAULT_MODELS = ("125M", "1.3B", "7B")   # the sizes people ask about most
DEFAULT_TOKENS = 2048                     # tokens per GPU per micro-batch when none is given
# On a GPU the default sizes are real architectures, built and timed there: GPT-3 Small's 125M
# has GPT-2's shape, GPT-3 XL is the 1.3B (topoprof.workload.presets), LLaMA the 7B.
SIZE_PRESETS = {"125M": "gpt2", "1.3B": "gpt3-xl", "7B": "llama-7b"}


PROFILE_WHERE = "this scan's device profile (topoprof profile --quick on this GPU)"


def scan_profile(opts):
    """The device profile this scan measured on its GPU, or None."""
    doc = getattr(opts, "device_profile", None)
    if not doc:
        return None

    return profile_from_dict(doc, PROFILE_WHERE)


def _pricing(opts, gpu_name: str | None) -> Pricing:
    """How a scan prices a model's ops (bf16, eager): this scan's GPU as its own profile measured
    it, or the GPU named with the shipped profiles."""
    profile = scan_profile(opts)
    if profile is not None:
        return pricing_for(None, "bf16", False, profile, PROFILE_WHERE)
    return pricing_for(named_gpu(gpu_name), "bf16", False)


def timed_preset(opts, size: str | None) -> str | None:
    """The preset a GPU scan builds and times for this model, or None (the user's own model is
    timed by --model; without a GPU compute comes from the calibration)."""
    if opts.backend != "nccl" or opts.user_record is not None or opts.micro_batch_time_s is not None:
        return None
    return opts.preset.strip().lower() if opts.preset else SIZE_PRESETS.get(size or "")


def _workload(opts, size: str | None):
    # an image model's FLOPs count its micro-batch's images (`Workload`), not tokens
    tokens = None if is_vision(opts.preset) else opts.tokens or DEFAULT_TOKENS
    kw = dict(micro_batch_size=opts.micro_batch_size, tokens_per_micro_batch=tokens, checkpointing=opts.checkpointing)
    if opts.user_record is not None:  # at the samples of the example batch it was timed and trained on
        layout = user_layout(opts.user_record)
        samples = trained_micro_batch(opts.user_record)
        return (Workload(layout, **{**kw, "micro_batch_size": samples, "tokens_per_micro_batch": opts.tokens},
                         measured_memory=opts.user_record.memory), layout.name)
    if opts.preset:
        return Workload.from_preset(opts.preset, opts.image_size, **kw), opts.preset
    preset = timed_preset(opts, size)
    if preset is not None:
        return Workload.from_preset(preset, **kw), f"{size} params ({preset})"
    assert size is not None  # no preset: a size
    n = parse_count(size)
    return Workload.from_params(n, **kw), f"{size} params"


def _compute(opts, workload, calibration: dict | None, vopts, gpu_name: str | None, size: str | None = None,
             time_on_gpu: bool = True):
    """Compute for one model, with the inputs carried from the scan's calibration marked as such."""
    compute, source = _compute_from(opts, workload, calibration, vopts, gpu_name, size, time_on_gpu)
    carried = {k for k in CARRIED if (calibration or {}).get(k) is not None}
    return replace(compute, calibrated=tuple(sorted(set(compute.calibrated) | carried))), source


# What a scan's calibration (`validate` on these ranks) carries to every model it predicts.
CARRIED = ("compute_slowdown_during_comm", "comm_slowdown_during_compute", "memory_bandwidth_gbps",
           "ddp_copy_bandwidth_gbps", "ddp_kernel_s", "rank_speed_spread", "rank_jitter", "comm_slowdown_by_size")


def _compute_from(opts, workload, calibration: dict | None, vopts, gpu_name: str | None, size: str | None = None,
                  time_on_gpu: bool = True):
    extra = {}
    if calibration:
        # The machine's interference and memory, which hold for any model; DDP's per-kernel cost,
        # which the model multiplies by this model's tensors and buckets; the ranks' spreads, as
        # shares of compute. DDP's per-micro-batch hook cost belongs to the calibration model's
        # tensors and is not carried over; nor is the ranks' count whose slowest the calibration's
        # compute is (a model timed here ran on one rank).
        for key in CARRIED[:-1]:
            if calibration.get(key) is not None:
                extra[key] = calibration[key]
        if calibration.get("comm_slowdown_by_size"):
            extra["comm_slowdown_by_size"] = tuple(tuple(p) for p in calibration["comm_slowdown_by_size"])
    if opts.micro_batch_time_s is not None:
        return Compute(micro_batch_time_s=opts.micro_batch_time_s, gpu=gpu_name, **extra), "given"
    if opts.user_record is not None:
        measured = user_compute(opts.user_record)
        beside: ModelledCompute | None = None
        why: str | None = None
        if opts.user_record.device.startswith("cuda") and gpu_name:  # measured beats modelled; the gap is shown
            beside, why = priced(opts.user_record.op_trace, _pricing(opts, gpu_name))
        return _measured_compute(measured, measured.source, gpu_name, extra, beside, why)
    preset = timed_preset(opts, size) if time_on_gpu else None
    if preset is not None:
        try:
            return _time_on_gpu(preset, opts, gpu_name, extra)
        except Exception as err:  # noqa: BLE001 - the datasheet or calibration still predicts
            failed = f"timing {preset} on GPU0 failed ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
            compute, source = _compute(opts, workload, calibration, vopts, gpu_name, size, time_on_gpu=False)
            return compute, failed + source
    if calibration and vopts is not None:
        layout = vopts.spec.layout()
        tokens = vopts.micro_batch * vopts.spec.seq_len
        rate = layout.train_flops_per_token * tokens / calibration["micro_batch_time_s"]
        # the rate is the calibration's, whose compute is its slowest rank's: its wait is in it
        basis = int(calibration.get("rank_spread_world_size") or 1)
        return (Compute(peak_tflops=rate / 1e12, utilization=1.0, rank_spread_world_size=basis,
                        backward_fraction=calibration.get("backward_fraction"), **extra),
                f"FLOP rate measured on this device: {rate / 1e9:.1f} GFLOP/s (calibration model)")
    if gpu_name:
        return _gpu_what_if(opts, workload, gpu_name, size, extra)
    raise InputError("compute per micro-batch is unknown: give --micro-batch-time, or let the scan validate")


def _gpu_what_if(opts, workload, gpu_name: str, size: str | None, extra: dict):
    """Nothing measured this model on this GPU: its compute priced from its own ops (a what-if
    range), or where they cannot be priced the datasheet peak x a utilization range, saying why."""
    preset = opts.preset or SIZE_PRESETS.get(size or "")
    tokens = workload.tokens_per_micro_batch
    ac = opts.checkpointing.text
    request = (preset_request(preset, opts.micro_batch_size, tokens, opts.image_size, ac) if preset else
               params_request(parse_count(size or opts.params), opts.micro_batch_size, tokens, ac))
    pricing = _pricing(opts, gpu_name)
    modelled, why = model_on_gpu(request, pricing)
    if modelled is not None:
        on = PROFILE_WHERE if pricing.profile is not None else modelled.detail.device
        return (Compute(gpu=gpu_name, modelled=modelled, **extra),
                f"modelled from its own ops on {on}: a what-if, nothing measured")
    return (Compute(gpu=gpu_name, **extra),
            f"datasheet peak of {gpu_name} x a utilization range: a what-if, nothing measured (its ops: {why})")


def _time_on_gpu(preset: str, opts, gpu_name: str | None, extra: dict):
    """The preset built at its real size and timed on the first GPU (scaled from a few blocks
    when it does not fit), with `tokens` per micro-batch split into whole sequences; an image
    model with micro_batch_size images of its image size."""
    if is_vision(preset):
        measured = measure_preset(preset, opts.micro_batch_size, None, "cuda:0", image_size=opts.image_size,
                                  ac=opts.checkpointing.text)
        return _measured_compute(measured, measured.source, gpu_name, extra,
                                 *_modelled_beside(preset, opts, None, gpu_name))
    tokens = opts.tokens or DEFAULT_TOKENS
    sequences, seq_len, _ = context_sequences(preset, opts.micro_batch_size, tokens)
    measured = measure_preset(preset, sequences, seq_len, "cuda:0", ac=opts.checkpointing.text)
    source = measured.source + (f"; too large for one GPU: timed at {' and '.join(map(str, measured.scaled))} "
                                "blocks and extended to its depth" if measured.scaled else "")
    return _measured_compute(measured, source, gpu_name, extra, *_modelled_beside(preset, opts, tokens, gpu_name))


def _modelled_beside(preset: str, opts, tokens: int | None,
                     gpu_name: str | None) -> tuple[ModelledCompute | None, str | None]:
    """The preset's compute priced from its own ops at the shape timed, to show beside the time
    measured on GPU0 (every GPU scan checks the what-if): (the modelled compute, None), or (None,
    why not)."""
    if not gpu_name:
        return None, "this GPU's name is unknown"
    return model_on_gpu(preset_request(preset, opts.micro_batch_size, tokens, opts.image_size, opts.checkpointing.text),
                        _pricing(opts, gpu_name))


def _measured_compute(measured: MeasuredCompute, source: str, gpu_name: str | None, extra: dict,
                      modelled: ModelledCompute | None = None, unpriced: str | None = None):
    """Compute from a timing of the model itself (its record from `topoprof.model.inputs.user_model`),
    each timed input carrying where it was measured; `modelled` (the range priced from its ops)
    goes beside it, or the source says why it could not (`unpriced`)."""
    keys = ("micro_batch_time_s", "backward_fraction", "optimizer_time_s")
    compute = Compute(**{k: getattr(measured, k) for k in keys}, gpu=gpu_name, **extra, modelled=modelled,
                      origins=tuple((k, source) for k in keys))
    return compute, source + (f"; its ops could not be priced beside it ({unpriced})"
                              if modelled is None and unpriced else "")


def composed_comm(levels: dict, world_size: int):
    """Across nodes: the measured per-node ring and the measured network, composed as NCCL's
    ring crosses them (topoprof.model.comm.collectives.HierarchicalComm); None on one node, or when several
    ranks per node ran but no per-node level was measured (no intra link is invented)."""
    if "inter" not in levels:
        return None
    inter = next(iter(levels["inter"].values()))
    nodes = job_nodes(levels)
    gpn = world_size // nodes
    if gpn > 1 and "intra" not in levels:
        return None

    def ring(entry, n, hop):
        fit = entry["fit"]
        bus = fit.bandwidth_gbps * 2 * (n - 1) / n
        return RingComm(link_bandwidth_gbps=bus, hop_latency_us=fit.latency_us / (2 * (n - 1)), world_size=n,
                        source=f"measured ({hop})")

    intra = None  # one rank per node: nothing inside a node to cross
    if gpn > 1:
        slowest = min(levels["intra"].values(), key=lambda e: e["fit"].bandwidth_gbps)
        intra = ring(slowest, gpn, "slowest node").at_shape(1, gpn)
    return HierarchicalComm(intra=intra, inter=ring(inter, nodes, "network"),
                            nodes=nodes, gpus_per_node=gpn)


def job_nodes(levels: dict) -> int:
    """Nodes of the job: the ranks of the network level (one per node), else 1."""
    if "inter" not in levels:
        return 1
    return len(next(iter(levels["inter"].values()))["ranks"])


def predictions(opts, fit, world_size: int, calibration: dict | None, vopts, gpu_name: str | None,
                rows=(), levels: dict | None = None, gpu_memory_bytes: int | None = None,
                gpu_memory_origin: str = "NVML, GPU0") -> list[dict]:
    """One model payload per model: the user's, or each default size. `gpu_memory_bytes` is the
    memory of the GPU the job's cuda:0 is, which `gpu_memory_origin` names."""
    if fit is None or not fit.bandwidth_gbps or fit.bandwidth_gbps == float("inf") or world_size < 2:
        return []
    # The whole job's own measured all-reduce: it already crosses every level as this job does.
    # (One rank per node measures only the NICs nearest that rank, so the composed levels are a
    # cross-check in the report, not the prediction's input.)
    comm = measured_comm(rows, fit, world_size, "all-reduce measured by this scan")
    nodes = job_nodes(levels or {})
    sizes = ([None] if opts.preset or opts.user_record is not None
             else ([opts.params] if opts.params else list(DEFAULT_MODELS)))
    out = []
    for size in sizes:
        workload, label = _workload(opts, size)
        try:
            compute, compute_source = _compute(opts, workload, calibration, vopts, gpu_name, size)
            if gpu_memory_bytes:  # the GPU's own memory, as NVML reads it, beats its datasheet's

                compute = replace(compute, gpu_memory_gb=gpu_memory_bytes / 1e9,
                                  origins=compute.origins + (("gpu_memory_gb", gpu_memory_origin),))
        except InputError as err:  # nothing to predict with: the report says why, the rest stands
            return [{"label": label, "skipped": str(err)}]
        backend = opts.backend if opts.backend in ("nccl", "gloo") else "nccl"
        inputs = ModelInputs(workload, compute, Cluster(comm, nodes, world_size // nodes, backend=backend),
                             accumulation_steps=opts.accum)
        planned = plan_model(inputs, {"bench": "this scan"})
        if opts.backend != "nccl":  # DataParallel replicates a model over CUDA GPUs: on CPU ranks, nothing to predict
            planned = planned.refusing("dp", "DataParallel needs CUDA GPUs; this scan ran on CPU ranks")
        # what fits per strategy and checkpointing mode: the memory alone, the scan's compute being
        # measured at the micro-batch it ran
        fits = search(inputs, searched_strategies(planned), None, planned.prediction)
        out.append({"label": label, "compute_source": compute_source, **model_payload(planned, fits)})
    return out


def composed_check(levels: dict, world_size: int, rows) -> dict | None:
    """The composed levels' all-reduce time at the largest measured size vs the whole job's."""
    composed = composed_comm(levels, world_size)
    job = [r for r in rows if r.level == "job" and r.collective == "all_reduce" and not r.wrong]
    if composed is None or not job:
        return None
    big = max(job, key=lambda r: r.size_bytes)
    predicted = composed.allreduce_s(big.size_bytes)
    return {"size_bytes": big.size_bytes, "measured_s": big.time_us * 1e-6, "composed_s": predicted,
            "error_pct": 100.0 * (predicted - big.time_us * 1e-6) / (big.time_us * 1e-6)}


def single_gpu_what_ifs(opts, gpu) -> dict:
    """A one-GPU node: its model on 2-8 such GPUs and on 2-4 such nodes, from nominal links
    (`topoprof.model.strategies.whatif`), with this GPU's measured compute."""
    size = None if opts.preset or opts.user_record is not None else (opts.params or DEFAULT_MODELS[0])
    workload, label = _workload(opts, size)
    if opts.micro_batch_time_s is not None:
        compute, source = Compute(micro_batch_time_s=opts.micro_batch_time_s, gpu=gpu.name), "given"
    elif opts.user_record is not None or timed_preset(opts, size) is not None:  # timed on this GPU
        compute, source = _compute(opts, workload, None, None, gpu.name, size)
    else:
        return {"label": label, "skipped": "this GPU's compute for your model is unknown: give --model "
                                           "PATH.py:CALLABLE (timed here) or --micro-batch-time SECONDS"}
    return {**what_ifs(workload, compute, gpu, opts.accum), "label": label, "compute_source": source,
            # nothing timed where a timing was due: its failure is in the source, the datasheet stood in
            "timing_failed": compute.micro_batch_time_s is None,
            **({"compute_check": check} if (check := compute_check(compute)) else {})}


def compute_check(compute) -> dict | None:
    """The compute measured on this GPU beside the range priced from the model's own ops: the
    check of the what-if method that every GPU scan makes; None where either is missing."""
    measured = compute.micro_batch_time_s
    modelled = compute.modelled
    if measured is None or modelled is None:
        return None
    fast, middle, slow = modelled.seconds
    return {"measured_s": measured, "modelled_s": [fast, middle, slow], "error_vs_middle": measured / middle - 1,
            "inside": fast <= measured <= slow, "basis": modelled.basis, "summary": modelled.detail.summary}
