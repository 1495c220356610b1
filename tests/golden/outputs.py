"""What a user sees from a fixed set of commands, kept as files so that a change of the code's
layout can be shown to change none of it.

    python tests/golden/outputs.py           check every output against its file (exit 1 on a drift)
    python tests/golden/outputs.py --write   write the files anew (after a change meant to alter them)

The set: `topo --json` on every saved `nvidia-smi topo -m` fixture; `model --json` (and the text of
a few, rendered from the same run as the command renders it) on presets, `--params`, a `--model`,
the FSDP modes, a `--gpu` what-if, a topology and a multi-node job; `report` on the committed H200
scan. Nothing here times anything on this machine,
so each output depends on the code alone. What differs from run to run by nature (the time, the
host, the versions of the tool and of torch) is replaced by a placeholder before comparing.
`tests/test_golden.py` runs the check.
"""
from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # run as a script too: the checkout, and the tests' helpers
from helpers import cli_server  # noqa: E402 - found through the path set above
from helpers.cli import ModelRun  # noqa: E402 - found through the path set above

HERE = Path(__file__).resolve().parent / "outputs"
FIXTURES = ROOT / "tests" / "fixtures" / "topo"
SCAN = ROOT / "reports" / "gpu-nvidia-h200-20261126" / "scan-standalone" / "report.json"
DGX_A100 = str(FIXTURES / "07_dgx-a100-8x-nv12-12mlx5-rawnames.txt")
TIED = str(ROOT / "tests" / "fixtures" / "user_models" / "tied.py") + ":build"

# name: the command's arguments after `topoprof`
MODEL = {
    "model-gpt2-8gpu": ["--preset", "gpt2", "--micro-batch-time", "0.05", "--world-size", "8",
                        "--link-bandwidth", "100", "--accum", "4"],
    "model-bert-pcie": ["--preset", "bert-base", "--micro-batch-time", "0.02", "--micro-batch-size", "8",
                        "--world-size", "4", "--link-bandwidth", "12", "--optimizer-time", "0.004"],
    "model-params-1.3b": ["--params", "1.3B", "--micro-batch-time", "0.2", "--world-size", "8",
                          "--link-bandwidth", "50", "--accum", "8", "--gpu", "a100-sxm4-80gb"],
    "model-user-tied": ["--model", TIED, "--micro-batch-time", "0.01", "--optimizer-time", "0.002",
                        "--backward-fraction", "0.7", "--world-size", "2",
                        "--link-bandwidth", "10"],
    "model-fsdp-llama": ["--preset", "llama-7b", "--micro-batch-time", "0.5", "--world-size", "8",
                         "--link-bandwidth", "450", "--tokens", "4096", "--fsdp-param-dtype", "fp32",
                         "--fsdp-reduce-dtype", "bf16", "--gpu", "h100-sxm"],
    "model-fsdp-unit": ["--preset", "gpt2", "--micro-batch-time", "0.05", "--world-size", "4",
                        "--link-bandwidth", "100", "--fsdp-unit", "transformer.h"],
    "model-whatif-gpt2-h100": ["--preset", "gpt2", "--gpu", "h100-sxm", "--tokens", "1024", "--world-size", "8",
                               "--link-bandwidth", "450"],
    "model-whatif-resnet50-v100": ["--preset", "resnet50", "--gpu", "v100-sxm2", "--precision", "fp16",
                                   "--micro-batch-size", "64", "--world-size", "8", "--link-bandwidth", "20"],
    "model-topology-a100": ["--preset", "gpt2-medium", "--micro-batch-time", "0.08", "--topology", DGX_A100,
                            "--gpus", "0,1,2,3", "--gpu", "a100-sxm4-80gb"],
    "model-multinode-llama": ["--preset", "llama-7b", "--micro-batch-time", "0.5", "--nodes", "4",
                              "--gpus-per-node", "8", "--link-bandwidth", "450", "--network-bandwidth", "50",
                              "--tokens", "4096", "--accum", "16"],
}
TEXT = ("model-gpt2-8gpu", "model-whatif-gpt2-h100", "model-multinode-llama", "model-fsdp-llama")


def commands() -> dict[str, list[str]]:
    """Every `topo` output's name and its command line."""
    return {f"topo-{path.stem}": ["topo", "--from-file", str(path), "--json"] for path in sorted(FIXTURES.glob("*.txt"))
            if not path.name.endswith(".nccl-tests.txt")}


