"""Which of the node's GPUs are the job's, and which one each of torch's devices is.

torch's `cuda:i` is the i-th device CUDA shows the process, and CUDA_VISIBLE_DEVICES chooses and
orders those among the node's GPUs; NVML, and so the topology, lists every GPU of the node in PCI
bus order whatever the variable says. Pure logic: the caller gives the variable, the node's GPUs
(anything with `index`, `uuid` and `pci_bus_id`: the topology's records or NVML's) and, where a
process could ask CUDA itself, each device's own UUID and PCI bus id, which tie a device to its
GPU beyond doubt and so win over reading the variable.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence

# How CUDA reads CUDA_VISIBLE_DEVICES (CUDA C++ Programming Guide, "CUDA Environment Variables";
# GPU Deployment and Management guide, MPS): a comma-separated list of GPU indices, GPU UUIDs as
# nvidia-smi prints them ("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6") or the first characters of
# one, "GPU-" included, that no other GPU of the node shares ("GPU-8932f937"), or MIG devices
# ("MIG-GPU-<GPU UUID>/<GPU instance>/<compute instance>", or the MIG device's own UUID as
# `nvidia-smi -L` lists it, "MIG-<UUID>"). The devices are enumerated in the list's order; if one
# entry is invalid, only the devices before it are visible ("0,2,-1,1" shows devices 0 and 2).
# Indices count in CUDA_DEVICE_ORDER: PCI_BUS_ID is NVML's order, while the default FASTEST_FIRST
# may put a faster model first on a node with several. torch reads the variable the same way to
# count devices without starting CUDA (torch/cuda/__init__.py `_parse_visible_devices`,
# `_transform_uuid_to_ordinals`), with two more rules kept here: the first entry sets the list's
# kind (an index list ends at a UUID, a UUID list at an index), and a device named twice leaves
# no device visible. An entry is read as C's strtoul reads it there: "1gpu2" is index 1.
_INDEX = re.compile(r"\s*[+-]?\d+")
UNSET = "CUDA_VISIBLE_DEVICES unset: every GPU, in PCI order"


@dataclass(frozen=True)
class JobGpu:
    """torch's `cuda:<ordinal>` in this process, and which of the node's GPUs it is.

    gpu: the GPU's index as NVML and `nvidia-smi` number it (for a MIG device, its parent GPU's);
        None when it cannot be known, `basis` says why.
    entry: the CUDA_VISIBLE_DEVICES entry that named it; None when the variable is unset.
    mig: a MIG device, a slice of `gpu`: its memory and compute are a part of that GPU's.
    basis: how the device was tied to its GPU, or why it could not be.
    """
    ordinal: int
    gpu: int | None
    entry: str | None
    mig: bool = False
    basis: str = ""


@dataclass(frozen=True)
class JobView:
    """The job's devices in torch's order, and what the variable's reading has to say (entries
    that ended the list, a duplicate, an order that may not be NVML's)."""
    devices: tuple[JobGpu, ...]
    notes: tuple[str, ...] = ()


def _bare_uuid(text: str | None) -> str | None:
    """A UUID without its "GPU-"/"MIG-" head, lower case: how NVML and CUDA's own UUID compare
    (torch prints cudaDeviceProp.uuid bare, NVML prefixes it)."""
    if not text:
        return None
    text = text.strip().lower()
    for head in ("gpu-", "mig-"):
        if text.startswith(head):
            return text[len(head):]
    return text


def _by_uuid_prefix(prefix: str, gpus: Sequence[Any]) -> tuple[int | None, str]:
    """(index, basis) of the one GPU whose UUID starts with `prefix`, or (None, why not)."""
    known = [g for g in gpus if getattr(g, "uuid", None)]
    if not known:
        return None, "no GPU UUID is known on this node (NVML not read)"
    hits = [g.index for g in known if g.uuid.lower().startswith(prefix.lower())]
    if len(hits) > 1:
        return None, f"{prefix} is the start of {len(hits)} GPUs' UUIDs (GPUs {', '.join(map(str, hits))})"
    if not hits:
        return None, f"{prefix} starts no GPU's UUID on this node"
    whole = next(g.uuid for g in known if g.index == hits[0])
    return hits[0], "UUID" if whole.lower() == prefix.lower() else f"UUID prefix of {whole}"


