"""A stand-in for the pynvml module, describing named machines, for tests on hosts without a GPU.

`make_fake_nvml(scenario)` returns a module object with pynvml's function names and pynvml's own
constants and exception classes, so `NVMLError(code)` builds the same subclasses as with the real
binding. The fake keeps the real binding's habits that code must cope with: calls before nvmlInit
fail with Uninitialized, return types are the binding's ctypes structures and arrays, functions
the driver lacks raise FunctionNotFound, functions the binding lacks are absent (AttributeError),
and a P2P caps index that is not an int fails as ctypes would.
"""
from __future__ import annotations

import ctypes
import json
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pynvml as _real

SWITCH, GPU = _real.NVML_NVLINK_DEVICE_TYPE_SWITCH, _real.NVML_NVLINK_DEVICE_TYPE_GPU
MIB = 1024 * 1024

# The C symbol behind a binding function where the two names differ.
_C_NAME = {
    "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetNvLinkRemotePciInfo": "nvmlDeviceGetNvLinkRemotePciInfo_v2",
}


@dataclass
class FakeLink:
    state: int              # 1 active, 0 down
    version: int            # NVML's nvmlNvlinkVersion_t enum value
    remote_bus_id: str
    remote_type: int        # NVML_NVLINK_DEVICE_TYPE_*


@dataclass
class FakeGpu:
    name: str
    bus_id: str
    memory_total_bytes: int
    cc: tuple[int, int]
    gen_current: int
    gen_max: int
    gen_gpu_max: int
    width_current: int
    width_max: int
    numa_nodes: list[int]          # nvmlDeviceGetMemoryAffinity bits
    cpus: list[int]                # nvmlDeviceGetCpuAffinity bits
    links: list[FakeLink] | None   # None: every NvLink call answers NotSupported
    gpu_numa_id: int | None = None  # None: nvmlDeviceGetNumaNodeId answers NotSupported
    uuid: str = ""
    lost: bool = False             # queries answer GpuIsLost
    lost_at_handle: bool = False   # nvmlDeviceGetHandleByIndex answers GpuIsLost


@dataclass
class FakeMachine:
    driver_version: str
    nvml_version: str
    cuda_driver_version: int
    gpus: list[FakeGpu]
    p2p: Callable[[int, int, int], int]        # (gpu a, gpu b, caps index) -> NVML_P2P_STATUS_*
    init_error: int | None = None
    library_lacks: set[str] = field(default_factory=set)  # C symbols -> FunctionNotFound
    binding_lacks: set[str] = field(default_factory=set)  # binding functions -> AttributeError
    bytes_strings: bool = False    # old bindings hand back bytes, and legacy 4-digit bus ids
    max_links_constant: int = _real.NVML_NVLINK_MAX_LINKS
    # (gpu a, gpu b) -> NVML_TOPOLOGY_* level; None: every pair answers NotSupported
    common_ancestor: Callable[[int, int], int] | None = None


@dataclass
class FakeState:
    machine: FakeMachine
    refcount: int = 0
    inits: int = 0
    shutdowns: int = 0
    calls: list[str] = field(default_factory=list)


class FakeHandle:
    def __init__(self, index: int):
        self.index = index


def _err(code: int) -> Exception:
    return _real.NVMLError(code)


def _cpus(*ranges: tuple[int, int]) -> list[int]:
    return [cpu for lo, hi in ranges for cpu in range(lo, hi + 1)]


