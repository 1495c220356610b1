"""The search over micro-batch sizes and checkpointing modes (`topoprof.model.strategies.search`)
for a `model` request: its memory from the workload's counts, its compute at each candidate priced
from passes of the model at 1 and 2 blocks (a `--model`'s whole; `traces.candidate_passes`,
gathered by `gather.gather_candidates` once `strategies.search.plan_search` has named the
candidates) where the
compute is a what-if priced from the model's ops; elsewhere (measured, given, a utilization) only
the memory is searched. Pure, as `resolve` is.
"""
from __future__ import annotations

from dataclasses import replace

from topoprof.model.compute.modelled import ModelledCompute
from topoprof.model.compute.profile_choice import Pricing
from topoprof.model.compute.timing import Compute, uses_modelled
from topoprof.model.inputs.candidates import (
    CandidatePasses,
    ModelShape,
    UserShape,
    priced_candidates,
)
from topoprof.model.inputs.request import ModelRequest
from topoprof.model.strategies.job import ModelInputs
from topoprof.model.strategies.search import Fits, SearchPlan, finish_search


def candidate_shape(inputs: ModelInputs, request: ModelRequest, plan: SearchPlan,
                    shape: ModelShape | UserShape | str | None) -> ModelShape | UserShape | None:
    """What the candidates' passes trace (`shape`, as the memory's passes traced it), where their
    compute is priced from the model's ops (a what-if for a GPU named or profiled); None where it
    is not (the search then says why)."""
    c = inputs.compute
    if plan.table is None or not uses_modelled(c) or not (c.gpu or request.compute.gpu_profile):
        return None
    return None if isinstance(shape, str) else shape


def fits_priced(inputs: ModelInputs, plan: SearchPlan, passes: CandidatePasses | str | None,
                pricing: Pricing) -> Fits:
    """The search: `plan` completed with the candidates priced from `passes` (None: their
    compute is not priced here; a str: why their passes failed) as the main pass is (`pricing`,
    `Evidence.pricing`)."""
    priced: dict | str | None = None
    if isinstance(passes, str):
        priced = passes
    elif passes is not None:
        c = inputs.compute
        each = priced_candidates(passes, pricing)
        priced = each if isinstance(each, str) else {key: candidate_compute(c, m) for key, m in each.items()}
    return finish_search(inputs, plan, priced)


def candidate_compute(main: Compute, modelled: ModelledCompute) -> Compute:
    """A candidate's compute: the main pass's (`main`) with the candidate's modelled compute. Its
    optimizer step is the main pass's, priced from the same profile (it holds the same parameters
    whatever the micro-batch and the checkpointing)."""
    optimizer = main.modelled.detail.optimizer if main.modelled is not None else None
    if optimizer:
        modelled = replace(modelled, detail=replace(modelled.detail, optimizer=optimizer))
    return replace(main, modelled=modelled)
