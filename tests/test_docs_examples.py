"""The examples README.md and docs/ show are what the commands print now (`tests/docs_examples.py`),
and the check itself catches what it is there to catch."""
from __future__ import annotations

from pathlib import Path

import docs_examples as de
import pytest
from helpers.ci_torch import other_torch_than_ci

TOPO = "tests/fixtures/topo/24_rtx5090-2x-phb-threadripper.txt"


@pytest.mark.slow
@pytest.mark.skipif(other_torch_than_ci() is not None, reason=str(other_torch_than_ci()))
@pytest.mark.parametrize("example", de.find_examples(), ids=lambda e: e.where)
def test_every_documented_example_is_what_the_command_prints_now(example):
    """Each apart, as `python tests/docs_examples.py` checks them all."""
    outcome = de.check(example)
    assert outcome.ok, outcome.detail


def test_every_command_has_a_run_example():
    assert de.find_examples()
    assert not de.commands_without_example(de.find_examples())


def _doc(tmp_path: Path, text: str) -> list[de.Example]:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return de.find_examples([path])


def test_examples_are_found_with_how_each_is_checked(tmp_path):
    found = _doc(tmp_path, f"""
```
$ topoprof topo --from-file {TOPO}
topoprof topo: 2 GPU(s), 0 NIC(s)
```

<!-- recorded: CPU VM, 2026-11-26 -->
<!-- exit: 3 -->
```
$ topoprof scan --quick
```

<!-- recorded: NVIDIA H200, 2026-11-26; gpu -->
```console
$ topoprof scan
```

<!-- fake-nvml: pcie_pair -->
```
$ CUDA_VISIBLE_DEVICES=1 topoprof topo
```

<!-- excerpt: reports/gpu-nvidia-h200-20261126/summary.md -->
```
9 passed, 0 failed, 1 skipped.
```

```bash
$ python tests/docs_examples.py
pip install .
```
""")
    assert [(e.kind, e.exit_code, e.fake_nvml) for e in found] == [
        ("exact", 0, None), ("shape", 3, None), ("gpu", 0, None), ("exact", 0, "pcie_pair"), ("excerpt", 0, None)]
    assert found[0].expected == ("topoprof topo: 2 GPU(s), 0 NIC(s)",) and found[0].line == 2
    assert found[3].command == "CUDA_VISIBLE_DEVICES=1 topoprof topo"


def test_elided_lines_keep_the_rest_in_order():
    out = ["a", "b", "c", "d", "e"]
    same = str.__eq__
    assert de.align(["a", "...", "c", "...", "e"], out, same) == [0, 2, 4]
    assert de.align(["a", "b", "c", "d", "e"], out, same) == [0, 1, 2, 3, 4]
    assert de.align(["...", "d", "e"], out, same) == [3, 4]
    assert de.align(["a", "..."], out, same) == [0]
    assert de.align(["a", "...", "c", "b"], out, same) is None       # out of order
    assert de.align(["a", "b", "c"], out, same) is None              # cut without a `...`
    assert de.align(["b", "...", "e"], out, same) is None            # the first line is the output's first
    assert de.align(["a", "...", "d"], out, same) is None            # and the last its last
    assert de.align(["...", "x", "..."], out, same) is None          # a line that is not there
    assert de.align(["c", "d"], out, same, anchored=False) == [2, 3]  # an excerpt may start anywhere
    assert de.align([], ["printed"], same) is None


def test_what_varies_by_nature_is_replaced_and_nothing_else():
    line = ("topoprof scan: vm, 2026-11-26T00:35:34Z in reports/vm-20261126T025815Z/report.md; "
            "torch 2.13.0+cpu, topoprof 0.1.0, python 3.12.3")
    assert de.normalized(line) == ("topoprof scan: <host>, <time> in reports/<host>-<time>/report.md; "
                                   "torch <version>, topoprof <version>, python <version>")
    assert de.normalized("step 984.2 ms, 260.1 samples/s") == "step 984.2 ms, 260.1 samples/s"
    assert de.normalized("topoprof profile: AMD EPYC (25 GB") == "topoprof profile: <device> (25 GB"


