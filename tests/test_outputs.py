"""Results are never lost to a place that cannot be written: an output file or report folder is
checked before anything is measured (exit 2, one line naming it and why).

We run as root: permissions stop nothing, so the unwritable places are real ones (a path under
/proc, a regular file where a folder should be).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.unwritable import one_error_line
from topoprof.errors import InputError
from topoprof.jsonio import check_writable, check_writable_folder


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "topoprof", *args], capture_output=True, text=True, timeout=timeout)


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


# ---- the commands -----------------------------------------------------------------------------------

BENCH = ("bench", "--nproc", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")


def test_bench_refuses_an_unwritable_out_before_measuring():
    proc = _cli(*BENCH, "--out", "/proc/bench.json")
    assert proc.returncode == 2
    assert one_error_line(proc).startswith("topoprof: error: --out /proc/bench.json: cannot write in folder /proc: ")
    assert proc.stdout == ""  # nothing measured: the table's header is not even printed


def test_validate_refuses_an_unwritable_calibration_file_before_measuring():
    proc = _cli("validate", "--save-calibration", "/proc/calibration.json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--save-calibration /proc/calibration.json: cannot write in folder /proc: " in one_error_line(proc)


def test_report_refuses_an_unwritable_out(tmp_path):
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps({"kind": "scan", "schema_version": 1}))
    proc = _cli("report", str(saved), "--out", "/proc/topoprof-test")
    assert proc.returncode == 2
    assert one_error_line(proc).startswith("topoprof: error: --out /proc/topoprof-test: cannot create the folder: ")
