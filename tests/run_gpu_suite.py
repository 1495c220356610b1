"""Run every GPU check on this machine and write one summary: `python tests/run_gpu_suite.py`.

Runs `pytest -m gpu tests/test_gpu.py` (on a machine without a CUDA GPU every test is skipped,
with the reason) and writes, in `--out` (default reports/gpu-<host>-<UTC time>/):
  summary.md    the machine (GPUs, driver, torch, CUDA, NCCL), each check's outcome and what it
                measured
  summary.json  the same, for tools
  scan/         the report the end-to-end scan wrote (report.md, report.json, charts)
Exit code: pytest's (0 when every check passed or was skipped).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"({args[0]}: {err})"
    return (done.stdout or done.stderr).strip()


def machine() -> dict:
    facts = {"host": platform.node(), "python": platform.python_version(),
             "nvidia_smi_L": _run(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else "nvidia-smi not on PATH",
             "nvidia_smi_query": _run(["nvidia-smi", "--query-gpu=name,driver_version,pcie.link.gen.max,"
                                       "pcie.link.width.max,memory.total", "--format=csv"])
             if shutil.which("nvidia-smi") else ""}
    try:
        import torch

        facts.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                     gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
        if torch.cuda.is_available():
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as err:  # the summary still says what it could not learn
        facts["torch"] = f"unavailable: {err}"
    return facts


def outcomes(junit: Path) -> list[dict]:
    """Each test of the JUnit XML: name, outcome, the reason it failed or was skipped, its records."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "failed" if tag in ("failure", "error") else "skipped"
                reason = ((node.get("message") or node.text or "").strip().splitlines() or [""])[0][:400]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        out.append({"test": case.get("name"), "outcome": outcome, "reason": reason,
                    "seconds": round(float(case.get("time") or 0), 1), "measured": props})
    return out


def render(facts: dict, tests: list[dict], scan: bool) -> str:
    lines = [f"# topoprof GPU checks: {facts['host']}, {facts['created_utc']}", "",
             "Command: `python tests/run_gpu_suite.py`", "", "## Machine", "", "```",
             facts["nvidia_smi_L"], facts["nvidia_smi_query"], "```", "",
             f"torch {facts.get('torch')}, CUDA {facts.get('cuda')}, NCCL {facts.get('nccl', '-')}, "
             f"Python {facts['python']}; {facts.get('gpus', 0)} GPU(s) visible to torch.", "",
             "## Checks", "", "| check | outcome | seconds | measured / reason |", "|---|---|---|---|"]
    for t in tests:
        detail = "; ".join(f"{k}: {v}" for k, v in t["measured"].items()) if t["measured"] else ""
        detail = detail or t["reason"]
        if t["outcome"] == "failed" and t["reason"]:
            detail = f"{t['reason']}" + (f" ({detail})" if detail != t["reason"] else "")
        lines.append(f"| `{t['test']}` | {t['outcome']} | {t['seconds']} | {detail.replace('|', '/')} |")
    counts = {k: sum(1 for t in tests if t["outcome"] == k) for k in ("passed", "failed", "skipped")}
    lines += ["", f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped.", ""]
    if scan:
        lines += ["The scan's own report: [scan/report.md](scan/report.md).", ""]
    return "\n".join(lines)


def run_pytest(args: list[str], env: dict) -> int:
    """pytest's exit code. Stopped by TERM or INT (a time limit, Ctrl-C), pytest gets an interrupt
    of its own, which ends the test running and still writes the JUnit file, so the summary keeps
    every check that finished; one that does not end within GRACE_S is killed."""
    proc = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True)  # out of the group a limit kills
    stopped: list[float] = []

    def interrupt(signum, frame):
        stopped.append(time.monotonic())
        proc.send_signal(signal.SIGINT)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                return proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if stopped and time.monotonic() - stopped[0] > GRACE_S:
                    proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


GRACE_S = 8  # inside `timeout --kill-after=10`: the summary is written before the kill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stamp = datetime.datetime.now(datetime.timezone.utc)
    default = ROOT / "reports" / f"gpu-{platform.node() or 'host'}-{stamp.strftime('%Y%m%dT%H%M%SZ')}"
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    junit = out / "junit.xml"
    env = {**os.environ, "TOPOPROF_GPU_SUITE_OUT": str(out), "PYTHONUNBUFFERED": "1"}
    # the machine's facts first: a suite stopped at its time limit still writes its summary in the grace
    facts = {**machine(), "created_utc": stamp.strftime("%Y-%m-%dT%H:%M:%SZ")}
    code = run_pytest([sys.executable, "-m", "pytest", "-m", "gpu", str(ROOT / "tests" / "test_gpu.py"),
                       "-v", "-rs", "-p", "no:cacheprovider", f"--junitxml={junit}"], env)
    tests = outcomes(junit) if junit.exists() else []
    junit.unlink(missing_ok=True)
    summary = {"machine": facts, "tests": tests, "pytest_exit": code}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(render(facts, tests, (out / "scan" / "report.md").exists()))
    print(f"summary: {out / 'summary.md'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
