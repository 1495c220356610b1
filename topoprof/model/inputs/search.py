"""The search over micro-batch sizes and checkpointing modes (`topoprof.model.strategies.search`)
for a `model` request: its memory from the workload's counts, its compute at each candidate priced
from passes of the model at 1 and 2 blocks (`traces.compute_at`; a `--model`'s whole,
`traces.user_compute_at`) where the compute is a what-if
priced from the model's ops; elsewhere (measured, given, a utilization) only the memory is searched.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from topoprof.jsonio import to_jsonable
from topoprof.model.compute.timing import uses_modelled
from topoprof.model.inputs.request import ModelRequest
from topoprof.model.inputs.traces import (
    ModelShape,
    UserShape,
    compute_at,
    model_shape,
    user_compute_at,
    user_shape,
)
from topoprof.model.strategies.search import search


def applying_strategies(payload: dict) -> list[str]:
    """The strategies a model payload prices here, or says do not fit: the search's candidates."""
    return [name for name, s in payload["strategies"].items() if s.get("step_time_s") is not None
            or (s.get("memory") or {}).get("fits") is False]


def fits_payload(inputs, request: ModelRequest, applying: list[str], progress=None) -> dict:
    """The search's JSON for the strategies that apply here (`applying`); `progress` hears its stages."""
    w, c = request.workload, inputs.compute
    price = None
    shape: UserShape | ModelShape | str
    at: Callable[..., dict | str]
    if w.user_model:
        shape, at, how = user_shape(w), user_compute_at, "passes of the whole model"
    else:
        shape = model_shape(w.preset_name, w.param_count, w.micro_batch_size, w.tokens, w.preset_sizes)
        at, how = compute_at, "passes at 1 and 2 blocks"
    if uses_modelled(c) and not isinstance(shape, str) and (c.gpu or request.compute.gpu_profile):
        def price(wanted):
            if progress is not None:
                progress(f"pricing {len(wanted)} micro-batch size(s) and checkpointing mode(s) from {how} on meta")
            fields = at(shape, wanted, c.gpu, c.precision, request.compute.compiled,
                                request.compute.gpu_profile)
            if isinstance(fields, str):
                return fields
            return {key: candidate_compute(c, f) for key, f in fields.items()}
    return to_jsonable(search(inputs, applying, price))


def candidate_compute(main, fields: dict):
    """A candidate's compute: the main pass's (`main`) with the candidate's modelled fields. Its
    optimizer step is the main pass's, priced from the same profile (it holds the same parameters
    whatever the micro-batch and the checkpointing)."""
    optimizer = (main.modelled_detail or {}).get("optimizer")
    if optimizer and "modelled_detail" in fields:
        fields = {**fields, "modelled_detail": {**fields["modelled_detail"], "optimizer": optimizer}}
    return replace(main, **fields)