_VOLATILE = (
    (re.compile(r'"created_utc": "[^"]*"'), '"created_utc": "<time>"'),
    (re.compile(r'"host": "[^"]*"'), '"host": "<host>"'),
    (re.compile(r'("name": "topoprof",\s*"version": )"[^"]*"'), r'\1"<version>"'),
    (re.compile(r'"torch(_version)?": "[^"]*"'), r'"torch\1": "<torch>"'),
)


def normalized(text: str) -> str:
    """The output with its time, host and versions replaced, and this checkout's path made relative."""
    text = text.replace(str(ROOT) + os.sep, "")
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


# Selective op checkpointing's host cost per op is measured on the machine that models it
# (topoprof/trace/selective_cost.py); stated here, as measured on the CPU these files were written
# on (x4.2: 5.8 us under its modes over 1.38 us per recorded op, torch 2.13 CPU).
STATED = {"TOPOPROF_SELECTIVE_CHECKPOINT_RATIO": "4.2"}


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return cli_server.run(args, cwd=ROOT, timeout=600, env={**os.environ, **STATED}, text=True)


def _kept(proc: subprocess.CompletedProcess, stdout: str) -> str:
    return normalized(f"exit {proc.returncode}\n--- stdout\n{stdout}--- stderr\n{proc.stderr}")


def run(args: list[str]) -> str:
    proc = _run(args)
    return _kept(proc, proc.stdout)


def model_outputs(name: str, args: list[str]) -> dict[str, str]:
    """`model ARGS --json`, and for the names in TEXT its text from the same run: `topoprof model`
    renders its text from the document it prints with --json, through the same reader
    (`topoprof/commands/model.py`), so one run shows both (the same exit and stderr)."""
    proc = _run(["model", *args, "--json"])
    found = {name: _kept(proc, proc.stdout)}
    if name in TEXT:
        text = ModelRun(proc.returncode, proc.stdout, proc.stderr).text if proc.returncode == 0 else proc.stdout
        found[f"{name}-text"] = _kept(proc, text)
    return found


def report_output() -> str:
    """`topoprof report` on the committed H200 scan: the Markdown it writes, and its exit."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = cli_server.run(["report", str(SCAN), "--out", tmp], cwd=ROOT, timeout=600, text=True)
        markdown = (Path(tmp) / "report.md").read_text() if (Path(tmp) / "report.md").exists() else ""
        return normalized(f"exit {proc.returncode}\n--- stdout\n{proc.stdout.replace(tmp, '<out>')}--- report.md\n"
                          f"{markdown}")


def groups() -> dict[str, Callable[[], dict[str, str]]]:
    """The outputs in groups that run apart (a test each): every `topo` output together (each
    under a second), each `model` command with its text, and the report."""
    found: dict[str, Callable[[], dict[str, str]]] = {
        "topo": lambda: {name: run(args) for name, args in commands().items()}}
    for name, args in MODEL.items():
        found[name] = functools.partial(model_outputs, name, args)
    found["report-h200-scan"] = lambda: {"report-h200-scan": report_output()}
    return found


def names() -> set[str]:
    """The name of every output the groups give, without running them."""
    return {*commands(), *MODEL, *(f"{name}-text" for name in TEXT), "report-h200-scan"}


def outputs() -> dict[str, str]:
    found: dict[str, str] = {}
    for group in groups().values():
        found.update(group())
    return found


def drifts(found: dict[str, str]) -> list[str]:
    """A unified diff per output that differs from its file (or has none)."""
    out = []
    for name, text in found.items():
        path = HERE / f"{name}.txt"
        kept = path.read_text() if path.exists() else ""
        if kept != text:
            diff = difflib.unified_diff(kept.splitlines(True), text.splitlines(True), f"kept/{name}", f"now/{name}",
                                        n=2)
            out.append("".join(list(diff)[:80]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the files anew")
    args = parser.parse_args()
    found = outputs()
    if args.write:
        HERE.mkdir(exist_ok=True)
        for name, text in found.items():
            (HERE / f"{name}.txt").write_text(text)
        print(f"wrote {len(found)} outputs in {HERE}")
        return 0
    bad = drifts(found)
    print("\n".join(bad) if bad else f"all {len(found)} outputs as kept")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
