"""What the NVIDIA driver reports about GPUs, their PCIe links, NVLinks and P2P support (NVML).

The only module that imports pynvml, and only when `query_nvml` first runs, so the project imports
and tests on machines without a driver. A call the driver or the binding cannot answer yields None
and a short recorded reason ("NotSupported", "FunctionNotFound", "GpuIsLost", ...), never an
exception. Check by hand with `nvidia-smi -q`, `nvidia-smi topo -m`, `nvidia-smi nvlink -s` / `-R`
and `nvidia-smi topo -p2p r` / `-p2p n`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from topoprof.errors import NothingMeasured

# ABI values of NVML enums. They are written out here rather than read from the binding because
# pynvml defines NVML_P2P_CAPS_INDEX_READ as `0,` (a tuple that ctypes cannot pass), and old
# bindings lack some of the names.
_P2P_INDEX_READ = 0
_P2P_INDEX_NVLINK = 2
_P2P_STATUS = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported", 3: "topology_not_supported",
               4: "disabled_by_regkey", 5: "not_supported", 6: "unknown"}
_REMOTE_TYPE = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}
# nvmlGpuTopologyLevel_t (nvml.h) -> the path kind `nvidia-smi topo -m` prints for the same pair:
# INTERNAL (one board) and SINGLE (one PCIe switch) are PIX, MULTIPLE (several switches, no host
# bridge) PXB, HOSTBRIDGE PHB, NODE (host bridges within a NUMA node; NVML_TOPOLOGY_CPU is the
# same value) NODE, SYSTEM (across the CPU interconnect) SYS.
_TOPOLOGY_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetNvLinkVersion returns an nvmlNvlinkVersion_t enum, not the NVLink generation:
# A100 answers 5 (NVLink 3.x), H100 6 (NVLink 4.0).
_NVLINK_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
_AFFINITY_SCOPE_NODE = 0
# Bitmask sizes in 64-bit words; NVML fills what fits and leaves the rest zero, so generous is safe.
_CPU_WORDS = max(16, -(-(os.cpu_count() or 1) // 64))
_NODE_WORDS = 4
# Old bindings say 6 or 12 here while the driver may have 18; links past the driver's own limit
# answer InvalidArgument and are skipped.
_MIN_LINKS_TO_SCAN = 18
_NO_SUCH_LINK = ("NotSupported", "InvalidArgument")
_NOT_IN_BINDING = "FunctionNotFound (not in this pynvml)"


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU; check with `nvidia-smi nvlink -s` (state) and `nvidia-smi nvlink -R` (remote).

    `version` is the NVLink generation (1..6) decoded from NVML's version enum; `remote_*` are
    read only for active links.
    """
    link: int
    active: bool | None
    version: int | None
    remote_bus_id: str | None
    remote_device_type: str | None
    missing: Mapping[str, str] = field(hash=False)


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML sees it; `nvidia-smi -q` shows the same fields ("GPU Link Info" for PCIe).

    pcie_gen_max / pcie_width_max: the most this GPU can train to in this slot
        (nvmlDeviceGetMaxPcieLinkGeneration/Width, "Max" in `nvidia-smi -q`), the ceiling the
        current link is compared with. pcie_gen_gpu_max: what the GPU itself supports
        (nvmlDeviceGetGpuMaxPcieLinkGeneration, "Device Max"); above pcie_gen_max it means the slot
        or host limits the link. Idle GPUs drop their link to Gen1 to save power, so a low
        pcie_gen_current at idle is normal, not a fault.
    numa_node: host NUMA node whose memory is nearest the GPU (nvmlDeviceGetMemoryAffinity, the
        "NUMA Affinity" column of `nvidia-smi topo -m`).
    gpu_numa_node: the GPU's own NUMA node where its memory is one (coherent platforms such as
        Grace Hopper; nvmlDeviceGetNumaNodeId, "GPU NUMA ID"); NotSupported elsewhere.
    cpu_affinity: CPU ids near the GPU ("CPU Affinity" column); NVML may narrow it to the calling
        process's cpuset, and an all-zero mask is recorded as missing ("EmptyMask").
    """
    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None
    compute_capability: tuple[int, int] | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    numa_node: int | None
    cpu_affinity: tuple[int, ...] | None
    nvlinks: tuple[NvLink, ...]
    lost: bool
    missing: Mapping[str, str] = field(hash=False)
    pcie_gen_gpu_max: int | None = None
    gpu_numa_node: int | None = None


@dataclass(frozen=True)
class P2PStatus:
    """P2P support from gpu_a to gpu_b as `nvidia-smi topo -p2p r` (read) and `-p2p n` (nvlink) show it,
    and the PCIe path between them (nvmlDeviceGetTopologyCommonAncestor: the PIX/PXB/PHB/NODE/SYS
    that `nvidia-smi topo -m` prints for a pair without NVLink).

    `reason` says why read, nvlink or pcie_path is None.
    """
    gpu_a: int
    gpu_b: int
    read: str | None
    nvlink: str | None
    reason: str | None
    pcie_path: str | None = None


@dataclass(frozen=True)
class NvmlSnapshot:
    """Driver, NVML and CUDA versions (`nvidia-smi -q` header), every GPU and every pair a < b."""
    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: int | None
    gpus: tuple[NvmlGpu, ...]
    p2p: tuple[P2PStatus, ...]
    missing: Mapping[str, str] = field(hash=False)


class _GpuLost(Exception):
    """The GPU fell off the bus: further queries on it are pointless."""


def normalize_bus_id(raw: str | bytes) -> str:
    """PCI bus id as NVML prints it, "00000000:07:00.0", from bytes or str in any of the usual forms.

    Accepts NVML's 8-digit domain, the legacy and sysfs 4-digit domain, and lspci's domain-less
    "07:00.0" (domain 0 by lspci's convention). Raises ValueError for anything else.
    """
    text = (raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)).strip("\x00 \t\n")
    match = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])", text)
    if match is None:
        raise ValueError(f"UnparsableBusId({text!r})")
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function}"


def _reason(err: BaseException) -> str:
    # pynvml maps every error code to a class named NVMLError_<CamelName>; that name is the reason.
    name = type(err).__name__
    if name.startswith("NVMLError_"):
        return name[len("NVMLError_"):]
    return f"NVMLError({getattr(err, 'value', '?')})"


class _Query:
    """Calls one NVML function; failures become None plus missing[field] = reason."""

    def __init__(self, lib: Any):
        self.lib, self.error = lib, lib.NVMLError

    def __call__(self, missing: dict, name: str, function: str, *args: Any,
                 convert: Callable[[Any], Any] = lambda raw: raw, lost_raises: bool = True) -> Any:
        fn = getattr(self.lib, function, None)
        if fn is None:
            missing[name] = _NOT_IN_BINDING
            return None
        try:
            return convert(fn(*args))
        except self.error as err:
            if _reason(err) == "GpuIsLost" and lost_raises:
                raise _GpuLost from err
            missing[name] = _reason(err)
        except ValueError as err:  # a converter refusing an answer that is no reading
            missing[name] = str(err)
        return None


def _text(raw: Any) -> str:
    text = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)).strip("\x00 ")
    if not text:
        raise ValueError("Empty")
    return text


def _bus_id_of(pci: Any) -> str:
    if isinstance(pci, (str, bytes)):
        return normalize_bus_id(pci)
    # busId is the current field; busIdLegacy is the only one that drivers before NVML 9 fill.
    for attr in ("busId", "busIdLegacy"):
        raw = getattr(pci, attr, None)
        if raw and raw.strip(b"\x00" if isinstance(raw, bytes) else "\x00"):
            return normalize_bus_id(raw)
    raise ValueError("EmptyBusId")


def _set_bits(words: Any) -> tuple[int, ...]:
    # Word i, bit j stands for id 64*i + j (the binding passes 64-bit words). An all-zero mask
    # says nothing about where the GPU is, so it is not a reading.
    ids = tuple(64 * i + bit for i, word in enumerate(words) for bit in range(64) if (int(word) >> bit) & 1)
    if not ids:
        raise ValueError("EmptyMask")
    return ids


def _single_node(words: Any) -> int:
    nodes = _set_bits(words)
    if len(nodes) > 1:
        raise ValueError(f"SeveralNodes({','.join(map(str, nodes))})")
    return nodes[0]


def _numa_id(raw: Any) -> int:
    if int(raw) < 0:
        raise ValueError(f"NoNumaNode({int(raw)})")
    return int(raw)


def _lookup(table: dict[int, Any], label: str) -> Callable[[Any], Any]:
    def convert(raw: Any) -> Any:
        if int(raw) not in table:
            raise ValueError(f"{label}({int(raw)})")
        return table[int(raw)]
    return convert


_GPU_QUERIES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("name", "nvmlDeviceGetName", _text),
    ("uuid", "nvmlDeviceGetUUID", _text),
    ("pci_bus_id", "nvmlDeviceGetPciInfo", _bus_id_of),
    ("memory_total_bytes", "nvmlDeviceGetMemoryInfo", lambda memory: int(memory.total)),
    ("compute_capability", "nvmlDeviceGetCudaComputeCapability", lambda cc: (int(cc[0]), int(cc[1]))),
    ("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", int),
    ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", int),
    ("pcie_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration", int),
    ("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth", int),
    ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", int),
    ("gpu_numa_node", "nvmlDeviceGetNumaNodeId", _numa_id),
)
_SYSTEM_QUERIES = (("driver_version", "nvmlSystemGetDriverVersion", _text),
                   ("nvml_version", "nvmlSystemGetNVMLVersion", _text),
                   ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion", int))
_GPU_FIELDS = tuple(name for name, _, _ in _GPU_QUERIES) + ("numa_node", "cpu_affinity")


def _read_scalars(query: _Query, handle: Any, values: dict, missing: dict) -> None:
    for name, function, convert in _GPU_QUERIES:
        values[name] = query(missing, name, function, handle, convert=convert)
    values["numa_node"] = query(missing, "numa_node", "nvmlDeviceGetMemoryAffinity", handle,
                                _NODE_WORDS, _AFFINITY_SCOPE_NODE, convert=_single_node)
    values["cpu_affinity"] = query(missing, "cpu_affinity", "nvmlDeviceGetCpuAffinity", handle,
                                   _CPU_WORDS, convert=_set_bits)


def _read_link(query: _Query, handle: Any, link: int, state: Any, missing: dict) -> NvLink:
    active = None if state is None else bool(state)
    version = query(missing, "version", "nvmlDeviceGetNvLinkVersion", handle, link,
                    convert=_lookup(_NVLINK_GENERATION, "UnknownVersionEnum"))
    remote_bus = remote_type = None
    if active:
        remote_bus = query(missing, "remote_bus_id", "nvmlDeviceGetNvLinkRemotePciInfo", handle, link,
                           convert=_bus_id_of)
        remote_type = query(missing, "remote_device_type", "nvmlDeviceGetNvLinkRemoteDeviceType",
                            handle, link, convert=_lookup(_REMOTE_TYPE, "UnknownDeviceType"))
    else:
        # A link that is down has no remote end to ask about.
        missing["remote_bus_id"] = missing["remote_device_type"] = (
            "LinkInactive" if active is False else "LinkStateUnknown")
    return NvLink(link=link, active=active, version=version, remote_bus_id=remote_bus,
                  remote_device_type=remote_type, missing=missing)


def _read_nvlinks(query: _Query, handle: Any, gpu_missing: dict) -> tuple[NvLink, ...]:
    """Links that exist; `nvidia-smi nvlink -s` lists the same ones."""
    links: list[NvLink] = []
    skipped = None
    limit = max(int(getattr(query.lib, "NVML_NVLINK_MAX_LINKS", 0) or 0), _MIN_LINKS_TO_SCAN)
    for link in range(limit):
        missing: dict[str, str] = {}
        state = query(missing, "active", "nvmlDeviceGetNvLinkState", handle, link)
        reason = missing.get("active")
        if reason in _NO_SUCH_LINK:
            # GPUs without NVLink answer NotSupported; indexes past the GPU's links, InvalidArgument.
            skipped = reason
            continue
        if reason is not None and (reason.startswith("FunctionNotFound") or reason == "NoPermission"):
            gpu_missing["nvlinks"] = reason  # the same answer for every link: stop asking
            return ()
        links.append(_read_link(query, handle, link, state, missing))
    if not links and skipped is not None:
        gpu_missing["nvlinks"] = skipped
    return tuple(links)


def _read_gpu(query: _Query, index: int) -> tuple[Any, NvmlGpu]:
    values: dict[str, Any] = {}
    missing: dict[str, str] = {}
    handle, lost = None, False
    links: tuple[NvLink, ...] = ()
    try:
        handle = query(missing, "handle", "nvmlDeviceGetHandleByIndex", index)
        if handle is not None:
            _read_scalars(query, handle, values, missing)
            links = _read_nvlinks(query, handle, missing)
    except _GpuLost:
        handle, lost = None, True
    # Fields never asked (GPU lost part-way, or no handle) get the reason that stopped the asking.
    stopped = "GpuIsLost" if lost else missing.get("handle")
    if stopped is not None:
        for name in _GPU_FIELDS + ("nvlinks",):
            if values.get(name) is None and name not in missing:
                missing[name] = stopped
    gpu = NvmlGpu(index=index, nvlinks=links, lost=lost, missing=missing,
                  **{name: values.get(name) for name in _GPU_FIELDS})
    return handle, gpu


def _pair_status(query: _Query, a: int, b: int, handles: list[Any], gpus: tuple[NvmlGpu, ...]) -> P2PStatus:
    missing = {f"gpu {g}": "GpuIsLost" if gpus[g].lost else "no handle" for g in (a, b) if handles[g] is None}
    status = {}
    if not missing:  # without both handles there is nothing to ask
        for name, index in (("read", _P2P_INDEX_READ), ("nvlink", _P2P_INDEX_NVLINK)):
            status[name] = query(missing, name, "nvmlDeviceGetP2PStatus", handles[a], handles[b], index,
                                 convert=_lookup(_P2P_STATUS, "UnknownStatus"), lost_raises=False)
        status["pcie_path"] = query(missing, "pcie_path", "nvmlDeviceGetTopologyCommonAncestor", handles[a],
                                    handles[b], convert=_lookup(_TOPOLOGY_LEVEL, "UnknownLevel"),
                                    lost_raises=False)
    reason = "; ".join(f"{k}: {v}" for k, v in missing.items()) or None
    return P2PStatus(a, b, status.get("read"), status.get("nvlink"), reason, status.get("pcie_path"))


def _read_p2p(query: _Query, handles: list[Any], gpus: tuple[NvmlGpu, ...]) -> tuple[P2PStatus, ...]:
    """Every pair a < b; `nvidia-smi topo -p2p r` and `nvidia-smi topo -p2p n` show the same matrix."""
    return tuple(_pair_status(query, a, b, handles, gpus)
                 for a in range(len(gpus)) for b in range(a + 1, len(gpus)))


def _read_snapshot(query: _Query) -> NvmlSnapshot:
    missing: dict[str, str] = {}
    system = {name: query(missing, name, function, convert=convert, lost_raises=False)
              for name, function, convert in _SYSTEM_QUERIES}
    count = query(missing, "gpus", "nvmlDeviceGetCount", convert=int, lost_raises=False) or 0
    handles, gpus = zip(*(_read_gpu(query, index) for index in range(count))) if count else ((), ())
    return NvmlSnapshot(gpus=tuple(gpus), p2p=_read_p2p(query, list(handles), tuple(gpus)), missing=missing,
                        **system)


_pynvml: Any = None


def _load_pynvml() -> Any:
    global _pynvml
    if _pynvml is None:
        try:
            import pynvml  # lazy: a missing nvidia-ml-py is reported as NVML unavailable (tests swap in a fake)
        except ImportError as err:
            message = f"NVML unavailable: cannot import pynvml ({err}); install nvidia-ml-py"
            raise NothingMeasured(message) from err
        _pynvml = pynvml
    return _pynvml


_INIT_HINTS = {
    "LibraryNotFound": "libnvidia-ml.so.1 not found; is the NVIDIA driver installed?",
    "DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NoPermission": "no permission to open the GPU device files",
    "LibRmVersionMismatch": "driver library and kernel module versions differ; reboot or reload the driver",
}


def _init(lib: Any) -> None:
    try:
        lib.nvmlInit()
    except lib.NVMLError as err:
        reason = _reason(err)
        try:
            text = str(err)
        except Exception:  # str() of an unknown code asks NVML itself, which is not running
            text = reason
        hint = _INIT_HINTS.get(reason, "check that `nvidia-smi` works")
        raise NothingMeasured(f"NVML unavailable: {text} ({reason}): {hint}") from err


def query_nvml(lib: Any = None) -> NvmlSnapshot:
    """Read everything NVML knows about this machine's GPUs and their links.

    `lib` is a module with pynvml's API (tests pass a fake); by default pynvml is imported on first
    use. Raises NothingMeasured when pynvml cannot be imported or NVML cannot start (no driver, no
    library). `nvidia-smi -q` shows the same numbers per GPU.
    """
    lib = _load_pynvml() if lib is None else lib
    _init(lib)
    try:
        return _read_snapshot(_Query(lib))
    finally:
        try:
            lib.nvmlShutdown()
        except lib.NVMLError:
            pass  # the snapshot is already read; a failed shutdown changes nothing in it


def query_driver_version(lib: Any = None) -> tuple[str | None, str | None]:
    """(the driver's version, None), or (None, why): the "Driver Version" of `nvidia-smi`'s header,
    read alone (no per-GPU or per-link queries). Never raises."""
    try:
        lib = _load_pynvml() if lib is None else lib
        _init(lib)
    except NothingMeasured as err:
        return None, str(err)
    try:
        missing: dict[str, str] = {}
        version = _Query(lib)(missing, "driver_version", "nvmlSystemGetDriverVersion", convert=_text,
                              lost_raises=False)
        return version, missing.get("driver_version")
    finally:
        try:
            lib.nvmlShutdown()
        except lib.NVMLError:
            pass
