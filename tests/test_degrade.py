"""Every probe degrades, none ends the run: `topo` and `scan` against a fake driver (a scripted
`nvidia-smi` on PATH, a named fake NVML behind `import pynvml`), with sources missing, broken or
answering as the real H100 VM did."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.cli import topoprof
from helpers.fake_driver import driver_env, fixture_body

TOPO = Path(__file__).parent / "fixtures" / "topo"
H100_VM = TOPO / "28_h100-1x-vm-driver580-ansi-raw.txt"


def _cli(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return topoprof(*args, env=env, timeout=timeout)


def _probes(doc: dict) -> dict:
    probes = doc.get("probes") or doc["topology"]["probes"]
    return {p["name"]: p for p in probes}


def test_topo_on_the_h100_vm_as_its_driver_answered(tmp_path):
    env = driver_env(tmp_path, smi_output=fixture_body(H100_VM), nvml_scenario="h100_vm_1x")
    proc = _cli(env, "topo", "--json")
    assert proc.returncode == 0, proc.stderr
    topo = json.loads(proc.stdout)["topology"]
    (gpu,) = topo["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["compute_capability"] == [9, 0]
    assert (gpu["pcie_gen_max"], gpu["pcie_width_max"], gpu["numa_node"]) == (5, 16, 0)
    assert gpu["cpu_affinity"] == list(range(16))
    probes = _probes(json.loads(proc.stdout))
    assert probes["nvidia-smi"]["status"] == "ok" and probes["NVML"]["status"] == "ok"
    # What NVML could not answer on that VM is named, with the driver's reason.
    assert "nvlinks (NotSupported)" in probes["NVML"]["detail"]
    assert "gpu_numa_node (NotSupported)" in probes["NVML"]["detail"]


def test_unreadable_nvidia_smi_leaves_nvml_to_list_gpus_links_and_paths(tmp_path):
    env = driver_env(tmp_path, smi_output=b"\tGPU0\tGPU1\nGPU0\t X \t???\n", nvml_scenario="pcie_pair")
    proc = _cli(env, "topo", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    probes = _probes(doc)
    assert probes["nvidia-smi"]["status"] == "error" and "nvidia-smi topo -m:2:" in probes["nvidia-smi"]["detail"]
    topo = doc["topology"]
    assert [g["name"] for g in topo["gpus"]] == ["NVIDIA RTX A6000"] * 2
    assert [(g["pcie_gen_max"], g["pcie_width_max"]) for g in topo["gpus"]] == [(4, 16), (4, 16)]
    (pair,) = topo["pairs"]
    assert pair["path"] == "PHB" and pair["p2p"] == "no"  # the path from NVML's common ancestor


def test_nvml_alone_finds_nvlink_peers(tmp_path):
    env = driver_env(tmp_path, nvml_scenario="dgx_h100_nvswitch")  # no nvidia-smi on PATH
    proc = _cli(env, "topo", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert _probes(doc)["nvidia-smi"]["status"] == "unavailable"
    pairs = doc["topology"]["pairs"]
    assert len(pairs) == 28 and all(p["path"] == "NV" and p["nvlinks"] == 18 and p["via_nvswitch"] for p in pairs)


def test_every_source_failing_still_describes_the_host(tmp_path):
    env = driver_env(tmp_path, smi_script="echo 'NVIDIA-SMI has failed because it could not communicate' \nexit 9\n",
                     nvml_scenario="driver_not_loaded")
    proc = _cli(env, "topo")
    assert proc.returncode == 0, proc.stderr
    assert "nvidia-smi: error (nvidia-smi topo -m failed (exit 9): NVIDIA-SMI has failed" in proc.stdout
    assert "NVML: unavailable (NVML unavailable: Driver Not Loaded" in proc.stdout
    assert "host: ok" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.parametrize("name, same_as", [
    ("28_h100-1x-vm-driver580-ansi-raw.txt", None),
    ("30_h100-sxm-8x-nv18-6nic-wrapped80-tmux.txt", "18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt"),
    ("31_h100-sxm-8x-nv18-6nic-joined80-tmux.txt", "18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt"),
    ("32_v100-sxm2-8x-ansi-in-cells-grep-color.txt", "03_v100-sxm2-8x-nv1nv2-nic0-gpunumaid.txt"),
    ("33_rtx4090-8x-affinity-variants-edited.txt", "20_rtx4090-8x-sys-2nic-gpunumaid.txt"),
    ("34_a100-8x-nv12-glued80-transcript.txt", "10_aws-p4d-24xlarge-a100-8x-nv12.txt"),
    ("35_rtx4090-8x-sys-2nic-glued100-transcript.txt", "20_rtx4090-8x-sys-2nic-gpunumaid.txt"),
    ("36_h100-sxm-8x-nv18-6nic-glued132-transcript.txt", "18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt"),
])
def test_topo_from_file_reads_real_and_dirty_outputs(tmp_path, name, same_as):
    def read(fixture):
        proc = _cli(driver_env(tmp_path), "topo", "--from-file", str(TOPO / fixture), "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["topology"]

    topo = read(name)
    if same_as is None:
        assert len(topo["gpus"]) == 1 and topo["pairs"] == []
        return
    clean = read(same_as)
    assert len(topo["gpus"]) == len(clean["gpus"])
    assert [(p["path"], p["nvlinks"]) for p in topo["pairs"]] == [(p["path"], p["nvlinks"]) for p in clean["pairs"]]
    assert topo["gpu_nic_paths"] == clean["gpu_nic_paths"]
    if "glued" in name:  # a glued copy loses nothing: the affinity comes back whole as well
        assert [(g["numa_node"], g["cpu_affinity"]) for g in topo["gpus"]] == [
            (g["numa_node"], g["cpu_affinity"]) for g in clean["gpus"]]


# ---- scan: a full report whatever is missing ---------------------------------------------------------


def _scan(env: dict, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    proc = _cli(env, "scan", "--quick", "--no-validate", "--out", str(out), *extra)
    assert (out / "report.json").exists(), proc.stderr
    return proc, json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_scan_with_a_failing_nvidia_smi_and_no_nvml_writes_the_full_report(tmp_path):
    env = driver_env(tmp_path, smi_script="echo 'Failed to initialize NVML: Driver/library version mismatch' >&2\nexit "
                                          "18\n")
    proc, doc, md = _scan(env, tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    probes = _probes(doc)
    assert probes["nvidia-smi"]["status"] == "error"
    assert "Driver/library version mismatch" in probes["nvidia-smi"]["detail"]
    assert probes["NVML"]["status"] == "unavailable"
    assert probes["ranks"]["status"] == "ok" and doc["bench"]["rows"]
    assert "| nvidia-smi | error | nvidia-smi topo -m failed (exit 18): Failed to initialize NVML" in md
    assert set(doc["charts"]) >= {"busbw"}


def test_scan_with_nvml_missing_names_it(tmp_path):
    env = driver_env(tmp_path, nvml_scenario="no_driver")  # and no nvidia-smi on PATH
    proc, doc, md = _scan(env, tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    probes = _probes(doc)
    assert probes["nvidia-smi"]["status"] == "unavailable" and "not found on PATH" in probes["nvidia-smi"]["detail"]
    assert probes["NVML"]["status"] == "unavailable" and "LibraryNotFound" in probes["NVML"]["detail"]
    assert "| NVML | unavailable |" in md and "## Measured bandwidth" in md


def test_ranks_that_cannot_start_are_a_note_not_the_end(tmp_path):
    env = {**driver_env(tmp_path), "GLOO_SOCKET_IFNAME": "topoprof-no-such-if0"}
    proc, doc, md = _scan(env, tmp_path / "r", "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    ranks = _probes(doc)["ranks"]
    assert ranks["status"] == "error" and ranks["detail"].startswith("could not start: rank")
    assert doc["bench"]["rows"] == [] and "ranks: error: could not start" in proc.stdout
    assert "| ranks | error | could not start" in md and "Traceback" not in proc.stderr