def _bits(ids: list[int], words: int):
    array = (ctypes.c_ulonglong * words)()
    for i in ids:
        if i < 64 * words:  # NVML fills only the words it is given
            array[i // 64] |= 1 << (i % 64)
    return array


def _string(machine: FakeMachine, text: str):
    return text.encode() if machine.bytes_strings else text


def _pci_info(machine: FakeMachine, bus_id: str):
    if machine.bytes_strings:
        return types.SimpleNamespace(busId=bus_id[4:].encode())  # "0000:07:00.0", as NVML < 9
    info = _real.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = bus_id[4:].encode()
    domain, bus, rest = bus_id.split(":")
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    return info


def _device_functions(state: FakeState) -> dict[str, Callable]:
    m = state.machine

    def gpu_of(handle) -> FakeGpu:
        if not isinstance(handle, FakeHandle):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = m.gpus[handle.index]
        if gpu.lost:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def link_of(handle, link) -> FakeLink:
        gpu = gpu_of(handle)
        if gpu.links is None:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.links):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.links[link]

    def handle_by_index(index):
        if not 0 <= index < len(m.gpus):
            raise _err(_real.NVML_ERROR_INVALID_ARGUMENT)
        if m.gpus[index].lost_at_handle:
            raise _err(_real.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    def numa_node_id(handle):
        gpu = gpu_of(handle)
        if gpu.gpu_numa_id is None:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.gpu_numa_id

    def common_ancestor(handle_a, handle_b):
        gpu_of(handle_a), gpu_of(handle_b)
        if m.common_ancestor is None:
            raise _err(_real.NVML_ERROR_NOT_SUPPORTED)
        return m.common_ancestor(handle_a.index, handle_b.index)

    def p2p_status(handle_a, handle_b, index):
        if not isinstance(index, int):  # what ctypes does with pynvml's tuple-valued READ constant
            raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter 3")
        gpu_of(handle_a), gpu_of(handle_b)
        return m.p2p(handle_a.index, handle_b.index, index)

    return {
        "nvmlDeviceGetCount": lambda: len(m.gpus),
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetName": lambda h: _string(m, gpu_of(h).name),
        "nvmlDeviceGetUUID": lambda h: _string(m, gpu_of(h).uuid),
        "nvmlDeviceGetPciInfo": lambda h: _pci_info(m, gpu_of(h).bus_id),
        "nvmlDeviceGetMemoryInfo": lambda h: _real.c_nvmlMemory_t(
            total=gpu_of(h).memory_total_bytes, free=gpu_of(h).memory_total_bytes - 512 * MIB, used=512 * MIB),
        "nvmlDeviceGetCudaComputeCapability": lambda h: gpu_of(h).cc,
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: gpu_of(h).gen_current,
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: gpu_of(h).gen_max,
        "nvmlDeviceGetGpuMaxPcieLinkGeneration": lambda h: gpu_of(h).gen_gpu_max,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: gpu_of(h).width_current,
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: gpu_of(h).width_max,
        "nvmlDeviceGetNumaNodeId": numa_node_id,
        "nvmlDeviceGetMemoryAffinity": lambda h, size, scope: _bits(gpu_of(h).numa_nodes, size),
        "nvmlDeviceGetCpuAffinity": lambda h, size: _bits(gpu_of(h).cpus, size),
        "nvmlDeviceGetNvLinkState": lambda h, link: link_of(h, link).state,
        "nvmlDeviceGetNvLinkVersion": lambda h, link: link_of(h, link).version,
        "nvmlDeviceGetNvLinkRemotePciInfo": lambda h, link: _pci_info(m, link_of(h, link).remote_bus_id),
        "nvmlDeviceGetNvLinkRemoteDeviceType": lambda h, link: link_of(h, link).remote_type,
        "nvmlDeviceGetP2PStatus": p2p_status,
        "nvmlDeviceGetTopologyCommonAncestor": common_ancestor,
    }


def _functions(state: FakeState) -> dict[str, Callable]:
    m = state.machine

    def init():
        if m.init_error is not None:
            raise _err(m.init_error)
        state.refcount += 1
        state.inits += 1

    def shutdown():
        state.refcount = max(0, state.refcount - 1)
        state.shutdowns += 1

    return {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlSystemGetDriverVersion": lambda: _string(m, m.driver_version),
        "nvmlSystemGetNVMLVersion": lambda: _string(m, m.nvml_version),
        "nvmlSystemGetCudaDriverVersion": lambda: m.cuda_driver_version,
        **_device_functions(state),
    }


def _checked(state: FakeState, name: str, fn: Callable) -> Callable:
    def call(*args):
        state.calls.append(name)
        if name != "nvmlInit" and state.refcount == 0:
            raise _err(_real.NVML_ERROR_UNINITIALIZED)
        if _C_NAME.get(name, name) in state.machine.library_lacks:
            raise _err(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        return fn(*args)
    call.__name__ = name
    return call


def make_fake_nvml(scenario: str) -> types.ModuleType:
    """A pynvml look-alike for `scenario` (see SCENARIOS); its state is in `.fake_state`."""
    if scenario not in SCENARIOS:
        raise KeyError(f"unknown scenario {scenario!r}; known: {', '.join(sorted(SCENARIOS))}")
    machine = SCENARIOS[scenario]()
    for i, gpu in enumerate(machine.gpus):
        gpu.uuid = gpu.uuid or f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{scenario}/{i}')}"
    state = FakeState(machine)
    module = types.ModuleType(f"fake_pynvml_{scenario}")
    for name in dir(_real):
        if name.startswith(("NVML_", "NVMLError")):
            setattr(module, name, getattr(_real, name))
    module.NVML_NVLINK_MAX_LINKS = machine.max_links_constant
    for name, fn in _functions(state).items():
        if name not in machine.binding_lacks:
            setattr(module, name, _checked(state, name, fn))
    module.fake_state = state
    return module


# ---- machines -------------------------------------------------------------------------------

def _bus(byte: str) -> str:
    return f"00000000:{byte}:00.0"


def _p2p(read: Callable[[int, int], int], nvlink: Callable[[int, int], int]) -> Callable[[int, int, int], int]:
    def status(a: int, b: int, index: int) -> int:
        if index == _real.NVML_P2P_CAPS_INDEX_NVLINK:
            return nvlink(a, b)
        return read(a, b)
    return status


def _mesh_links(buses: list[str], me: int, per_peer: int, version: int) -> list[FakeLink]:
    """Direct GPU-GPU links: per_peer links to every other GPU, in peer order."""
    return [FakeLink(1, version, buses[peer], GPU)
            for peer in range(len(buses)) if peer != me for _ in range(per_peer)]


def dgx_h100_nvswitch() -> FakeMachine:
    buses = [_bus(b) for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")]
    switches = [_bus(b) for b in ("05", "06", "07", "08")]
    # Each H100 spreads its 18 NVLink4 links over the four NVSwitch chips as 5, 4, 4, 5.
    links = [sw for sw, n in zip(switches, (5, 4, 4, 5)) for _ in range(n)]
    node_cpus = [_cpus((0, 55), (112, 167)), _cpus((56, 111), (168, 223))]
    gpus = [FakeGpu("NVIDIA H100 80GB HBM3", bus, 81559 * MIB, (9, 0), 5, 5, 5, 16, 16,
                    [i // 4], node_cpus[i // 4],
                    [FakeLink(1, _real.NVML_NVLINK_VERSION_4_0, sw, SWITCH) for sw in links])
            for i, bus in enumerate(buses)]
    ok = _real.NVML_P2P_STATUS_OK
    return FakeMachine("535.129.03", "12.535.129.03", 12020, gpus, _p2p(lambda a, b: ok, lambda a, b: ok),
                       common_ancestor=lambda a, b: _real.NVML_TOPOLOGY_NODE if a // 4 == b // 4
                       else _real.NVML_TOPOLOGY_SYSTEM)


def pcie_pair() -> FakeMachine:
    cpus = _cpus((0, 35))
    gpus = [
        FakeGpu("NVIDIA RTX A6000", _bus("17"), 49140 * MIB, (8, 6), 4, 4, 4, 16, 16, [0], cpus, None),
        # Idle: the link has dropped to Gen1 to save power; it retrains to Gen4 under load.
        FakeGpu("NVIDIA RTX A6000", _bus("65"), 49140 * MIB, (8, 6), 1, 4, 4, 16, 16, [0], cpus, None),
    ]
    return FakeMachine("550.54.14", "12.550.54.14", 12040, gpus,
                       _p2p(lambda a, b: _real.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
                            lambda a, b: _real.NVML_P2P_STATUS_NOT_SUPPORTED),
                       common_ancestor=lambda a, b: _real.NVML_TOPOLOGY_HOSTBRIDGE)


def nvlink_not_supported() -> FakeMachine:
    # GPU0 alone on socket 0, GPUs 1-3 on socket 1 (as `nvidia-smi topo -m` shows on such hosts).
    socket = [_cpus((0, 15), (32, 47)), _cpus((16, 31), (48, 63))]
    layout = [("18", 0), ("86", 1), ("AF", 1), ("D8", 1)]
    gpus = [FakeGpu("Tesla T4", _bus(b), 15360 * MIB, (7, 5), 3, 3, 3, 16, 16, [node], socket[node], None)
            for b, node in layout]
    same_socket = {frozenset(p) for p in ((1, 2), (1, 3), (2, 3))}

    def read(a: int, b: int) -> int:
        return (_real.NVML_P2P_STATUS_OK if frozenset((a, b)) in same_socket
                else _real.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED)

    return FakeMachine("450.80.02", "11.450.80.02", 11000, gpus,
                       _p2p(read, lambda a, b: _real.NVML_P2P_STATUS_NOT_SUPPORTED),
                       common_ancestor=lambda a, b: _real.NVML_TOPOLOGY_NODE if frozenset((a, b)) in same_socket
                       else _real.NVML_TOPOLOGY_SYSTEM)


def _hgx_a100_4(name: str, memory_mib: int) -> list[FakeGpu]:
    buses = [_bus(b) for b in ("01", "41", "81", "C1")]
    # NUMA order does not follow GPU order on this board (1, 0, 3, 2).
    affinity = [(1, _cpus((16, 31), (80, 95))), (0, _cpus((0, 15), (64, 79))),
                (3, _cpus((48, 63), (112, 127))), (2, _cpus((32, 47), (96, 111)))]
    # A100 drivers answer 5 (NVLink 3.1 in the enum) for version.
    return [FakeGpu(name, bus, memory_mib * MIB, (8, 0), 4, 4, 4, 16, 16, [node], cpus,
                    _mesh_links(buses, i, 4, _real.NVML_NVLINK_VERSION_3_1))
            for i, (bus, (node, cpus)) in enumerate(zip(buses, affinity))]


def a100_nvlink_pairs() -> FakeMachine:
    ok = _real.NVML_P2P_STATUS_OK
    # Each GPU hangs off a different NUMA node: over PCIe every pair crosses the CPU interconnect.
    return FakeMachine("470.82.01", "11.470.82.01", 11040, _hgx_a100_4("NVIDIA A100-SXM4-40GB", 40960),
                       _p2p(lambda a, b: ok, lambda a, b: ok), common_ancestor=lambda a, b: _real.NVML_TOPOLOGY_SYSTEM)


def gpu_lost() -> FakeMachine:
    gpus = _hgx_a100_4("NVIDIA A100-SXM4-80GB", 81920)
    gpus[2].lost = True
    for gpu in gpus:  # the peers see their links to the fallen GPU go down
        for link in gpu.links:
            if link.remote_bus_id == gpus[2].bus_id:
                link.state = 0
    ok = _real.NVML_P2P_STATUS_OK
    return FakeMachine("535.104.05", "12.535.104.05", 12020, gpus, _p2p(lambda a, b: ok, lambda a, b: ok))


def old_driver() -> FakeMachine:
    # 4 x V100 SXM2, every pair joined by 2 NVLink2 links; driver 418 with a binding of its time.
    buses = [_bus(b) for b in ("07", "08", "0E", "0F")]
    cpus = _cpus((0, 39))
    gpus = [FakeGpu("Tesla V100-SXM2-32GB", bus, 32510 * MIB, (7, 0), 3, 3, 3, 16, 16, [0], cpus,
                    _mesh_links(buses, i, 2, _real.NVML_NVLINK_VERSION_2_0))
            for i, bus in enumerate(buses)]
    ok = _real.NVML_P2P_STATUS_OK
    return FakeMachine(
        "418.87.01", "10.418.87.01", 10010, gpus, _p2p(lambda a, b: ok, lambda a, b: ok),
        common_ancestor=lambda a, b: (_real.NVML_TOPOLOGY_SINGLE if a // 2 == b // 2
                                      else _real.NVML_TOPOLOGY_HOSTBRIDGE),
        library_lacks={"nvmlDeviceGetMemoryAffinity"},
        binding_lacks={"nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetGpuMaxPcieLinkGeneration",
                       "nvmlDeviceGetNumaNodeId"},
        bytes_strings=True, max_links_constant=6,
    )


def h100_vm_1x() -> FakeMachine:
    """One H100 passed through to a cloud VM, as NVML described it there
    (tests/fixtures/nvml/h100-vm-1x.json, with `nvidia-smi topo -m` of the same VM in
    tests/fixtures/topo/28_*): GPU NUMA id and every NVLink query NotSupported. Memory and CPU
    affinity are those the same VM's `nvidia-smi topo -m` printed (NUMA 0, CPUs 0-15), which
    nvidia-smi reads from NVML."""
    with open(Path(__file__).parent / "fixtures" / "nvml" / "h100-vm-1x.json") as f:
        seen = json.load(f)
    gpu = seen["gpus"][0]
    assert gpu["numa"].startswith("ERR NVMLError_NotSupported") and "NotSupported" in gpu["nvlink_note"]
    gpus = [FakeGpu(gpu["name"], gpu["bus"], gpu["mem_total"], tuple(gpu["cc"]), gpu["pcie_gen_cur"],
                    gpu["pcie_gen_max"], gpu["pcie_gen_gpu_max"], gpu["pcie_w_cur"], gpu["pcie_w_max"],
                    [0], _cpus((0, 15)), links=None, gpu_numa_id=None)]
    # CUDA 13.0, as the driver reported it beside `nvidia-smi topo -m` (fixture 28's header).
    return FakeMachine(seen["driver"], seen["nvml_version"], 13000, gpus,
                       _p2p(lambda a, b: _real.NVML_P2P_STATUS_OK, lambda a, b: _real.NVML_P2P_STATUS_OK))


def pcie_l40s_l4_8x() -> FakeMachine:
    """Eight PCIe GPUs of two models, as a node shared by SLURM jobs may have them: four L40S on
    NUMA node 0, four L4 on node 1, GPU 6 in a slot of eight lanes. GPUs 2 and 6 have UUIDs that
    start alike ("GPU-8f2"), so only a longer prefix names one of them."""
    socket = [_cpus((0, 31), (64, 95)), _cpus((32, 63), (96, 127))]
    layout = [("1B", 0), ("3D", 0), ("4F", 0), ("5E", 0), ("9C", 1), ("AC", 1), ("BC", 1), ("CC", 1)]
    gpus = [FakeGpu("NVIDIA L40S" if node == 0 else "NVIDIA L4", _bus(b), (46068 if node == 0 else 23034) * MIB,
                    (8, 9), 4, 4, 4, *([8, 8] if i == 6 else [16, 16]), [node], socket[node], None)
            for i, (b, node) in enumerate(layout)]
    gpus[2].uuid = "GPU-8f2b77d0-5c1e-4a0b-9d3e-2f6a8c1b0e47"
    gpus[6].uuid = "GPU-8f2a1c3e-9b4d-4e2f-a1c7-6d5e3b2a9f10"
    same = lambda a, b: a // 4 == b // 4  # noqa: E731
    read = lambda a, b: _real.NVML_P2P_STATUS_OK if same(a, b) else _real.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED  # noqa: E731
    return FakeMachine("550.90.07", "12.550.90.07", 12040, gpus,
                       _p2p(read, lambda a, b: _real.NVML_P2P_STATUS_NOT_SUPPORTED),
                       common_ancestor=lambda a, b: (_real.NVML_TOPOLOGY_NODE if same(a, b)
                                                     else _real.NVML_TOPOLOGY_SYSTEM))


def no_driver() -> FakeMachine:
    machine = pcie_pair()
    machine.init_error = _real.NVML_ERROR_LIBRARY_NOT_FOUND
    return machine


def driver_not_loaded() -> FakeMachine:
    machine = pcie_pair()
    machine.init_error = _real.NVML_ERROR_DRIVER_NOT_LOADED
    return machine


SCENARIOS: dict[str, Callable[[], FakeMachine]] = {
    "dgx_h100_nvswitch": dgx_h100_nvswitch,
    "pcie_pair": pcie_pair,
    "nvlink_not_supported": nvlink_not_supported,
    "gpu_lost": gpu_lost,
    "old_driver": old_driver,
    "a100_nvlink_pairs": a100_nvlink_pairs,
    "no_driver": no_driver,
    "driver_not_loaded": driver_not_loaded,
    "h100_vm_1x": h100_vm_1x,
    "pcie_l40s_l4_8x": pcie_l40s_l4_8x,
}
