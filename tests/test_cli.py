"""The command line: registered commands, exit codes, one-line errors, and a fast `topo`."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

from tests.helpers.cli import topoprof as _cli

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "topo")


def test_command_list_is_deliberate():
    from topoprof.cli import main

    assert sorted(main.commands) == ["bench", "model", "profile", "report", "scan", "topo", "validate"]


def test_version_and_help():
    assert _cli("--version").stdout.startswith("topoprof, version ")
    proc = _cli("--help")
    assert proc.returncode == 0 and "topo" in proc.stdout


def test_topo_from_file_json_does_not_import_torch():
    fixture = glob.glob(os.path.join(FIXTURES, "07_*"))[0]
    code = ("import sys, runpy; sys.argv = ['topoprof', 'topo', '--from-file', %r, '--json'];"
            "import topoprof.cli as c\n"
            "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'" % fixture)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1 and doc["kind"] == "topology"
    assert len(doc["topology"]["gpus"]) == 8 and len(doc["topology"]["nics"]) == 12


def test_unreadable_topology_text_is_one_line_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNVX\t0-3\nGPU1\tNV1\t X \t0-3\n")
    proc = _cli("topo", "--from-file", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"topoprof: error: {bad}:2:") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("nothing here\n")
    proc = _cli("--debug", "topo", "--from-file", str(bad))
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_missing_file_exit_2():
    proc = _cli("topo", "--from-file", "/nonexistent/topo.txt")
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_unknown_option_is_usage_error():
    assert _cli("topo", "--no-such-option").returncode == 2


def test_live_topo_without_gpu_reports_host_and_says_no_gpu():
    proc = _cli("topo")
    assert proc.returncode == 0, proc.stderr
    assert "No NVIDIA GPU found" in proc.stdout and "Host" in proc.stdout
    assert "nvidia-smi" in proc.stdout  # the note says why


def test_help_is_light():
    code = ("import sys\nimport topoprof.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'matplotlib', 'pynvml') if m in sys.modules]\n"
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
