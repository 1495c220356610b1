"""The GPUs a job is given, not the node's first ones: CUDA_VISIBLE_DEVICES read as CUDA reads it
(indices, UUIDs and their unique prefixes, MIG devices, the first invalid entry ending the list),
CUDA's own UUID and PCI bus id of each device winning over it, and every place a torch device is
tied to a GPU: the topology's marks, copies, memory, the ranks' ring, the one-GPU what-if."""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from fake_nvml import make_fake_nvml
from helpers.cli import topoprof
from helpers.fake_driver import driver_env

from topoprof.jsonio import to_jsonable
from topoprof.probes.hardware.nvml import query_nvml
from topoprof.topology.build import build_topology
from topoprof.topology.visible import JobView, identify, job_gpu, job_gpus

NODE = "pcie_l40s_l4_8x"  # GPUs 0-3 L40S (46068 MiB), 4-7 L4 (23034 MiB), GPU 6 at x8
MIB = 1024 * 1024
GPU6 = "GPU-8f2a1c3e-9b4d-4e2f-a1c7-6d5e3b2a9f10"  # GPU 2's starts "GPU-8f2b": "GPU-8f2" names both
GPU2 = "GPU-8f2b77d0-5c1e-4a0b-9d3e-2f6a8c1b0e47"


@pytest.fixture(scope="module")
def node():
    return build_topology(nvml=query_nvml(make_fake_nvml(NODE)))


def _gpus(view: JobView) -> list:
    return [d.gpu for d in view.devices]