def _read_entry(entry: str, kind: str, gpus: Sequence[Any]) -> tuple[JobGpu | None, str]:
    """One entry as CUDA reads it: (the device, "") or (None, why the entry ends the list).
    A device whose GPU cannot be known (a MIG UUID) is a device with gpu None."""
    indices = {g.index for g in gpus}
    if kind == "index":
        match = _INDEX.match(entry)
        number = int(match.group()) if match else -1
        if number < 0:
            return None, f"{entry!r} is not a GPU index"
        if number not in indices:
            return None, f"there is no GPU {number} (this node has {len(indices)})"
        return JobGpu(0, number, entry, basis=f"index {number}"), ""
    if kind == "GPU":
        if not entry.startswith("GPU-"):
            return None, f"{entry!r} is not a GPU UUID, in a list that starts with one"
        gpu, basis = _by_uuid_prefix(entry, gpus)
        return (None, basis) if gpu is None else (JobGpu(0, gpu, entry, basis=basis), "")
    if not entry.startswith("MIG-"):
        return None, f"{entry!r} is not a MIG device, in a list that starts with one"
    if entry.startswith("MIG-GPU-"):  # the parent GPU's UUID, then /GPU instance/compute instance
        gpu, basis = _by_uuid_prefix(entry[len("MIG-"):].split("/")[0], gpus)
        if gpu is not None:
            return JobGpu(0, gpu, entry, mig=True, basis=f"MIG device of GPU {gpu} ({basis})"), ""
        return JobGpu(0, None, entry, mig=True, basis=f"MIG device whose GPU is unknown: {basis}"), ""
    return JobGpu(0, None, entry, mig=True,
                  basis="a MIG device's own UUID: which GPU it is part of takes NVML's MIG handles, "
                        "not read here"), ""


def job_gpus(setting: str | None, gpus: Sequence[Any], device_order: str | None = None) -> JobView:
    """torch's devices as CUDA_VISIBLE_DEVICES (`setting`; None: unset) makes them, over the node's
    `gpus`; `device_order` is CUDA_DEVICE_ORDER. See the rules above."""
    if setting is None:
        return JobView(tuple(JobGpu(i, g.index, None, basis=UNSET) for i, g in enumerate(gpus)))
    entries = [e.strip() for e in setting.split(",")] if setting.strip() else []
    kind = "GPU" if setting.strip().startswith("GPU-") else "MIG" if setting.strip().startswith("MIG-") else "index"
    devices: list[JobGpu] = []
    notes: list[str] = []
    for position, entry in enumerate(entries, 1):
        device, why = _read_entry(entry, kind, gpus)
        if device is None:
            rest = len(entries) - position
            notes.append(f"CUDA_VISIBLE_DEVICES={setting}: entry {position} ends the list, {why}; CUDA shows "
                         f"this job only the {len(devices)} device(s) before it"
                         + (f" and ignores the {rest} after it" if rest else ""))
            break
        same = [d for d in devices if (d.entry == device.entry if device.mig else d.gpu == device.gpu and not d.mig)]
        if same:
            twice = device.entry if device.mig else f"GPU {device.gpu}"
            notes.append(f"CUDA_VISIBLE_DEVICES={setting}: {twice} is named twice, and CUDA then shows this job "
                         "no device at all")
            return JobView((), tuple(notes))
        devices.append(replace(device, ordinal=len(devices)))
    names = {g.name for g in gpus if getattr(g, "name", None)}
    if kind == "index" and devices and len(names) > 1 and (device_order or "").strip() != "PCI_BUS_ID":
        notes.append(f"CUDA_VISIBLE_DEVICES={setting} counts GPUs in CUDA_DEVICE_ORDER="
                     f"{device_order or 'FASTEST_FIRST (the default)'}, which on this node of {len(names)} GPU "
                     "models may differ from the PCI order NVML and nvidia-smi number them in: the marks assume "
                     "PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID makes it so)")
    return JobView(tuple(devices), tuple(notes))


def _by_identity(uuid: str | None, bus_id: str | None, gpus: Sequence[Any]) -> tuple[int | None, bool, str]:
    """(index, mig, basis) of the GPU a CUDA device is by its own UUID, else by its PCI bus id (a MIG
    device has a UUID of its own, but its GPU's bus id); index None when neither matches."""
    bare = _bare_uuid(uuid)
    for g in gpus:
        if bare and _bare_uuid(getattr(g, "uuid", None)) == bare:
            return g.index, False, "CUDA's UUID of the device"
    for g in gpus:
        if bus_id and getattr(g, "pci_bus_id", None) and g.pci_bus_id.upper() == bus_id.upper():
            mig = bool(bare and getattr(g, "uuid", None))  # on the GPU's bus, not the GPU's UUID
            return g.index, mig, "CUDA's PCI bus id of the device" + (" (a MIG device of it)" if mig else "")
    return None, False, ""


