"""Which GPU a CUDA device of this process is, as CUDA itself says: its UUID and PCI bus id.

torch's `cuda:i` is the i-th device CUDA shows the process (CUDA_VISIBLE_DEVICES chooses and
orders them), while NVML numbers every GPU of the node in PCI order; a device's own UUID and bus
id tie the two together whatever the variable says (`topoprof.topology.visible`). Asked only by
code that has started CUDA already (the rank workers, the copy probe), never by `topoprof topo`.
Check by hand: `python -c "import torch; print(torch.cuda.get_device_properties(0))"` beside
`nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv`.
"""
from __future__ import annotations

from topoprof.probes.hardware.nvml import normalize_bus_id


def device_identity(torch, device) -> tuple[str | None, str | None]:
    """(UUID, PCI bus id) of a CUDA device: cudaDeviceProp.uuid as torch prints it (bare, without
    NVML's "GPU-"; a MIG device's is its own) and pciDomainID:pciBusID:pciDeviceID.0 in NVML's
    form. Each is None where this torch does not expose it (the bus id fields are recent)."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    parts = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    bus_id = None
    if all(isinstance(p, int) for p in parts):
        bus_id = normalize_bus_id(f"{parts[0]:x}:{parts[1]:x}:{parts[2]:x}.0")
    return (str(uuid) if uuid is not None else None), bus_id
