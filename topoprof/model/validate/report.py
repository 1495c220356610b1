"""`topoprof validate`'s result as one typed record (`ValidateReport`), and its one reader.

The command writes its JSON (`run.validate_payload`, under the envelope of `topoprof.jsonio`), a
scan writes the same modes, calibration, numerics and summary as its `validation`, and the
command's text and a scan's report.md read them back through `read_validate_report`
(`jsonio.from_jsonable`), as the model's result is read (`topoprof.model.strategies.model_report`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from topoprof.jsonio import SchemaError, from_jsonable, read_document
from topoprof.measure.fit import FitLine
from topoprof.model.validate.rotations import Spread


@dataclass(frozen=True)
class ModeParts:
    """Where a step went, by part (compute, exposed_comm, optimizer, other), in seconds."""

    measured: dict[str, float] | None = None
    predicted: dict[str, float] | None = None


@dataclass(frozen=True)
class ModeCheck:
    """One mode measured beside its prediction (`run.ValidateResult.modes`)."""

    measured_step_s: float | None
    predicted_step_s: float | None
    error_pct: float | None
    predicted_range_s: tuple[float, float] | None = None
    inside_range: bool | None = None
    parts: ModeParts = field(default_factory=ModeParts)


@dataclass(frozen=True)
class Calibration:
    """The model's inputs as measured, with each one's spread; the inputs themselves are read
    by `topoprof model --calibration` (`timing.CALIBRATION_KEYS`)."""

    spread: dict[str, Spread] = field(default_factory=dict)
    rotations: int | None = None
    combine: str = ""
    ddp_copies_basis: str | None = None


@dataclass(frozen=True)
class Summary:
    cases: int
    median_abs_error_pct: float | None = None
    worst_abs_error_pct: float | None = None
    mean_signed_error_pct: float | None = None
    inside_range: int = 0


@dataclass(frozen=True)
class Setup:
    backend: str
    nproc: int
    spec: Any                  # the model's spec, or {"user_model": ...}
    params: int
    micro_batch: int
    accum: int
    steps: int
    warmup_steps: int | None = None
    threads: int | None = None
    activation_checkpointing: str | None = None


@dataclass(frozen=True)
class NumericsCheck:
    """One mode's parameters after one optimizer step, against one process accumulating the
    whole batch."""

    max_abs_diff_vs_single: float
    allclose: bool


@dataclass(frozen=True)
class Numerics:
    """The numerics check: each mode's comparison (`checks`, a control among them), the dtype it
    ran in, and how every mode was checkpointed. Its JSON holds the comparisons and the run's
    settings at one level (a mode's name is a key beside "dtype"), so `read_numerics` reads it,
    not the generic reader field by field."""

    checks: dict[str, NumericsCheck] = field(default_factory=dict)
    dtype: str | None = None
    ac: str | None = "none"

    def checked(self) -> list[str]:
        """The modes compared, less the controls (which are meant to differ)."""
        return [m for m in self.checks if not m.startswith("control")]


def read_numerics(doc: dict, where: str) -> Numerics:
    checks = {mode: from_jsonable(NumericsCheck, value, f"{where}.{mode}") for mode, value in doc.items()
              if isinstance(value, dict) and "allclose" in value}
    return Numerics(checks, doc.get("dtype"), doc.get("ac", "none"))


@dataclass(frozen=True)
class ValidateReport:
    status: str
    label: str | None = None
    error: str | None = None
    reason: str | None = None  # a scan's validation that was skipped: why
    modes: dict[str, ModeCheck] = field(default_factory=dict)
    calibration: Calibration | None = None
    numerics: Numerics | None = None
    summary: Summary | None = None
    fit: FitLine | None = None
    setup: Setup | None = None

    @property
    def user_model(self) -> bool:
        spec = self.setup.spec if self.setup is not None else None
        return isinstance(spec, dict) and bool(spec.get("user_model"))


def read_validate_report(doc: dict, where: str = "validate") -> ValidateReport:
    """The typed report from `topoprof validate`'s JSON (with or without its envelope) or a scan's
    `validation`; `SchemaError` names where the JSON differs from the schema."""
    numerics = doc.get("numerics")
    report = read_document(ValidateReport, {k: v for k, v in doc.items() if k != "numerics"}, where)
    if not numerics:
        return report
    if not isinstance(numerics, dict):
        raise SchemaError(f"{where}.numerics: expected an object, got {type(numerics).__name__}")
    return replace(report, numerics=read_numerics(numerics, f"{where}.numerics"))
