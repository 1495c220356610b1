"""topoprof.probes.hardware.nvml against the fake pynvml's named machines, and against the real pynvml on this host."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (HERE, ROOT):  # fake_nvml sits beside this file; probes/ and topoprof/ at the root
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fake_nvml import SCENARIOS, make_fake_nvml  # noqa: E402

from topoprof.errors import EXIT_NOTHING_MEASURED, NothingMeasured  # noqa: E402
from topoprof.probes.hardware.nvml import NvmlSnapshot, normalize_bus_id, query_nvml  # noqa: E402
from topoprof.topology.build import nvlink_pairs, nvswitch_links  # noqa: E402

MEASURABLE = [s for s in SCENARIOS if s not in ("no_driver", "driver_not_loaded")]
NOT_IN_BINDING = "FunctionNotFound (not in this pynvml)"


def snapshot(scenario: str, tweak=None) -> NvmlSnapshot:
    fake = make_fake_nvml(scenario)
    if tweak is not None:
        tweak(fake)
    return query_nvml(fake)


def raising(code: int):
    def fn(*args):
        raise pynvml.NVMLError(code)
    return fn


# ---- scenarios ------------------------------------------------------------------------------

def test_dgx_h100_nvswitch():
    snap = snapshot("dgx_h100_nvswitch")
    versions = (snap.driver_version, snap.nvml_version, snap.cuda_driver_version)
    assert versions == ("535.129.03", "12.535.129.03", 12020)
    assert snap.missing == {}
    assert len(snap.gpus) == 8
    for gpu in snap.gpus:
        assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.uuid.startswith("GPU-")
        assert gpu.compute_capability == (9, 0)
        assert gpu.memory_total_bytes == 81559 * 1024 * 1024
        assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_gen_gpu_max) == (5, 5, 5)
        assert (gpu.pcie_width_current, gpu.pcie_width_max) == (16, 16)
        assert gpu.numa_node == (0 if gpu.index < 4 else 1)
        assert len(gpu.cpu_affinity) == 112
        assert gpu.gpu_numa_node is None and gpu.missing == {"gpu_numa_node": "NotSupported"}
        assert not gpu.lost
        assert [link.link for link in gpu.nvlinks] == list(range(18))
        for link in gpu.nvlinks:
            assert (link.active, link.version, link.remote_device_type) == (True, 4, "switch")
            assert link.missing == {}
    assert snap.gpus[0].pci_bus_id == "00000000:18:00.0"
    assert snap.gpus[0].cpu_affinity[:2] == (0, 1) and 112 in snap.gpus[0].cpu_affinity
    assert len(snap.p2p) == 28
    assert {(p.read, p.nvlink, p.reason) for p in snap.p2p} == {("ok", "ok", None)}
    assert nvswitch_links(snap) == {i: 18 for i in range(8)}
    assert nvlink_pairs(snap) == {}


def test_pcie_pair_downtrained_idle_link_and_no_p2p():
    snap = snapshot("pcie_pair")
    assert [g.name for g in snap.gpus] == ["NVIDIA RTX A6000"] * 2
    assert [g.compute_capability for g in snap.gpus] == [(8, 6), (8, 6)]
    assert [g.pcie_gen_current for g in snap.gpus] == [4, 1]
    assert [g.pcie_gen_max for g in snap.gpus] == [4, 4]
    assert [g.pcie_width_current for g in snap.gpus] == [16, 16]
    for gpu in snap.gpus:
        assert gpu.nvlinks == ()
        assert gpu.missing["nvlinks"] == "NotSupported"
    (pair,) = snap.p2p
    assert (pair.gpu_a, pair.gpu_b, pair.read, pair.nvlink) == (0, 1, "chipset_not_supported", "not_supported")
    assert nvlink_pairs(snap) == {}
    assert nvswitch_links(snap) == {0: 0, 1: 0}


def test_nvlink_not_supported_t4():
    snap = snapshot("nvlink_not_supported")
    assert len(snap.gpus) == 4
    assert all(g.name == "Tesla T4" and g.compute_capability == (7, 5) for g in snap.gpus)
    assert all(g.nvlinks == () and g.missing["nvlinks"] == "NotSupported" for g in snap.gpus)
    assert [g.numa_node for g in snap.gpus] == [0, 1, 1, 1]
    reads = {(p.gpu_a, p.gpu_b): p.read for p in snap.p2p}
    assert reads[(1, 2)] == "ok" and reads[(0, 1)] == "topology_not_supported"
    assert {p.nvlink for p in snap.p2p} == {"not_supported"}
    assert nvlink_pairs(snap) == {}


def test_gpu_lost_is_a_row_not_an_exception():
    fake = make_fake_nvml("gpu_lost")
    snap = query_nvml(fake)
    assert len(snap.gpus) == 4
    lost = snap.gpus[2]
    assert lost.lost and lost.index == 2
    assert lost.name is None and lost.pci_bus_id is None and lost.nvlinks == ()
    assert lost.missing["name"] == lost.missing["nvlinks"] == lost.missing["cpu_affinity"] == "GpuIsLost"
    for gpu in (snap.gpus[0], snap.gpus[1], snap.gpus[3]):
        assert not gpu.lost and gpu.name == "NVIDIA A100-SXM4-80GB"
        down = [link for link in gpu.nvlinks if link.active is False]
        assert len(down) == 4  # the links to the fallen GPU
        assert all(link.missing["remote_bus_id"] == "LinkInactive" for link in down)
    with_lost = [p for p in snap.p2p if 2 in (p.gpu_a, p.gpu_b)]
    assert len(with_lost) == 3
    assert all(p.read is None and p.nvlink is None and "GpuIsLost" in p.reason for p in with_lost)
    assert nvlink_pairs(snap) == {(0, 1): 4, (0, 3): 4, (1, 3): 4}
    assert nvswitch_links(snap) == {0: 0, 1: 0, 3: 0}
    assert fake.fake_state.shutdowns == 1 and fake.fake_state.refcount == 0


def test_gpu_lost_at_handle():
    def lose_handle(fake):
        fake.fake_state.machine.gpus[1].lost_at_handle = True
    snap = snapshot("a100_nvlink_pairs", lose_handle)
    gpu = snap.gpus[1]
    assert gpu.lost and gpu.pci_bus_id is None and gpu.missing["pci_bus_id"] == "GpuIsLost"
    assert all(not g.lost for i, g in enumerate(snap.gpus) if i != 1)


def test_old_driver_missing_functions_and_bytes():
    snap = snapshot("old_driver")
    assert snap.driver_version == "418.87.01" and snap.cuda_driver_version == 10010
    for gpu in snap.gpus:
        assert gpu.name == "Tesla V100-SXM2-32GB"  # bytes from the old binding, decoded
        assert gpu.uuid.startswith("GPU-")
        assert gpu.pcie_gen_max == 3
        assert gpu.pcie_gen_gpu_max is None and gpu.missing["pcie_gen_gpu_max"] == NOT_IN_BINDING
        assert gpu.gpu_numa_node is None and gpu.missing["gpu_numa_node"] == NOT_IN_BINDING
        assert gpu.numa_node is None and gpu.missing["numa_node"] == "FunctionNotFound"
        assert len(gpu.nvlinks) == 6 and {link.version for link in gpu.nvlinks} == {2}
        for link in gpu.nvlinks:
            assert link.remote_device_type is None
            assert link.missing["remote_device_type"] == NOT_IN_BINDING
    # Legacy "0000:07:00.0" bytes normalized to NVML's current form.
    assert [g.pci_bus_id for g in snap.gpus] == ["00000000:07:00.0", "00000000:08:00.0",
                                                 "00000000:0E:00.0", "00000000:0F:00.0"]
    assert nvlink_pairs(snap) == {pair: 2 for pair in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]}
    assert nvswitch_links(snap) == {0: 0, 1: 0, 2: 0, 3: 0}


def test_switch_counted_by_bus_id_when_remote_type_is_missing():
    def to_switch(fake):
        fake.fake_state.machine.gpus[0].links[0].remote_bus_id = "00000000:C0:00.0"
    snap = snapshot("old_driver", to_switch)
    assert nvswitch_links(snap) == {0: 1, 1: 0, 2: 0, 3: 0}
    # GPU 1 still sees both of its links to GPU 0; the larger end's count is kept.
    assert nvlink_pairs(snap)[(0, 1)] == 2


def test_a100_nvlink_pairs():
    snap = snapshot("a100_nvlink_pairs")
    assert all(g.compute_capability == (8, 0) for g in snap.gpus)
    assert [g.numa_node for g in snap.gpus] == [1, 0, 3, 2]
    for gpu in snap.gpus:
        assert len(gpu.nvlinks) == 12
        assert {(link.active, link.version, link.remote_device_type) for link in gpu.nvlinks} == {(True, 3, "gpu")}
    assert nvlink_pairs(snap) == {pair: 4 for pair in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]}
    assert nvswitch_links(snap) == {0: 0, 1: 0, 2: 0, 3: 0}


def test_pairs_survive_one_unreadable_end():
    def hide_remotes(fake):
        fake.nvmlDeviceGetNvLinkRemotePciInfo = raising(pynvml.NVML_ERROR_NO_PERMISSION)
    snap = snapshot("a100_nvlink_pairs", hide_remotes)
    assert nvlink_pairs(snap) == {}
    assert snap.gpus[0].nvlinks[0].missing["remote_bus_id"] == "NoPermission"

    def hide_gpu3(fake):
        fake.fake_state.machine.gpus[3].links = None
    assert nvlink_pairs(snapshot("a100_nvlink_pairs", hide_gpu3))[(0, 3)] == 4


@pytest.mark.parametrize("scenario, words", [("no_driver", "Library Not Found"),
                                             ("driver_not_loaded", "Driver Not Loaded")])
def test_no_driver_raises_nothing_measured(scenario, words):
    fake = make_fake_nvml(scenario)
    with pytest.raises(NothingMeasured) as info:
        query_nvml(fake)
    message = str(info.value)
    assert message.startswith("NVML unavailable: ") and words in message
    assert "\n" not in message
    assert info.value.exit_code == EXIT_NOTHING_MEASURED
    assert fake.fake_state.inits == 0


# ---- failure handling -----------------------------------------------------------------------

@pytest.mark.parametrize("code, reason", [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, "NotSupported"),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, "FunctionNotFound"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "NoPermission"),
    (pynvml.NVML_ERROR_UNKNOWN, "Unknown"),
])
def test_each_nvml_error_becomes_none_and_reason(code, reason):
    def break_calls(fake):
        fake.nvmlDeviceGetCpuAffinity = raising(code)
        fake.nvmlSystemGetDriverVersion = raising(code)
    snap = snapshot("pcie_pair", break_calls)
    assert snap.driver_version is None and snap.missing == {"driver_version": reason}
    assert all(g.cpu_affinity is None and g.missing["cpu_affinity"] == reason for g in snap.gpus)
    assert all(g.name == "NVIDIA RTX A6000" for g in snap.gpus)


def test_empty_cpu_mask_is_missing_not_empty():
    # A cgroup-restricted job can see an empty "CPU Affinity" in `nvidia-smi topo -m`.
    def empty(fake):
        fake.fake_state.machine.gpus[0].cpus = []
    snap = snapshot("pcie_pair", empty)
    assert snap.gpus[0].cpu_affinity is None and snap.gpus[0].missing["cpu_affinity"] == "EmptyMask"
    assert snap.gpus[1].cpu_affinity == tuple(range(36))


def test_unknown_enum_values_are_not_guessed():
    def odd(fake):
        fake.fake_state.machine.gpus[0].links[0].version = 42
        fake.fake_state.machine.gpus[0].links[1].remote_type = 7
        fake.fake_state.machine.p2p = lambda a, b, index: 9
    snap = snapshot("a100_nvlink_pairs", odd)
    first, second = snap.gpus[0].nvlinks[:2]
    assert first.version is None and first.missing["version"] == "UnknownVersionEnum(42)"
    assert second.remote_device_type is None and second.missing["remote_device_type"] == "UnknownDeviceType(7)"
    assert snap.p2p[0].read is None and snap.p2p[0].nvlink is None
    assert snap.p2p[0].reason == "read: UnknownStatus(9); nvlink: UnknownStatus(9)"


def test_gpu_count_failure_gives_empty_snapshot_with_reason():
    snap = snapshot("pcie_pair", lambda fake: setattr(fake, "nvmlDeviceGetCount",
                                                       raising(pynvml.NVML_ERROR_UNKNOWN)))
    assert snap.gpus == () and snap.p2p == () and snap.missing["gpus"] == "Unknown"


@pytest.mark.parametrize("scenario", MEASURABLE)
def test_init_once_and_shutdown(scenario):
    fake = make_fake_nvml(scenario)
    query_nvml(fake)
    state = fake.fake_state
    assert (state.inits, state.shutdowns, state.refcount) == (1, 1, 0)
    assert state.calls[0] == "nvmlInit" and state.calls[-1] == "nvmlShutdown"


@pytest.mark.parametrize("scenario", MEASURABLE)
def test_asdict_is_json_serializable(scenario):
    snap = snapshot(scenario)
    data = dataclasses.asdict(snap)
    assert type(data["missing"]) is dict and type(data["gpus"][0]["missing"]) is dict
    assert json.loads(json.dumps(data))["gpus"][0]["index"] == 0


def test_records_are_frozen_and_hashable():
    snap = snapshot("a100_nvlink_pairs")
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.gpus[0].name = "x"  # type: ignore[misc]
    assert len({snap.gpus[0].nvlinks[0], snap.gpus[0].nvlinks[0]}) == 1
    assert hash(snap.gpus[0]) == hash(snap.gpus[0])


# ---- bus ids --------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["00000000:07:00.0", "0000:07:00.0", b"0000:07:00.0\x00\x00",
                                 "07:00.0", " 00000000:07:00.0\n"])
def test_normalize_bus_id_forms(raw):
    assert normalize_bus_id(raw) == "00000000:07:00.0"


def test_normalize_bus_id_case_and_bad_input():
    assert normalize_bus_id("0000:af:1f.3") == "00000000:AF:1F.3"
    for bad in ("", "GPU-1234", "0000:07:00", "0000:07:00.8"):
        with pytest.raises(ValueError):
            normalize_bus_id(bad)


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7),
       st.booleans(), st.booleans())
def test_normalize_bus_id_round_trip(domain, bus, device, function, short_domain, as_bytes):
    canonical = f"{domain:08X}:{bus:02X}:{device:02X}.{function}"
    text = f"{domain:04x}:{bus:02x}:{device:02x}.{function}" if short_domain else canonical
    assert normalize_bus_id(text.encode() if as_bytes else text) == canonical


# ---- the fake stays faithful to the real binding --------------------------------------------

def test_fake_uses_real_binding_names_and_errors():
    fake = make_fake_nvml("dgx_h100_nvswitch")
    functions = [name for name in vars(fake) if name.startswith("nvml")]
    assert functions and all(hasattr(pynvml, name) for name in functions)
    assert fake.NVMLError is pynvml.NVMLError
    assert type(fake.NVMLError(fake.NVML_ERROR_NOT_SUPPORTED)) is pynvml.NVMLError_NotSupported
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(ctypes.ArgumentError):  # pynvml's READ constant is the tuple (0,)
        fake.nvmlDeviceGetP2PStatus(handle, handle, pynvml.NVML_P2P_CAPS_INDEX_READ)
    assert not hasattr(make_fake_nvml("old_driver"), "nvmlDeviceGetNumaNodeId")


# ---- the real binding on this host ----------------------------------------------------------

def _driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_import_does_not_load_pynvml_until_query():
    code = (
        "import sys\n"
        "import topoprof.probes.hardware.nvml as nvml\n"
        "from topoprof.errors import NothingMeasured\n"
        "print('pynvml' in sys.modules, 'torch' in sys.modules)\n"
        "try:\n"
        "    nvml.query_nvml()\n"
        "except NothingMeasured:\n"
        "    pass\n"
        "print('pynvml' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True"]


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is installed here")
def test_real_pynvml_without_driver_raises_nothing_measured():
    with pytest.raises(NothingMeasured) as info:
        query_nvml()
    assert str(info.value).startswith("NVML unavailable: ")
    assert "LibraryNotFound" in str(info.value)


def test_missing_binding_raises_nothing_measured():
    code = (
        "import sys\n"
        "sys.modules['pynvml'] = None  # makes `import pynvml` fail\n"
        "import topoprof.probes.hardware.nvml as nvml\n"
        "from topoprof.errors import NothingMeasured\n"
        "try:\n"
        "    nvml.query_nvml()\n"
        "except NothingMeasured as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("NVML unavailable: cannot import pynvml") and "nvidia-ml-py" in out.stdout
