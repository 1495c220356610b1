"""`topoprof model`'s JSON read back as one typed record (topoprof/model/strategies/model_report.py),
the reader every renderer goes through, and the generic reader under it (topoprof.jsonio.from_jsonable)."""
from __future__ import annotations

import copy
import glob
import json
import os
from dataclasses import dataclass, field

import pytest

from tests.helpers.cli import topoprof as _cli
from topoprof.jsonio import SchemaError, from_jsonable, to_jsonable
from topoprof.model.strategies.model_report import (
    ModelReport,
    Skipped,
    made,
    read_model_report,
    read_predictions,
)
from topoprof.model.strategies.results import StrategyResult, Unavailable

HERE = os.path.dirname(__file__)
GOLDEN = sorted(glob.glob(os.path.join(HERE, "golden", "outputs", "model-*.txt")))
OLD_SCAN = os.path.join(HERE, "..", "reports", "vm-20261123T132842Z", "report.json")


def _model_docs() -> list[tuple[str, dict]]:
    """The kept `topoprof model --json` outputs (their first line is the command)."""
    out = []
    for path in GOLDEN:
        text = open(path).read()
        start = text.find("\n{")
        if start >= 0:
            out.append((os.path.basename(path), json.JSONDecoder().raw_decode(text[start + 1:])[0]))
    return out


DOCS = _model_docs()


def test_there_are_kept_json_outputs_to_read():
    assert len(DOCS) >= 8


@pytest.mark.parametrize("name, doc", DOCS, ids=[n for n, _ in DOCS])
def test_every_kept_model_output_reads_back_with_nothing_lost(name, doc):
    report = read_model_report(doc, name)
    strategies = doc["strategies"]
    for key, s in report.strategies.items():
        if isinstance(s, Unavailable):
            assert strategies[key] == {"reason": s.reason, "step_time_s": None}
        else:
            assert to_jsonable(s) == strategies[key]
    for part in ("inputs", "links", "buckets", "ddp_costs", "ddp_knobs", "fsdp_costs", "hsdp", "hide_threshold",
                 "sweep", "fixed_global_batch", "per_micro_batch", "assumptions", "warnings"):
        if part in doc:
            written = {k: v for k, v in doc[part].items() if v is not None} if part == "links" else doc[part]
            read = to_jsonable(getattr(report, part))
            if part == "links":
                read = {k: v for k, v in read.items() if v is not None and v != []}
            assert read == written, part
    if doc.get("fits") and "largest" in doc["fits"]:
        for row, typed in zip(doc["fits"]["largest"], report.fits.largest):
            assert {m: to_jsonable(c) for m, c in typed.cells.items()} == {m: row[m] for m in doc["fits"]["modes"]}


def test_an_int_written_where_a_float_is_declared_is_kept_as_written():
    doc = copy.deepcopy(DOCS[0][1])
    doc["per_micro_batch"]["optimizer_s"] = 0
    assert read_model_report(doc).per_micro_batch["optimizer_s"] == 0
    assert str(read_model_report(doc).per_micro_batch["optimizer_s"]) == "0"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["strategies"]["single"].update(step_time_s="fast"),
     "model.strategies.single.step_time_s: expected a number, got \"fast\""),
    (lambda d: d["strategies"].update(single={"step": 1}),
     "model.strategies.single: dict is none of StrategyResult | Unavailable"),
    (lambda d: d["buckets"].update(count="two"), "model.buckets.count: expected an integer, got \"two\""),
    (lambda d: d.pop("links"), "model: no 'links'"),
    (lambda d: d["inputs"]["params"].pop("source"), "model.inputs.params: no 'source'"),
    (lambda d: d.update(schema_version=2), "model: schema_version 2; this topoprof reads 1"),
])
def test_a_document_that_is_not_the_schema_is_refused_naming_where(change, message):
    doc = copy.deepcopy(DOCS[0][1])
    change(doc)
    with pytest.raises(SchemaError) as err:
        read_model_report(doc)
    assert str(err.value) == message


def test_a_scans_predictions_read_as_made_or_skipped():
    doc = copy.deepcopy(DOCS[0][1])
    read = read_predictions([{"label": "7B", "skipped": "no compute"}, {**doc, "label": "gpt2", "compute_source": "x"}])
    assert isinstance(read[0], Skipped) and read[0].skipped == "no compute"
    assert [p.label for p in made(read)] == ["gpt2"] and made(read)[0].compute_source == "x"
    with pytest.raises(SchemaError, match=r"^predictions\[1\]: expected an object, got list$"):
        read_predictions([{"label": "a", "skipped": "why"}, []])