def _for_job(node, monkeypatch, setting, order="PCI_BUS_ID"):
    from topoprof.topology.collect import for_this_job

    for name, value in (("CUDA_VISIBLE_DEVICES", setting), ("CUDA_DEVICE_ORDER", order)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    return for_this_job(node)


# ---- the rules, on the node's GPUs as NVML lists them --------------------------------------------


def test_indices_choose_and_order_the_gpus(node):
    assert node.gpus[6].uuid == GPU6 and node.gpus[2].uuid == GPU2  # NVML's UUID kept per GPU
    view = job_gpus("6,2", node.gpus, "PCI_BUS_ID")
    assert [(d.ordinal, d.gpu, d.entry) for d in view.devices] == [(0, 6, "6"), (1, 2, "2")]
    assert view.notes == ()
    assert _gpus(job_gpus(None, node.gpus)) == list(range(8))   # unset: every GPU, in PCI order
    assert job_gpus(None, node.gpus).notes == ()
    assert job_gpus("", node.gpus).devices == ()               # set but empty: no GPU at all
    assert _gpus(job_gpus(" 5 ", node.gpus)) == [5]
    assert _gpus(job_gpus("1gpu2,3", node.gpus)) == [1, 3]     # read as strtoul reads it


def test_the_first_invalid_entry_ends_the_list(node):
    view = job_gpus("0,2,-1,1", node.gpus, "PCI_BUS_ID")    # the CUDA guide's own example
    assert _gpus(view) == [0, 2]
    (note,) = view.notes
    assert "entry 3 ends the list, '-1' is not a GPU index" in note and "ignores the 1 after it" in note
    view = job_gpus("3,9,1", node.gpus, "PCI_BUS_ID")
    assert _gpus(view) == [3] and "there is no GPU 9 (this node has 8)" in view.notes[0]
    # the first entry sets the kind: a UUID after indices ends the list, and an index after UUIDs
    assert _gpus(job_gpus(f"4,{GPU6}", node.gpus, "PCI_BUS_ID")) == [4]
    assert _gpus(job_gpus(f"{GPU6},4", node.gpus)) == [6]


def test_a_gpu_named_twice_leaves_no_device(node):
    for setting in ("2,2", f"{GPU6},GPU-8f2a"):
        view = job_gpus(setting, node.gpus, "PCI_BUS_ID")
        assert view.devices == () and "named twice" in view.notes[0] and "no device at all" in view.notes[0]


def test_uuids_whole_or_by_a_prefix_only_one_gpu_has(node):
    view = job_gpus(f"{GPU6},GPU-8f2b", node.gpus)
    assert _gpus(view) == [6, 2] and view.notes == ()
    assert view.devices[0].basis == "UUID" and view.devices[1].basis == f"UUID prefix of {GPU2}"
    assert _gpus(job_gpus(node.gpus[4].uuid.upper(), node.gpus)) == [4]
    # "GPU-8f2" starts both GPU 2's and GPU 6's: CUDA cannot tell them apart, the list ends there
    view = job_gpus(f"{node.gpus[1].uuid},GPU-8f2,{GPU6}", node.gpus)
    assert _gpus(view) == [1]
    assert "GPU-8f2 is the start of 2 GPUs' UUIDs (GPUs 2, 6)" in view.notes[0]
    view = job_gpus("GPU-00000000", node.gpus)
    assert view.devices == () and "GPU-00000000 starts no GPU's UUID" in view.notes[0]


def test_mig_devices_map_to_their_gpu_where_it_can_be_known(node):
    view = job_gpus(f"MIG-{GPU6}/1/0,MIG-GPU-8f2b/2/0", node.gpus)
    assert [(d.gpu, d.mig) for d in view.devices] == [(6, True), (2, True)]
    assert view.devices[0].basis.startswith("MIG device of GPU 6")
    # a MIG device's own UUID says nothing of its GPU without NVML's MIG handles: unknown, and
    # still a device, so the next entry is cuda:1
    view = job_gpus(f"MIG-5c0ffee0-1111-2222-3333-444455556666,MIG-{GPU2}/1/0", node.gpus)
    assert [(d.ordinal, d.gpu, d.mig) for d in view.devices] == [(0, None, True), (1, 2, True)]
    assert "MIG handles" in view.devices[0].basis
    # two slices of one GPU are two devices; the same slice twice is a duplicate
    assert len(job_gpus(f"MIG-{GPU6}/1/0,MIG-{GPU6}/2/0", node.gpus).devices) == 2
    assert job_gpus(f"MIG-{GPU6}/1/0,MIG-{GPU6}/1/0", node.gpus).devices == ()
    # without NVML there is no UUID to match: unknown, with the reason
    bare = [SimpleNamespace(index=g.index, uuid=None, pci_bus_id=None, name=None) for g in node.gpus]
    (device,) = job_gpus(f"MIG-{GPU6}/1/0", bare).devices
    assert device.gpu is None and "no GPU UUID is known" in device.basis


def test_indices_on_a_node_of_two_models_count_in_cuda_device_order(node):
    (note,) = job_gpus("6,2", node.gpus, None).notes
    assert "CUDA_DEVICE_ORDER=FASTEST_FIRST (the default)" in note and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in note
    assert job_gpus("6,2", node.gpus, "PCI_BUS_ID").notes == ()
    assert job_gpus(f"{GPU6}", node.gpus, None).notes == ()    # a UUID names one GPU in any order
    one_model = [SimpleNamespace(index=i, uuid=None, pci_bus_id=None, name="NVIDIA H100") for i in range(4)]
    assert job_gpus("3,1", one_model, None).notes == ()


def test_cudas_own_uuid_or_bus_id_wins_over_the_variable(node):
    read = job_gpus("6,2", node.gpus, None)
    # torch prints cudaDeviceProp.uuid bare; the bus id is NVML's form
    said = identify(read, [(GPU6[4:], None), (None, node.gpus[3].pci_bus_id.lower())], node.gpus)
    assert [(d.gpu, d.mig) for d in said.devices] == [(6, False), (3, False)]
    assert said.devices[0].basis == "CUDA's UUID of the device"
    assert any("cuda:1 is GPU 3 by CUDA's PCI bus id of the device, not GPU 2" in n for n in said.notes)
    # a MIG device has a UUID of its own but its GPU's bus id
    (mig,) = identify(JobView(()), [("0badc0de-0000-4000-8000-000000000000", node.gpus[5].pci_bus_id)],
                      node.gpus).devices
    assert (mig.gpu, mig.mig) == (5, True)
    # nothing matches: the variable's reading stands; no identities: nothing changes
    kept = identify(read, [("ffffffff-0000-0000-0000-000000000000", None), (None, None)], node.gpus)
    assert _gpus(kept) == [6, 2]
    assert identify(read, [], node.gpus) is read


# ---- the topology marks the job's GPUs ------------------------------------------------------------


def test_topo_marks_the_jobs_gpus_in_text_and_json(node, monkeypatch):
    from topoprof.topology.load import topology_from_dict
    from topoprof.topology.render import render_topology

    topo = _for_job(node, monkeypatch, "6,2")
    text = render_topology(topo)
    assert "* = visible to this job (CUDA_VISIBLE_DEVICES=6,2): cuda:0 = GPU6, cuda:1 = GPU2" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("GPU") and "NVIDIA" in line}
    assert set(rows) == {"GPU0", "GPU1", "GPU2*", "GPU3", "GPU4", "GPU5", "GPU6*", "GPU7"}  # the whole node
    assert rows["GPU6*"].split()[1] == "cuda:0" and rows["GPU2*"].split()[1] == "cuda:1"
    assert rows["GPU6*"].split()[3] == "L4" and "Gen4x8 / Gen4x8" in rows["GPU6*"]
    data = to_jsonable(topo)
    assert data["visible_devices"] == "6,2" and [d["gpu"] for d in data["job_gpus"]] == [6, 2]
    assert topology_from_dict(json.loads(json.dumps(data))) == topo  # a saved report reads back the same
    # unset: every GPU is the job's, nothing extra printed
    plain = render_topology(_for_job(node, monkeypatch, None))
    assert "this job" not in plain and "*" not in plain and plain == render_topology(node)