def test_a_shape_ignores_the_timings_and_catches_a_renamed_column():
    doc = "ddp_synced                          763.7         684.0    617.3-750.8 out   -10.6%"
    now = "ddp_synced                         1162.0        1197.4   1051.2-1384.6 in    +3.4%"
    assert de.shape(doc) == de.shape(now)
    assert de.shape("GEMM (float32, 17 shapes, 245 MFLOP/s .. 17.5 GFLOP/s):") == \
        de.shape("GEMM (float32, 16 shapes, 2.1 GFLOP/s .. 9.9 GFLOP/s):")
    assert de.shape("mode   measured ms  predicted ms") != de.shape("mode   measured ms  modelled ms")
    assert de.shape("  ddp_synced  max |diff| 1.39e-17  agree") != de.shape("  ddp_synced  max |diff| 0.25  DIFFER")


def test_an_exact_example_that_differs_is_reported_with_a_diff(tmp_path):
    right, wrong, bad_exit = _doc(tmp_path, f"""
```
$ topoprof topo --from-file {TOPO}
topoprof topo: 2 GPU(s), 0 NIC(s)
...
Legend
  PHB  = through a PCIe host bridge (the CPU)
```

```
$ topoprof topo --from-file {TOPO}
topoprof topo: 2 GPU(s), 0 NIC(s)
...
Legend
  PHB  = through a PCIe switch
```

<!-- exit: 2 -->
```
$ topoprof topo --from-file {TOPO}
topoprof topo: 2 GPU(s), 0 NIC(s)
...
```
""")
    assert de.check(right).ok
    outcome = de.check(wrong)
    assert not outcome.ok and "+  PHB  = through a PCIe host bridge (the CPU)" in outcome.detail
    outcome = de.check(bad_exit)
    assert not outcome.ok and outcome.detail.startswith("exit 0, the docs say 2")


def test_an_excerpt_must_be_in_its_file_in_order(tmp_path):
    right, wrong, missing = _doc(tmp_path, """
<!-- excerpt: reports/gpu-nvidia-h200-20261126/summary.md -->
```
## Checks
...
9 passed, 0 failed, 1 skipped.
```

<!-- excerpt: reports/gpu-nvidia-h200-20261126/summary.md -->
```
9 passed, 0 failed, 0 skipped.
```

<!-- excerpt: reports/no-such-report.md -->
```
anything
```
""")
    assert de.check(right).ok
    assert not de.check(wrong).ok
    assert "no such file" in de.check(missing).detail


def test_write_keeps_the_cuts_and_takes_each_kept_line_from_the_output(tmp_path):
    (example,) = _doc(tmp_path, """
<!-- recorded: CPU VM, 2020-01-01 -->
```
$ topoprof scan --quick
topoprof scan: gloo; report in reports/vm-20200101T000000Z/report.md (9.9 s)
...
  bandwidth: peak busbw 1.0 GB/s
```
""")
    raw = ("topoprof scan: gloo; report in reports/vm-20261126T030052Z/report.md (11.7 s)", "  banner",
           "  bandwidth: peak busbw 0.396 GB/s")
    outcome = de.Outcome(example, False, 1.0, "", raw)
    assert de.refreshed(outcome) == [raw[0], "...", raw[2]]
    assert de.write([outcome], recorded=False)  # a recorded example is kept unless asked
    assert "2020-01-01" in (tmp_path / "doc.md").read_text()
    assert de.write([outcome], recorded=True) == []
    text = (tmp_path / "doc.md").read_text()
    assert raw[0] in text and raw[2] in text and "..." in text and "2020-01-01" not in text


def test_a_command_without_a_run_example_is_named(tmp_path):
    examples = _doc(tmp_path, f"""
```
$ topoprof topo --from-file {TOPO}
```
""")
    missing = de.commands_without_example(examples)
    assert "topo" not in missing and {"bench", "model", "validate", "scan", "report", "profile"} <= set(missing)
