"""A fake NVIDIA driver for end-to-end runs of the CLI: `nvidia-smi` on PATH that prints a saved
output byte for byte (or fails), and `import pynvml` answered by a named fake NVML scenario
(tests/fake_nvml.py), for the CLI and every rank process it starts.
"""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent

# Loaded in place of pynvml: it imports the real binding (the fake takes its constants and error
# classes from it), then puts the scenario's fake where `import pynvml` finds it.
_SHIM = '''
import importlib.machinery, importlib.util, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "pynvml", [p for p in sys.path if os.path.abspath(p or ".") != _here])
_real = importlib.util.module_from_spec(_spec)
sys.modules["pynvml"] = _real  # before it runs: it builds its error classes on sys.modules[__name__]
_spec.loader.exec_module(_real)
sys.path.insert(0, {tests!r})
from fake_nvml import make_fake_nvml
sys.modules["pynvml"] = make_fake_nvml(os.environ["TOPOPROF_TEST_NVML_SCENARIO"])
'''


def fixture_body(path: Path) -> bytes:
    """A saved output without its `# ` header (everything up to and including `# ---`)."""
    data = path.read_bytes()
    return data.split(b"\n# ---\n", 1)[1]


def driver_env(tmp_path: Path, *, smi_output: bytes | None = None, smi_script: str | None = None,
               nvml_scenario: str | None = None, keep_path: bool = True) -> dict:
    """Environment for a CLI subprocess: PATH with the fake nvidia-smi first (or no nvidia-smi at
    all when neither output nor script is given), PYTHONPATH with the fake pynvml when a scenario
    is named (otherwise pynvml is the real one, which finds no driver here)."""
    env = dict(os.environ)
    bindir = tmp_path / "fake-bin"
    bindir.mkdir(exist_ok=True)
    for name in ("python", "python3"):  # the CLI runs `sys.executable`; keep it reachable by name
        link = bindir / name
        if not link.exists():
            link.symlink_to(sys.executable)
    if smi_output is not None:
        (tmp_path / "smi-output").write_bytes(smi_output)
        smi_script = f"test \"$1 $2\" = 'topo -m' || exit 3\ncat '{tmp_path / 'smi-output'}'\n"
    if smi_script is not None:
        exe = bindir / "nvidia-smi"
        exe.write_text("#!/bin/sh\n" + smi_script)
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    system = [p for p in os.environ.get("PATH", "").split(os.pathsep)
              if keep_path and not (Path(p) / "nvidia-smi").exists()]
    env["PATH"] = os.pathsep.join([str(bindir), *system])
    paths = [str(ROOT)]
    if nvml_scenario is not None:
        shim = tmp_path / "fake-pynvml"
        shim.mkdir(exist_ok=True)
        (shim / "pynvml.py").write_text(_SHIM.format(tests=str(TESTS)))
        paths.insert(0, str(shim))
        env["TOPOPROF_TEST_NVML_SCENARIO"] = nvml_scenario
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env
