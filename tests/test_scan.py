"""`topoprof scan` end to end on gloo, and `topoprof report` re-rendering it."""
from __future__ import annotations

import json

import pytest

from tests.helpers.cli import topoprof as _cli
from tests.helpers.unwritable import broken_after_check, cli_with, one_error_line

# Its tests share one module fixture of rank launches: one worker runs them all, so the launches
# run once (`--dist loadgroup` in pyproject.toml), not once on each worker that takes a test of it.
pytestmark = pytest.mark.xdist_group("scan")

REPORT_KEYS = {"schema_version", "kind", "tool", "host", "created_utc", "status", "error", "mode", "inputs",
               "versions", "environment", "topology", "ring", "bench", "copies", "predictions", "validation",
               "verdict", "recommendations", "charts", "timing", "cluster", "probes", "what_if"}


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    out = tmp_path_factory.mktemp("scan") / "report"
    proc = _cli("scan", "--quick", "--params", "125M", "--accum", "8", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_report_json_keys_are_guarded(scanned):
    out, _ = scanned
    doc = json.loads((out / "report.json").read_text())
    assert set(doc) == REPORT_KEYS
    assert doc["kind"] == "scan" and doc["schema_version"] == 1 and doc["status"] == "ok"
    assert doc["mode"]["backend"] == "gloo" and not doc["mode"]["gpu"]
    assert doc["bench"]["rows"] and doc["bench"]["fit"]["all_reduce"]["bandwidth_gbps"] > 0
    assert [p["label"] for p in doc["predictions"]] == ["125M params"]
    assert set(doc["validation"]["modes"]) == {"ddp_synced", "ddp_no_sync", "ddp_no_sync_backward_only"}
    assert doc["timing"]["total_s"] > 0 and "ranks: bench and validation" in doc["timing"]


def test_charts_are_written_and_non_empty(scanned):
    out, _ = scanned
    doc = json.loads((out / "report.json").read_text())
    assert set(doc["charts"]) == {"busbw", "step_vs_accum", "pred_vs_measured"}  # no GPU: no link/copy matrix
    for name in doc["charts"].values():
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000


def test_markdown_leads_with_what_to_do_and_says_no_gpu(scanned):
    out, stdout = scanned
    md = (out / "report.md").read_text()
    assert md.index("## What to do") < md.index("## Topology") < md.index("## Measured bandwidth")
    assert "No GPU on this machine" in md and "gloo" in md
    assert "## Validation" in md and "## Method and assumptions" in md
    assert "no_sync" in md
    assert "report.md" in stdout


def test_report_command_re_renders_from_json(scanned, tmp_path):
    out, _ = scanned
    proc = _cli("report", str(out / "report.json"), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report.md").read_text().startswith("# topoprof scan")
    assert (tmp_path / "busbw.png").stat().st_size > 5000


def test_report_refuses_other_json(tmp_path):
    other = tmp_path / "bench.json"
    other.write_text(json.dumps({"kind": "bench", "schema_version": 1}))
    proc = _cli("report", str(other))
    assert proc.returncode == 2 and "not a scan report" in proc.stderr


def test_scan_bad_input_exit_2(tmp_path):
    proc = _cli("scan", "--params", "12Q", "--no-validate", "--quick", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "--params" in proc.stderr and "Traceback" not in proc.stderr


def test_no_validate_without_compute_still_writes_the_report(tmp_path):
    out = tmp_path / "r"
    proc = _cli("scan", "--no-validate", "--quick", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    md = (out / "report.md").read_text()
    assert "No prediction: compute per micro-batch is unknown" in md
    assert "Skipped: --no-validate" in md
    doc = json.loads((out / "report.json").read_text())
    assert doc["bench"]["rows"] and doc["validation"]["status"] == "skipped"


FAST_SCAN = ("scan", "--quick", "--no-validate")


def test_a_report_folder_that_cannot_be_created_stops_the_scan_before_it_measures(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("a regular file, not a folder\n")
    never_measure = "import topoprof.scan.pipeline as job\njob.run = lambda *a: sys.exit('topoprof scan measured')"
    for out, why in [("/proc/topoprof-test/report", "No such file or directory"),
                     (f"{a_file}/report", "Not a directory")]:
        proc = cli_with(never_measure, *FAST_SCAN, "--out", out)
        assert proc.returncode == 2, proc.stderr
        assert one_error_line(proc) == f"topoprof: error: --out {out}: cannot create the folder: {why}"


def test_a_report_that_cannot_be_written_at_the_end_goes_to_the_temporary_directory(tmp_path):
    folder, spare = tmp_path / "reports", tmp_path / "spare"
    spare.mkdir()
    proc = broken_after_check("check_writable_folder", folder, spare, *FAST_SCAN, "--out", str(folder / "node1"))
    assert proc.returncode == 3, proc.stderr
    (written,) = spare.glob("topoprof-*/report.json")
    assert one_error_line(proc) == (f"topoprof: error: --out {folder}/node1: cannot write the report (Not a directory);"
                                    f" written to {written.parent} instead")
    doc = json.loads(written.read_text())
    assert doc["status"] == "ok" and doc["bench"]["rows"] and doc["timing"]["total_s"] > 0  # the whole scan
    assert (written.parent / "report.md").exists() and f"report in {written.parent}/report.md" in proc.stdout


def test_a_report_that_can_be_written_nowhere_is_printed(tmp_path):
    folder, spare = tmp_path / "reports", tmp_path / "spare"
    spare.mkdir()
    # the temporary directory full as well, once the ranks have run
    full = "def full():\n    raise OSError(28, 'No space left on device')\nj.spare_folder = full\n"
    proc = broken_after_check("check_writable_folder", folder, spare, *FAST_SCAN, "--out", str(folder / "node1"),
                              also=full)
    assert proc.returncode == 3, proc.stderr
    assert one_error_line(proc).endswith("nor in the temporary directory; report.json is printed on stdout instead")
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "scan" and doc["bench"]["rows"]


def test_a_datasheet_what_if_prediction_is_shown_as_ranges():
    # A GPU scan whose compute was not measured falls back to the datasheet: the report must give
    # every step time as a range with its basis, not one number.
    from topoprof.model.comm.collectives import RingComm
    from topoprof.model.compute.timing import Compute
    from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
    from topoprof.model.strategies.model_plan import plan_model
    from topoprof.model.strategies.model_report import model_payload
    from topoprof.report.markdown import render_markdown
    from topoprof.report.scan_report import read_scan_parts

    inputs = ModelInputs(Workload.from_preset("gpt2", tokens_per_micro_batch=2048),
                         Compute(gpu="NVIDIA H100 80GB HBM3"), Cluster(RingComm(100.0, 5.0, 8), 1, 8))
    payload = {"label": "gpt2", "compute_source": "datasheet peak of NVIDIA H100 80GB HBM3 x a utilization range",
               **model_payload(plan_model(inputs, {"link_bandwidth_gbps": 100.0}, sweep=False))}
    report = {"predictions": [payload]}
    text = render_markdown(read_scan_parts(report))
    section = text[text.index("## Predictions"):]
    assert "Compute per micro-batch" in section and "what-if" in section
    header = next(line for line in section.splitlines() if line.startswith("| strategy"))
    assert header.endswith("| step range ms |")
    row = next(line for line in section.splitlines() if line.startswith("| `ddp_synced`"))
    low, high = (float(v.replace(",", "")) for v in row.split("|")[-2].split("–"))
    step = float(row.split("|")[2].replace(",", ""))
    assert low < step < high
