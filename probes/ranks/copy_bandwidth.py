"""GPU copy bandwidth, as nvbandwidth's host_to_device / device_to_host / device_to_device tests.

- host->device and device->host per GPU from pinned host memory (cudaMemcpyAsync);
- GPU->GPU for every ordered pair, with peer access enabled where the pair supports it (a copy
  between GPUs without P2P is staged through host memory by the driver, which the matrix shows).
Each figure: `warmup` copies, then `iters` timed copies of `size_bytes`, CUDA events on the stream
that issues them, bandwidth = size x iters / elapsed (GB/s = 1e9 B/s).

Check by hand: `nvbandwidth -t host_to_device_memcpy_ce device_to_host_memcpy_ce
device_to_device_memcpy_read_ce`, or CUDA samples' `p2pBandwidthLatencyTest`.
"""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.errors import NothingMeasured
from topoprof.probes.hardware.cuda_ids import device_identity


@dataclass(frozen=True)
class CopyMeasurement:
    kind: str                 # "h2d", "d2h", "d2d"
    src: str                  # "host" or "cuda:N"
    dst: str
    size_bytes: int
    bandwidth_gbps: float
    p2p: bool | None          # d2d only: peer access enabled for this pair


@dataclass(frozen=True)
class CopyReport:
    size_bytes: int
    iters: int
    measurements: tuple[CopyMeasurement, ...]
    device_names: tuple[str, ...]
    # cuda:i's own UUID and PCI bus id (probes/hardware/cuda_ids.py): which of the node's GPUs it is, so that
    # its copies are judged against that GPU's link whatever CUDA_VISIBLE_DEVICES chose
    device_uuids: tuple[str | None, ...] = ()
    device_bus_ids: tuple[str | None, ...] = ()


def _time_copies(torch, dst, src, iters: int, warmup: int, stream_device) -> float:
    """Seconds per copy, timed with CUDA events on `stream_device`'s current stream."""
    with torch.cuda.device(stream_device):
        for _ in range(warmup):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters


def _host_device(torch, dev: int, size: int, iters: int, warmup: int) -> list[CopyMeasurement]:
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dev}")
    out = []
    for kind, dst, src, a, b in (("h2d", gpu, host, "host", f"cuda:{dev}"),
                                 ("d2h", host, gpu, f"cuda:{dev}", "host")):
        sec = _time_copies(torch, dst, src, iters, warmup, dev)
        out.append(CopyMeasurement(kind, a, b, size, size / sec / 1e9, None))
    return out


def _device_device(torch, a: int, b: int, size: int, iters: int, warmup: int) -> CopyMeasurement:
    src = torch.empty(size, dtype=torch.uint8, device=f"cuda:{a}")
    dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{b}")
    p2p = None if a == b else bool(torch.cuda.can_device_access_peer(a, b))
    sec = _time_copies(torch, dst, src, iters, warmup, a)
    return CopyMeasurement("d2d", f"cuda:{a}", f"cuda:{b}", size, size / sec / 1e9, p2p)


def measure_copies(size_bytes: int = 256 << 20, iters: int = 10, warmup: int = 2) -> CopyReport:
    """Measure every copy path of the visible GPUs; NothingMeasured without a CUDA GPU."""
    try:
        import torch  # lazy: torch; the CLI imports this module and runs without torch
    except ImportError as err:  # pragma: no cover - torch is a dependency
        raise NothingMeasured(f"copies need torch with CUDA: {err}") from err
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise NothingMeasured("copy bandwidth needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    n = torch.cuda.device_count()
    found: list[CopyMeasurement] = []
    for dev in range(n):
        found += _host_device(torch, dev, size_bytes, iters, warmup)
    # One GPU alone: device->device within the same GPU shows HBM copy bandwidth (read + write).
    for a in range(n):
        for b in range(n):
            found.append(_device_device(torch, a, b, size_bytes, iters, warmup))

    names = tuple(torch.cuda.get_device_name(d) for d in range(n))
    uuids, buses = zip(*(device_identity(torch, f"cuda:{d}") for d in range(n)))
    return CopyReport(size_bytes, iters, tuple(found), names, tuple(uuids), tuple(buses))