def identify(view: JobView, identities: Sequence[tuple[str | None, str | None]], gpus: Sequence[Any]) -> JobView:
    """The view with each device tied by what CUDA itself said of it: `identities[i]` is the
    (UUID, PCI bus id) of torch's cuda:i. Their count is CUDA's own; a device neither matches
    keeps what the variable said, and a device whose CUDA identity contradicts the variable's
    reading gets a note."""
    if not identities:
        return view
    devices, notes = [], list(view.notes)
    for ordinal, (uuid, bus_id) in enumerate(identities):
        read = view.devices[ordinal] if ordinal < len(view.devices) else None
        gpu, mig, basis = _by_identity(uuid, bus_id, gpus)
        if gpu is None:
            devices.append(read if read is not None else
                           JobGpu(ordinal, None, None, basis="neither CUDA's UUID nor PCI bus id of the device "
                                                             "matches a GPU of this node"))
            continue
        entry = read.entry if read is not None else None
        if read is not None and read.gpu is not None and read.gpu != gpu:
            notes.append(f"cuda:{ordinal} is GPU {gpu} by {basis}, not GPU {read.gpu} as "
                         f"CUDA_VISIBLE_DEVICES entry {entry!r} read in PCI order suggests")
        devices.append(JobGpu(ordinal, gpu, entry, mig=mig or bool(read and read.mig), basis=basis))
    return JobView(tuple(devices), tuple(notes))


class Node(Protocol):
    """What of a `topology.build.Topology` the job's view reads (that module builds on this one)."""

    @property
    def gpus(self) -> Sequence[Any]: ...
    @property
    def visible_devices(self) -> str | None: ...
    @property
    def job_gpus(self) -> tuple[JobGpu, ...] | None: ...


def job_devices(topology: Node) -> tuple[JobGpu, ...]:
    """torch's devices on a node: its `job_gpus`; one without them (a saved `nvidia-smi topo -m`
    from elsewhere, a report written before they were kept) reads as a node without
    CUDA_VISIBLE_DEVICES, cuda:i being GPU i."""
    if topology.job_gpus is not None:
        return tuple(topology.job_gpus)
    return tuple(JobGpu(i, g.index, None, basis=UNSET) for i, g in enumerate(topology.gpus))


def job_gpu(topology: Node, ordinal: int = 0) -> tuple[Any, str]:
    """(the node's GPU record that torch's cuda:<ordinal> is, "") or (None, why there is none): a
    device that is not there, whose GPU is unknown, or a MIG device (only a slice of its GPU, so
    the GPU's name, memory and links do not describe it)."""
    devices = job_devices(topology)
    if ordinal >= len(devices):
        return None, f"this job sees {len(devices)} CUDA device(s), no cuda:{ordinal}"
    device = devices[ordinal]
    if device.gpu is None:
        return None, f"cuda:{ordinal} ({device.entry}) is not tied to a GPU of this node: {device.basis}"
    if device.mig:
        return None, (f"cuda:{ordinal} is a MIG device of GPU {device.gpu}: a slice of it, which the GPU's "
                      "name, memory and links do not describe")
    found = next((g for g in topology.gpus if g.index == device.gpu), None)
    return found, "" if found is not None else f"GPU {device.gpu} is not in the topology"


def gpu_marks(topology: Node) -> dict[int, str] | None:
    """GPU index -> the torch device(s) it is to the job ("cuda:0", "cuda:1 (MIG)"); None where
    nothing is to be marked: CUDA_VISIBLE_DEVICES unset (every GPU is the job's) or a topology that
    is not this process's node."""
    if topology.visible_devices is None or topology.job_gpus is None:
        return None
    marks: dict[int, list[str]] = {}
    for d in job_devices(topology):
        if d.gpu is not None:
            marks.setdefault(d.gpu, []).append(f"cuda:{d.ordinal}" + (" (MIG)" if d.mig else ""))
    return {gpu: ", ".join(names) for gpu, names in marks.items()}


def describe(devices: Sequence[JobGpu]) -> str:
    """"cuda:0 = GPU6, cuda:1 = a MIG device of GPU2, cuda:2 = unknown"."""
    def one(d: JobGpu) -> str:
        if d.gpu is None:
            return f"cuda:{d.ordinal} = unknown ({d.entry})" if d.entry else f"cuda:{d.ordinal} = unknown"
        return f"cuda:{d.ordinal} = {'a MIG device of ' if d.mig else ''}GPU{d.gpu}"
    return ", ".join(one(d) for d in devices) or "no device: CUDA shows this job no GPU"