def test_a_topology_json_that_does_not_read_is_one_line_naming_the_file_and_the_key(node, tmp_path):
    from topoprof.errors import InputError
    from topoprof.topology.load import topology_from_file

    data = to_jsonable(node)
    data["gpus"][1]["index"] = "one"
    path = tmp_path / "topo.json"
    path.write_text(json.dumps({"kind": "topology", "topology": data}))
    with pytest.raises(InputError) as err:
        topology_from_file(str(path))
    assert str(err.value) == (f"{path}: topology JSON does not match this version: topology.gpus[1].index: "
                              'expected an integer, got "one"')
    data["gpus"][1]["index"] = 1
    path.write_text(json.dumps({"kind": "topology", "topology": data}))
    assert topology_from_file(str(path)) == node


def test_topo_command_marks_the_jobs_gpus_without_torch(tmp_path):
    env = driver_env(tmp_path, nvml_scenario=NODE)
    env.update(CUDA_VISIBLE_DEVICES=f"GPU-8f2a,{GPU2[:12]}")  # unique UUID prefixes
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "topoprof", "topo"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert imported and not any(name.split(".")[0] == "torch" for name in imported)
    assert (f"* = visible to this job (CUDA_VISIBLE_DEVICES=GPU-8f2a,{GPU2[:12]}): cuda:0 = GPU6, cuda:1 = GPU2"
            in proc.stdout)
    doc = json.loads(topoprof("topo", "--json", env=env, timeout=120).stdout)
    assert [(d["ordinal"], d["gpu"]) for d in doc["topology"]["job_gpus"]] == [(0, 6), (1, 2)]


def test_scan_report_marks_the_jobs_gpus(node, monkeypatch):
    from topoprof.report.markdown import _topology
    from topoprof.report.scan_report import read_scan_parts

    def saved(topology):  # as a report.json holds it, read back
        return read_scan_parts(json.loads(json.dumps(to_jsonable({"topology": topology,
                                                                  "probes": [{"name": "NVML", "status": "OK"}]}))))

    md = "\n".join(_topology(saved(_for_job(node, monkeypatch, "6,2"))))
    assert "| GPU6\\* | cuda:0 | NVIDIA L4 |" in md and "| GPU0 | – | NVIDIA L40S |" in md
    assert "\\* = visible to this job (`CUDA_VISIBLE_DEVICES=6,2`): cuda:0 = GPU6, cuda:1 = GPU2." in md
    plain = "\n".join(_topology(saved(node)))
    assert "this job" not in plain and "\\*" not in plain


# ---- every place a torch device is tied to a GPU ----------------------------------------------------


def _copies_doc(gbps: float) -> dict:
    return {"status": "ok", "measurements": [
        {"kind": "h2d", "src": "host", "dst": "cuda:0", "size_bytes": 1 << 28, "bandwidth_gbps": gbps, "p2p": None},
        {"kind": "d2h", "src": "cuda:1", "dst": "host", "size_bytes": 1 << 28, "bandwidth_gbps": gbps, "p2p": None}]}


def _copies(gbps: float):
    from topoprof.jsonio import from_jsonable
    from topoprof.measure.bench import CopiesReport

    return from_jsonable(CopiesReport, _copies_doc(gbps))


