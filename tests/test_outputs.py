"""Results are never lost to a place that cannot be written: an output file or report folder is
checked before anything is measured (exit 2, one line naming it and why), and a write that still
fails at the end goes to the system's temporary directory instead (exit 3, the line says where).

We run as root: permissions stop nothing, so the unwritable places are real ones (a path under
/proc, a regular file where a folder should be), and a place that fails only at the end is one
broken after the check passed.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.helpers.cli import topoprof as _cli
from tests.helpers.unwritable import broken_after_check, one_error_line
from topoprof.errors import InputError
from topoprof.jsonio import check_writable, check_writable_folder, write_text

# ---- the checks before a run ----------------------------------------------------------------------


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("a regular file, not a folder\n")
    return path


def test_a_report_folder_that_cannot_be_created_is_refused(a_file):
    with pytest.raises(InputError, match=r"^--out /proc/topoprof-test/report: cannot create the folder: "):
        check_writable_folder("/proc/topoprof-test/report", "--out")
    with pytest.raises(InputError, match=rf"^--out {a_file}/report: cannot create the folder: Not a directory$"):
        check_writable_folder(str(a_file / "report"), "--out")


def test_a_report_folder_that_exists_but_takes_no_file_is_refused():
    with pytest.raises(InputError, match=r"^--out /proc/sys: cannot write in the folder: "):
        check_writable_folder("/proc/sys", "--out")


def test_checking_a_report_folder_leaves_nothing_behind(tmp_path):
    check_writable_folder(str(tmp_path / "new" / "deeper" / "report"), "--out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    check_writable_folder(str(tmp_path / "kept"), "--out")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []


def test_an_output_file_that_cannot_be_written_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"^--out /proc/bench\.json: cannot write in folder /proc: "):
        check_writable("/proc/bench.json", "--out")
    with pytest.raises(InputError, match=rf"^--save-calibration {tmp_path}: is a folder, not a file$"):
        check_writable(str(tmp_path), "--save-calibration")
    with pytest.raises(InputError, match=r"folder .*/missing does not exist$"):
        check_writable(str(tmp_path / "missing" / "x.json"), "--out")
    check_writable(str(tmp_path / "x.json"), "--out")
    assert list(tmp_path.iterdir()) == []


# ---- the fallback at the end ----------------------------------------------------------------------


@pytest.fixture
def spare(tmp_path, monkeypatch) -> Path:
    """The system's temporary directory, for this test: a folder of its own."""
    folder = tmp_path / "spare"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_file_that_cannot_be_written_goes_to_the_temporary_directory(a_file, spare):
    wanted = str(a_file / "bench.json")
    moved = write_text(wanted, '{"rows": []}\n', "--out")
    assert moved.reason == "Not a directory"
    assert Path(moved.written_to).read_text() == '{"rows": []}\n'
    assert Path(moved.written_to).parent.parent == spare and Path(moved.written_to).name == "bench.json"
    assert moved.message() == f"--out {wanted}: cannot write (Not a directory); written to {moved.written_to} instead"


def test_a_file_written_nowhere_says_so(a_file, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(a_file))  # the temporary directory is broken too
    moved = write_text(str(a_file / "cal.json"), "{}", "--save-calibration")
    assert moved.written_to is None
    assert moved.message().endswith("nor in the temporary directory; it is printed on stdout instead")


def test_a_file_that_can_be_written_is_written(tmp_path):
    assert write_text(str(tmp_path / "x.json"), "{}", "--out") is None
    assert (tmp_path / "x.json").read_text() == "{}"


# ---- the commands -----------------------------------------------------------------------------------

BENCH = ("bench", "--nproc", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")


def test_bench_refuses_an_unwritable_out_before_measuring():
    proc = _cli(*BENCH, "--out", "/proc/bench.json")
    assert proc.returncode == 2
    assert one_error_line(proc).startswith("topoprof: error: --out /proc/bench.json: cannot write in folder /proc: ")
    assert proc.stdout == ""  # nothing measured: the table's header is not even printed


def test_bench_out_that_fails_at_the_end_goes_to_the_temporary_directory(tmp_path):
    folder, spare = tmp_path / "results", tmp_path / "spare"
    folder.mkdir()
    spare.mkdir()
    proc = broken_after_check("check_writable", folder, spare, *BENCH, "--out", str(folder / "bench.json"))
    assert proc.returncode == 3, proc.stderr
    (written,) = spare.glob("topoprof-*/bench.json")
    assert one_error_line(proc) == (f"topoprof: error: --out {folder}/bench.json: cannot write (Not a directory);"
                                    f" written to {written} instead")
    doc = json.loads(written.read_text())
    assert doc["kind"] == "bench" and doc["status"] == "ok" and len(doc["rows"]) == 1
    assert "all_reduce" in proc.stdout  # the table was printed as usual


def test_validate_refuses_an_unwritable_calibration_file_before_measuring():
    proc = _cli("validate", "--save-calibration", "/proc/calibration.json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--save-calibration /proc/calibration.json: cannot write in folder /proc: " in one_error_line(proc)


def test_validate_calibration_that_fails_at_the_end_goes_to_the_temporary_directory(tmp_path):
    folder, spare = tmp_path / "cal", tmp_path / "spare"
    folder.mkdir()
    spare.mkdir()
    proc = broken_after_check("check_writable", folder, spare, "validate", "--params", "60K", "--seq-len", "16",
                              "--micro-batch", "2", "--accum", "2", "--steps", "1", "--warmup-steps", "0",
                              "--no-numerics", "--modes", "ddp_synced",
                              "--save-calibration", str(folder / "calibration.json"))
    assert proc.returncode == 3, proc.stderr
    (written,) = spare.glob("topoprof-*/calibration.json")
    assert one_error_line(proc) == (f"topoprof: error: --save-calibration {folder}/calibration.json: cannot write"
                                    f" (Not a directory); written to {written} instead")
    assert json.loads(written.read_text())["calibration"]["micro_batch_time_s"] > 0


def test_report_refuses_an_unwritable_out(tmp_path):
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps({"kind": "scan", "schema_version": 1}))
    proc = _cli("report", str(saved), "--out", "/proc/topoprof-test")
    assert proc.returncode == 2
    assert one_error_line(proc).startswith("topoprof: error: --out /proc/topoprof-test: cannot create the folder: ")
