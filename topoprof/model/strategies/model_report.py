"""`topoprof model`'s result as one typed record (`ModelReport`), and its one reader.

The command writes its JSON (`payload.model_payload` and the fits search, under the envelope of
`topoprof.jsonio`), and every renderer reads that JSON back through `read_model_report`: the
command's text, and a scan's report.md from a report.json written by this or an earlier version
of the same schema. So what the text shows is what the JSON holds, and a renderer reads fields
the type checker knows, not keys.

The records are those `predict` returns (`results`) and the search's (`search`), and a few more
for the parts the payload assembles: the links described, DDP's options, the sweep, the fixed
global batch, the fits search.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topoprof.jsonio import SchemaError, from_jsonable, read_document
from topoprof.model.strategies.results import (
    BucketSummary,
    GlobalBatchOption,
    HideThreshold,
    HsdpLevels,
    InputValue,
    PartCost,
    StrategyResult,
    Unavailable,
)
from topoprof.model.strategies.search import Candidate, ModeCost


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
class KnobGain:
    """A DDP option's predicted gain on ddp_synced, and the part of DDP's cost it acts on."""

    knob: str
    part: str
    step_time_s: float
    gain_s: float
    gain_pct: float


@dataclass(frozen=True)
class Sweep:
    accum: tuple[int, ...]
    world_size: int
    samples_per_micro_batch: int
    strategies: dict[str, tuple[float | None, ...]]  # a step time per K; None: not applying, or not fitting


@dataclass(frozen=True)
class FixedGlobalBatch:
    global_batch_samples: int
    options: tuple[GlobalBatchOption, ...]


@dataclass(frozen=True)
class FitCell:
    """The largest micro-batch of a row's strategies under one mode (`search.Largest`)."""

    micro_batch: int | None
    total_gb: float | None
    next_gb: float | None
    reason: str | None = None


@dataclass(frozen=True)
class LargestRow:
    strategies: tuple[str, ...]
    cells: dict[str, FitCell]  # by checkpointing mode; on the wire, each mode is a key of the row


@dataclass(frozen=True)
class NoSyncMemory:
    synced: str
    no_sync: str
    extra_gb: float
    fits: bool | None


@dataclass(frozen=True)
class Fits:
    """The search for what fits (`topoprof.model.strategies.search`); `reason`: why it was not run."""

    modes: tuple[str, ...]
    gpu_memory_gb: float | None
    gpu_memory_source: str | None
    micro_batch_now: int
    tokens_per_sample: int | None
    accumulation_steps: int
    reason: str | None = None
    largest: tuple[LargestRow, ...] = ()
    no_sync: tuple[NoSyncMemory, ...] = ()
    fastest: tuple[Candidate, ...] = ()
    mode_costs: tuple[ModeCost, ...] = ()
    fastest_reason: str | None = None
    unranked: dict[str, str] = field(default_factory=dict)  # a strategy left out of `fastest`: why


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