def test_copies_are_judged_against_the_link_of_the_gpu_cuda_i_is(node, monkeypatch):
    from topoprof.report.markdown import _copies as copies_md
    from topoprof.report.scan_report import read_scan_parts
    from topoprof.report.verdict import copy_verdicts
    from topoprof.topology.load import topology_from_dict

    topo = _for_job(node, monkeypatch, "6,2")
    # 20 GB/s: fine on GPU 6's eight lanes, low on GPU 2's (or GPU 0's) sixteen
    first, second = copy_verdicts(_copies(20.0), topo)
    assert (first.device, first.gpu, first.link, first.status) == ("cuda:0", 6, "Gen4 x8", "ok")
    assert (second.device, second.gpu, second.link, second.status) == ("cuda:1", 2, "Gen4 x16", "low")
    md = "\n".join(copies_md(read_scan_parts({"copies": _copies_doc(20.0), "topology": to_jsonable(topo)})))
    assert "| GPU6 (cuda:0) | h2d |" in md and "| GPU2 (cuda:1) | d2h |" in md
    # a report written before job_gpus were kept: cuda:i read as GPU i, as then
    old = {k: v for k, v in to_jsonable(topo).items() if k not in ("job_gpus", "visible_devices")}
    assert copy_verdicts(_copies(20.0), topology_from_dict(old))[0].link == "Gen4 x16"


def test_the_scan_ties_devices_by_what_cuda_said_in_the_copies(node, monkeypatch):
    from topoprof.topology.collect import identified

    topo = _for_job(node, monkeypatch, "6,2", order=None)
    said = identified(topo, [(GPU6[4:], node.gpus[6].pci_bus_id), (None, node.gpus[2].pci_bus_id)])
    assert [(d.gpu, d.basis) for d in said.job_gpus] == [(6, "CUDA's UUID of the device"),
                                                         (2, "CUDA's PCI bus id of the device")]
    assert said.notes == topo.notes and identified(topo, []) is topo


def test_memory_and_name_are_those_of_the_gpu_cuda_0_is(node, monkeypatch):
    from topoprof.scan import pipeline
    from topoprof.scan.pipeline import _predictions

    seen = {}
    monkeypatch.setattr(pipeline, "predictions", lambda *args, **kw: seen.update(args=args) or [])
    opts = SimpleNamespace(nproc=2, backend="nccl")
    _predictions(opts, SimpleNamespace(rows=[]), SimpleNamespace(calibration=None), None,
                 _for_job(node, monkeypatch, "6,2"))
    *_, name, _rows, _levels, memory, origin = seen["args"]
    assert (name, memory, origin) == ("NVIDIA L4", 23034 * MIB, "NVML, GPU6")
    # a MIG device: a slice, whose memory is not its GPU's
    _predictions(opts, SimpleNamespace(rows=[]), SimpleNamespace(calibration=None), None,
                 _for_job(node, monkeypatch, f"MIG-{GPU6}/1/0"))
    assert seen["args"][5] is None and seen["args"][8] is None


def test_gpu_memory_bytes_reads_the_gpu_cuda_i_is(monkeypatch):
    from topoprof.model.inputs.user_model import gpu_memory_bytes

    monkeypatch.setattr("topoprof.probes.hardware.nvml._pynvml", make_fake_nvml(NODE))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,2")
    assert gpu_memory_bytes("cuda:0") == 23034 * MIB and gpu_memory_bytes("cuda:1") == 46068 * MIB
    assert gpu_memory_bytes("cuda:2") is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"MIG-{GPU6}/1/0")
    assert gpu_memory_bytes("cuda:0") is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_memory_bytes("cuda:0") == 46068 * MIB


def test_the_ranks_gpus(node, monkeypatch):
    from topoprof.scan.pipeline import used_gpus

    assert used_gpus(_for_job(node, monkeypatch, "6,2"), 2, "nccl") == [6, 2]
    assert used_gpus(_for_job(node, monkeypatch, f"{GPU6},GPU-8f2b"), 2, "nccl") == [6, 2]
    assert used_gpus(_for_job(node, monkeypatch, None), 3, "nccl") == [0, 1, 2]
    assert used_gpus(_for_job(node, monkeypatch, "6,2"), 2, "gloo") == []
    # a MIG device or an unknown one: no nominal ring over the others
    assert used_gpus(_for_job(node, monkeypatch, f"MIG-{GPU6}/1/0,MIG-{GPU2}/1/0"), 2, "nccl") == []
    # each rank's own device, as CUDA named it, wins: ranks of rank 0's node only
    ranks = [{"node": "node0 (a)", "device_uuid": node.gpus[7].uuid[4:], "device_bus_id": None},
             {"node": "node0 (a)", "device_uuid": None, "device_bus_id": node.gpus[4].pci_bus_id},
             {"node": "node1 (b)", "device_uuid": node.gpus[0].uuid[4:], "device_bus_id": None}]
    assert used_gpus(_for_job(node, monkeypatch, "6,2"), 3, "nccl", ranks) == [7, 4]