def test_a_report_written_by_an_earlier_version_reads_with_the_parts_it_lacks_empty():
    doc = json.load(open(OLD_SCAN))
    predictions = made(read_predictions(doc["predictions"]))
    assert predictions and all(p.ddp_costs == {} and p.hsdp is None for p in predictions)
    assert all(isinstance(p.strategies["ddp_synced"], StrategyResult) for p in predictions)


def test_the_model_text_and_its_json_come_from_one_run_read_alike():
    """The text is rendered from the JSON document through the reader: the numbers the text
    shows are the JSON's."""
    args = ["model", "--preset", "gpt2", "--link-bandwidth", "50", "--world-size", "4", "--micro-batch-time", "0.1",
            "--no-sweep"]
    doc = json.loads(_cli(*args, "--json").stdout)
    text = _cli(*args).stdout
    report = read_model_report(doc)
    synced = report.result("ddp_synced")
    row = next(line for line in text.splitlines() if line.startswith("ddp_synced "))
    assert synced is not None and row.split()[1:3] == [f"{synced.step_time_s * 1e3:,.1f}",
                                                       f"{synced.comm_exposed_s * 1e3:,.1f}"]


def test_a_scan_report_whose_prediction_cannot_be_read_is_one_line_and_exit_2(tmp_path):
    doc = json.load(open(OLD_SCAN))
    doc["predictions"][0]["strategies"]["ddp_synced"] = {"step_time_s": "slow"}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    proc = _cli("report", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{path}: predictions[0].strategies.ddp_synced:" in proc.stderr
    assert not (tmp_path / "out").exists()


@dataclass(frozen=True)
class _Inner:
    a: int
    b: tuple[float, float] | None = None


@dataclass(frozen=True)
class _Outer:
    inner: _Inner
    names: tuple[str, ...] = ()
    by: dict[str, _Inner] = field(default_factory=dict)


def test_the_generic_reader_defaults_what_is_missing_and_leaves_what_it_does_not_know():
    read = from_jsonable(_Outer, {"inner": {"a": 1, "b": [1, 2.5]}, "later": 3, "by": {"x": {"a": 2}}})
    assert read == _Outer(_Inner(1, (1, 2.5)), (), {"x": _Inner(2)})
    with pytest.raises(SchemaError, match=r"_Outer.inner.a: expected an integer, got true"):
        from_jsonable(_Outer, {"inner": {"a": True}})
    with pytest.raises(SchemaError, match=r"_Outer.inner.b: expected an array of 2, got list"):
        from_jsonable(_Outer, {"inner": {"a": 1, "b": [1, 2, 3]}})
    assert isinstance(read_model_report(DOCS[0][1]), ModelReport)


def test_a_scans_validation_reads_back_typed_and_one_that_does_not_is_refused(tmp_path):
    from topoprof.model.validate.report import read_validate_report

    doc = json.load(open(OLD_SCAN))
    val = read_validate_report(doc["validation"], "validation")
    for mode, m in doc["validation"]["modes"].items():
        assert (val.modes[mode].measured_step_s, val.modes[mode].error_pct) == (m["measured_step_s"], m["error_pct"])
    assert set(val.calibration.spread) == set(doc["validation"]["calibration"]["spread"])
    assert read_validate_report({"status": "skipped", "reason": "--no-validate"}).reason == "--no-validate"
    doc["validation"]["modes"]["ddp_synced"]["error_pct"] = "small"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    proc = _cli("report", str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert f"{path}: validation.modes.ddp_synced.error_pct: expected a number, got \"small\"" in proc.stderr


def test_validates_numerics_read_as_each_modes_check_beside_the_runs_settings():
    from topoprof.model.validate.report import read_validate_report

    doc = json.load(open(OLD_SCAN))["validation"]
    num = read_validate_report(doc, "validation").numerics
    assert num is not None and num.dtype == doc["numerics"]["dtype"] == "float64" and num.ac == "none"
    # every mode compared, and the control (meant to differ) kept apart from them
    assert num.checked() == ["ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only"]
    assert num.checks["control_single_not_divided_by_k"].allclose is False
    assert num.checks["ddp_synced"].max_abs_diff_vs_single == doc["numerics"]["ddp_synced"]["max_abs_diff_vs_single"]
    assert read_validate_report({**doc, "numerics": None}, "validation").numerics is None
    bad = {**doc, "numerics": {**doc["numerics"], "ddp_synced": {"allclose": "yes", "max_abs_diff_vs_single": 0.0}}}
    with pytest.raises(SchemaError, match="validation.numerics.ddp_synced.allclose"):
        read_validate_report(bad, "validation")
