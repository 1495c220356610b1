"""A `topoprof model` report for a renderer's test from the few parts the test is about: every
other part the schema requires takes a plain value, and the whole is read through the one reader
(`topoprof.model.strategies.model_report.read_model_report`), as the command's text and a scan's
report.md are."""
from __future__ import annotations

from topoprof.model.strategies.model_report import ModelReport, read_model_report

_STRATEGY = {"comm_exposed_s": 0.0, "samples_per_step": 1, "speedup_vs_ddp_synced": None, "range": None, "formula": ""}
_MEMORY = {"parts_gb": {}, "total_gb": 0.0, "basis": "counted", "gpu_memory_gb": None, "fits": None, "reason": None}
_BUCKETS = {"count": 1, "sizes_bytes": [], "ready_fractions": [], "first_bucket_cap_bytes": 0, "bucket_cap_bytes": 0}


def model_report(strategies: dict | None = None, inputs: dict | None = None, **parts) -> ModelReport:
    """`strategies`: by name, a step (`step_time_s`, None: not applying) and what the test sets;
    `inputs`: by name, a value or a {"value", "source"} pair; `parts`: any other part as JSON."""
    return read_model_report(model_doc(strategies, inputs, **parts))


def model_doc(strategies: dict | None = None, inputs: dict | None = None, **parts) -> dict:
    """`model_report`'s JSON, as the command writes it (and a scan's report.json holds it)."""
    return {"strategies": {name: _strategy(s) for name, s in (strategies or {}).items()},
            "inputs": {name: _input(v) for name, v in (inputs or {}).items()},
            "links": {}, "per_micro_batch": {}, "buckets": _BUCKETS, "assumptions": [], "warnings": [],
            "hide_threshold": {"reason": "one GPU"}, **parts}


def _strategy(s: dict) -> dict:
    if s.get("step_time_s") is None:
        return {"reason": s.get("reason", "does not apply"), "step_time_s": None}
    memory = {**_MEMORY, **s["memory"]} if s.get("memory") else None
    return {**_STRATEGY, "samples_per_s": 1 / s["step_time_s"], **s, "memory": memory}


def _input(v) -> dict:
    return v if isinstance(v, dict) and "value" in v else {"value": v, "source": "given"}