def test_one_gpu_what_if_applies_to_the_jobs_one_gpu(node, monkeypatch):
    from topoprof.scan import pipeline
    from topoprof.scan.pipeline import _what_ifs

    asked = []
    monkeypatch.setattr(pipeline, "single_gpu_what_ifs", lambda opts, gpu: asked.append(gpu) or {"label": "x"})
    opts = SimpleNamespace(nproc=1)
    result, status = _what_ifs(opts, _for_job(node, monkeypatch, "5"))
    assert status.status == "ok"
    assert [(g.index, g.name, g.memory_total_bytes) for g in asked] == [(5, "NVIDIA L4", 23034 * MIB)]
    assert _what_ifs(opts, _for_job(node, monkeypatch, None)) == (None, None)  # 8 GPUs: not one
    assert _what_ifs(opts, _for_job(node, monkeypatch, "5,6")) == (None, None)
    skipped, status = _what_ifs(opts, _for_job(node, monkeypatch, f"MIG-{GPU6}/1/0"))
    assert status.status == "skipped" and "MIG device of GPU 6" in skipped["skipped"] and len(asked) == 1
    gpu, why = job_gpu(_for_job(node, monkeypatch, "9"), 0)
    assert gpu is None and "no cuda:0" in why


def test_cudas_identity_of_a_device_in_nvmls_form(node):
    """probes/hardware/cuda_ids.py on a stand-in for torch (this test machine has no GPU): the bare UUID
    torch prints and the bus id from its pci_* fields tie cuda:0 to NVML's GPU 6."""
    from topoprof.probes.hardware.cuda_ids import device_identity

    def torch_with(**props):
        cuda = SimpleNamespace(get_device_properties=lambda device: SimpleNamespace(**props))
        return SimpleNamespace(cuda=cuda)

    said = device_identity(torch_with(uuid=GPU6[4:], pci_domain_id=0, pci_bus_id=0xBC, pci_device_id=0), "cuda:0")
    assert said == (GPU6[4:], "00000000:BC:00.0")
    assert [d.gpu for d in identify(JobView(()), [said], node.gpus).devices] == [6]
    assert device_identity(torch_with(uuid=GPU6[4:]), "cuda:0") == (GPU6[4:], None)  # an older torch


@pytest.mark.slow
def test_a_one_gpu_job_on_an_eight_gpu_node_gets_its_gpus_what_if(tmp_path):
    """End to end (CPU ranks, the 8-GPU node's NVML faked): CUDA_VISIBLE_DEVICES=5 makes the job
    one L4, so the report shows the whole node with GPU 5 marked, and the what-if of L4s."""
    env = driver_env(tmp_path, nvml_scenario=NODE)
    env["CUDA_VISIBLE_DEVICES"] = "5"
    out = tmp_path / "report"
    proc = topoprof("scan", "--backend", "gloo", "--nproc", "1", "--quick", "--preset", "gpt2", "--micro-batch-time",
                    "0.03", "--out", str(out), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report, md = json.loads((out / "report.json").read_text()), (out / "report.md").read_text()
    assert [d["gpu"] for d in report["topology"]["job_gpus"]] == [5] and len(report["topology"]["gpus"]) == 8
    assert "| GPU5\\* | cuda:0 | NVIDIA L4 |" in md
    cases = report["what_if"]["cases"]
    assert cases and all("NVIDIA L4" in c["label"] for c in cases if c["kind"] != "network")


def test_whether_gpu_names_this_machines_gpu_is_read_from_nvml_without_torch(tmp_path):
    """`model --gpu X` asks whether X is the GPU here (then it is timed, else a what-if) in the
    command's own process: NVML answers, for the job's cuda:0, and torch is not imported."""
    env = driver_env(tmp_path, nvml_scenario=NODE)
    env["CUDA_VISIBLE_DEVICES"] = "5"
    script = ("import sys; from topoprof.model.inputs.user_model import names_this_gpu; "
              "print(names_this_gpu('l4'), names_this_gpu('l40s'), 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False", "False"]
