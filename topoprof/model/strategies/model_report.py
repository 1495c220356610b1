"""`topoprof model`'s result as JSON, its one writer (`model_payload`) and its one reader
(`read_model_report`, into one typed record, `ModelReport`).

The command writes its JSON from what it predicted (`model_plan.ModelPlan`) and the fits search
(`search.Fits`), under the envelope of `topoprof.jsonio`; every renderer reads that JSON back: the
command's text, and a scan's report.md from a report.json written by this or an earlier version
of the same schema. So what the text shows is what the JSON holds, and a renderer reads fields
the type checker knows, not keys.

The records are those `predict` returns (`results`), the plan's (`model_plan`) and the search's
(`search`), and the links described.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from topoprof.jsonio import SchemaError, from_jsonable, read_document, to_jsonable
from topoprof.model.strategies.model_plan import MAIN, FixedGlobalBatch, KnobGain, ModelPlan, Sweep
from topoprof.model.strategies.results import (
    BucketSummary,
    HideThreshold,
    HsdpLevels,
    InputValue,
    PartCost,
    StrategyResult,
    Unavailable,
)
from topoprof.model.strategies.search import Fits


@dataclass(frozen=True)
class Links:
    """What the links were read from (`topoprof.model.inputs.link_choice.comm_of`): one GPU's no link,
    a bench's fit, a given rate, a standard node assumed, or a topology's rings; then the network."""

    no_link: str | None = None
    gpus: tuple[int, ...] | None = None
    bench: str | None = None
    backend: str | None = None
    link_bandwidth_gbps: float | None = None
    assumed_node: str | None = None
    topology: str | None = None
    ring: tuple[int, ...] | None = None
    bottleneck_gbps: tuple[float, float] | None = None
    hop: str | None = None
    rings: tuple[tuple[int, ...], ...] | None = None
    bus_bandwidth_gbps: tuple[float, float] | None = None
    rings_kind: str | None = None
    rings_basis: str | None = None
    nvlink_rate: str | None = None
    network_bandwidth_gbps: float | None = None
    network_latency_us: float | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelReport:
    strategies: dict[str, StrategyResult | Unavailable]
    inputs: dict[str, InputValue]
    links: Links
    per_micro_batch: dict[str, float]
    buckets: BucketSummary
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    hide_threshold: HideThreshold | Unavailable
    # reports written before DDP's and FSDP's costs were priced part by part have none
    ddp_costs: dict[str, PartCost] = field(default_factory=dict)
    ddp_knobs: tuple[KnobGain, ...] = ()
    fsdp_costs: dict[str, PartCost] = field(default_factory=dict)
    hsdp: HsdpLevels | None = None
    fits: Fits | None = None
    sweep: Sweep | None = None
    fixed_global_batch: FixedGlobalBatch | None = None
    # a scan's prediction: which model it is, and where its compute comes from
    label: str | None = None
    compute_source: str | None = None

    def value(self, name: str) -> Any:
        """An input's value; None where the input is not there."""
        given = self.inputs.get(name)
        return None if given is None else given.value

    def source(self, name: str) -> str | None:
        given = self.inputs.get(name)
        return None if given is None else given.source

    def result(self, name: str) -> StrategyResult | None:
        """A strategy's result where it applies (None: not predicted, or not applying here)."""
        s = self.strategies.get(name)
        return s if isinstance(s, StrategyResult) else None

    def fitting(self, name: str) -> StrategyResult | None:
        """A strategy's result where it applies and does not overflow the GPU's memory: one that
        does not fit is kept in the table but never ranked nor recommended."""
        s = self.result(name)
        return None if s is None or (s.memory is not None and s.memory.fits is False) else s


