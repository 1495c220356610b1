"""Rank worker `numerics` for `validate`: one optimizer step of each DDP mode, and of the FSDP
modes asked for, against one process that accumulates the whole global batch: equal up to rounding.

DDP averages gradients over W ranks and each rank divides its loss by K, so the step applies
(1 / (W K)) x the sum over the global batch; a control that forgets the 1/K must not match. The
model, its batches and its optimizer are `probes/ranks/training.py`'s; FSDP's wrapping is
`probes/ranks/fsdp.py`'s. Job: NumericsJob, a training job as `probes/ranks/training.py` takes it
(mode "numerics"). Message from rank 0: NumericsResult.
"""
from __future__ import annotations

import torch

from topoprof.probes.ranks import fsdp
from topoprof.probes.ranks.training import accumulate, make_optimizer, step_batches, wrap_ddp
from topoprof.specs.messages import NumericsJob, NumericsResult, training_config
from topoprof.workload.synthetic import DDP_MODES, NUMERICS_TOLERANCE, TrainConfig, check_supported, parse_config
from topoprof.zoo.synthetic_lm import build_model


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])

def compare(got, want, rtol: float, atol: float) -> dict:
    return {"max_abs_diff_vs_single": float((got - want).abs().max()),
            "allclose": bool(torch.allclose(got, want, rtol=rtol, atol=atol))}

def single_reference(cfg, batches_by_rank, divide_by: int, dtype) -> torch.Tensor:
    """One process, every rank's micro-batches, loss / divide_by, one SGD step (on CPU); never
    checkpointed, so that a checkpointed mode is held to the plain model's step."""
    model = build_model(cfg.spec, cfg.seed, dtype)
    optimizer = make_optimizer(cfg, model)
    optimizer.zero_grad(set_to_none=True)
    for batches in batches_by_rank:
        accumulate(model, [b.cpu() for b in batches], "single", divide_by)
    optimizer.step()
    return flat_params(model)


def run_numerics(ctx, cfg: TrainConfig, fsdp_modes=()) -> None:
    """DDP averages gradients over W ranks and each rank divides its loss by K, so the step
    applies (1 / (W K)) x the sum over the global batch: the single reference divides each
    micro-batch's mean loss by W K. A control that forgets the 1/K must NOT match. amp is
    ignored here: parameters are compared in numerics_dtype without autocast. FSDP's modes
    (`fsdp_modes`) average over ranks in their reduce-scatter: the same step, the same check."""
    dtype = getattr(torch, cfg.numerics_dtype)
    world, rank = ctx.world_size, ctx.rank
    batches_by_rank = [step_batches(cfg, 0, r, world, "cpu") for r in range(world)]
    finals = {}
    for mode in DDP_MODES:
        ctx.progress(f"numerics {mode}")
        model = build_model(cfg.spec, cfg.seed, dtype, ac=cfg.ac).to(ctx.device)
        ddp = wrap_ddp(model, ctx.device, cfg)
        optimizer = make_optimizer(cfg, model)
        optimizer.zero_grad(set_to_none=True)
        accumulate(ddp, [b.to(ctx.device) for b in batches_by_rank[rank]], mode, cfg.accum)
        optimizer.step()
        finals[mode] = flat_params(model)
    if fsdp_modes:
        fsdp.quiet()
        ctx.progress("numerics fsdp")
        finals.update(fsdp.numerics(lambda: build_model(cfg.spec, cfg.seed, dtype, ac=cfg.ac).to(ctx.device),
                                    fsdp_modes,
                                    [b.to(ctx.device) for b in batches_by_rank[rank]], cfg.accum,
                                    fsdp.mesh_for(ctx.device, world), lambda m: make_optimizer(cfg, m),
                                    fsdp.full_params))
    if rank != 0:
        return
    ctx.progress("numerics single-process reference")
    want = single_reference(cfg, batches_by_rank, world * cfg.accum, dtype)
    wrong = single_reference(cfg, batches_by_rank, world, dtype)
    rtol, atol = NUMERICS_TOLERANCE[cfg.numerics_dtype]
    report = {mode: compare(finals[mode], want, rtol, atol) for mode in finals}
    report["control_single_not_divided_by_k"] = compare(wrong, want, rtol, atol)
    ctx.send(NumericsResult(report, dtype=cfg.numerics_dtype, rtol=rtol, atol=atol, lr=cfg.lr,
                            world_size=world, accum=cfg.accum, micro_batch=cfg.micro_batch,
                            params=cfg.spec.params, ac=cfg.ac))


def run_rank(ctx, job: NumericsJob) -> None:
    cfg = parse_config(training_config(job))
    check_supported(cfg, ctx.device, ctx.world_size, torch.cuda.device_count())
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    run_numerics(ctx, cfg, job.fsdp_modes or ())