def model_payload(plan: ModelPlan, fits: Fits | None = None) -> dict:
    """The JSON of a prediction (`model --json`, and each of a scan's predictions), with the fits
    search first where there is one; `read_model_report` reads it back."""
    p = plan.prediction
    payload: dict = {"fits": _fits_layout(fits)} if fits is not None else {}
    payload.update(strategies=_strategies_layout(plan), inputs=p.inputs, links=plan.links,
                   per_micro_batch=p.per_micro_batch, buckets=p.buckets, assumptions=p.assumptions,
                   warnings=[*p.warnings, *plan.links.get("notes", [])], hide_threshold=p.hide_threshold,
                   ddp_costs=p.ddp_costs, ddp_knobs=plan.knobs, fsdp_costs=p.fsdp_costs, hsdp=p.hsdp)
    if plan.sweep is not None:
        refused: tuple[float | None, ...] = (None,) * len(plan.sweep.accum)
        payload["sweep"] = replace(plan.sweep, strategies={name: refused if name in plan.refused else
                                                           plan.sweep.strategies[name] for name in MAIN})
    if plan.fixed_global_batch is not None:
        payload["fixed_global_batch"] = plan.fixed_global_batch
    return to_jsonable(payload)


def _strategies_layout(plan: ModelPlan) -> dict:
    """Each strategy's result, or why it does not apply here (or is refused)."""
    out: dict = {}
    for name, result in plan.prediction.strategies.items():
        reason = plan.refused.get(name) or (result.reason if isinstance(result, Unavailable) else None)
        out[name] = {"reason": reason, "step_time_s": None} if reason is not None else result
    return out


def _fits_layout(fits: Fits) -> dict:
    """The search as written: each row of `largest` holds its strategies and a cell per mode; what
    was not searched, or not ranked, carries its reason instead."""
    head = {"modes": fits.modes, "gpu_memory_gb": fits.gpu_memory_gb, "gpu_memory_source": fits.gpu_memory_source,
            "micro_batch_now": fits.micro_batch_now, "tokens_per_sample": fits.tokens_per_sample,
            "accumulation_steps": fits.accumulation_steps}
    if fits.reason is not None:
        return {**head, "reason": fits.reason}
    found = {**head, "largest": [{"strategies": row.strategies, **row.cells} for row in fits.largest],
             "no_sync": fits.no_sync}
    if fits.fastest_reason is not None:
        return {**found, "fastest_reason": fits.fastest_reason}
    return {**found, "fastest": fits.fastest, "mode_costs": fits.mode_costs, "unranked": fits.unranked}


def read_model_report(doc: dict, where: str = "model") -> ModelReport:
    """The typed report from `topoprof model`'s JSON (with or without its envelope), or from one
    of a scan's predictions; `SchemaError` names the key path where the JSON differs from the
    schema, or the schema version it is not."""
    fits = doc.get("fits")
    if isinstance(fits, dict) and isinstance(fits.get("largest"), list):
        modes = fits.get("modes") or ()
        rows = [{"strategies": row.get("strategies"), "cells": {m: row.get(m) for m in modes}}
                if isinstance(row, dict) else row for row in fits["largest"]]
        doc = {**doc, "fits": {**fits, "largest": rows}}
    return read_document(ModelReport, doc, where)


@dataclass(frozen=True)
class Skipped:
    """A scan's prediction that was not made, and why."""

    label: str
    skipped: str


def read_predictions(predictions: list | None, where: str = "predictions") -> list[ModelReport | Skipped]:
    """A scan's predictions, each typed (`read_model_report`), or why it was skipped."""
    out: list[ModelReport | Skipped] = []
    for i, p in enumerate(predictions or []):
        at = f"{where}[{i}]"
        if not isinstance(p, dict):
            raise SchemaError(f"{at}: expected an object, got {type(p).__name__}")
        out.append(from_jsonable(Skipped, p, at) if p.get("skipped") else read_model_report(p, at))
    return out


def made(predictions: list[ModelReport | Skipped]) -> list[ModelReport]:
    """The predictions that were made."""
    return [p for p in predictions if isinstance(p, ModelReport)]
