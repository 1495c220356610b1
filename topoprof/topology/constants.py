"""Nominal link bandwidths: the one table of interconnect constants, each with its source.

All figures are GB/s (1e9 bytes/s) per direction, as NCCL models them when it builds its
topology graph; they are what a link is *expected* to carry before anything is measured.

Sources
- NCCL: NVIDIA/nccl `src/graph/topo.h` (v2.2x-2.30): SM60_NVLINK_BW 18.0, SM70_NVLINK_BW 20.0,
  SM80_NVLINK_BW 20.0, SM86_NVLINK_BW 12.0, SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1,
  PCI_BW 12.0 ("PCI Gen3 x16"), NET_BW 12.0 ("100Gbit").
- NCCL `src/graph/topo.cc`/`xml.cc`: PCIe link bandwidth = width x per-lane rate / 80, with the
  per-lane rates 15/30/60/120/240/480 for 2.5/5/8/16/32/64 GT/s (Gen1..Gen6), so x16 gives
  3, 6, 12, 24, 48, 96 GB/s. (Theoretical x16: 4, 8, 15.75, 31.5, 63, 126 GB/s; NCCL's figure
  is what its own model uses and what a busy link delivers after protocol overhead.)
- NVIDIA datasheets (V100, A100, H100 SXM): 25 GB/s per link per direction, 6/12/18 links.
"""
from __future__ import annotations

# NCCL src/graph/topo.h, per NVLink per direction, keyed by compute capability (major, minor).
# Lookup falls back from (major, minor) to (major, None) so sm87/sm89 and future minors of a
# known major find their family; a major not in the table returns None (never a borrowed number).
NVLINK_GBPS_BY_SM: dict[tuple[int, int | None], float] = {
    (6, None): 18.0,   # SM60_NVLINK_BW (P100)
    (7, None): 20.0,   # SM70_NVLINK_BW (V100)
    (8, None): 20.0,   # SM80_NVLINK_BW (A100)
    (8, 6): 12.0,      # SM86_NVLINK_BW (A40, RTX A6000, RTX 3090 bridge)
    (9, None): 20.6,   # SM90_NVLINK_BW (H100, H200)
    (10, None): 40.1,  # SM100_NVLINK_BW (B200, GB200)
}

# NVIDIA datasheets, SXM parts on NVSwitch baseboards: NVLinks per GPU and each link's raw
# bandwidth per direction (GB/s). V100 SXM2: 6 x 25 (300 GB/s total, both directions); A100 SXM4:
# 12 x 25 (600 GB/s); H100/H200 SXM5: 18 x 25 (900 GB/s); B200: 18 x 50 (1.8 TB/s). With NCCL's
# per-link figure above this gives the range a what-if on NVLink uses.
NVLINK_DATASHEET_BY_SM: dict[tuple[int, int | None], tuple[int, float]] = {
    (7, None): (6, 25.0),
    (8, None): (12, 25.0),
    (9, None): (18, 25.0),
    (10, None): (18, 50.0),
}

# The most NVLinks any GPU in the table has (H100/B200: 18). A GPU whose NV# counts to its peers
# add up to more than its generation's links (8 GPUs printing NV12 or NV18 for every pair) reaches
# them through NVSwitch: each pair sees all of the GPU's switch links, not links of its own.
MAX_NVLINKS_PER_GPU = max(links for links, _ in NVLINK_DATASHEET_BY_SM.values())

# PCIe transfer rate per lane (GT/s) by generation (PCI-SIG base specifications) and the line
# encoding: 8b/10b for Gen1-2, 128b/130b for Gen3-5. Raw x16 Gen4 = 16 x 16 x 128/130 / 8 = 31.5 GB/s.
PCIE_GT_PER_S_BY_GEN: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}

# NCCL topo.cc: per-lane rate index for PCIe generation n, bandwidth = width * rate / 80.
PCIE_LANE_RATE_BY_GEN: dict[int, float] = {1: 15.0, 2: 30.0, 3: 60.0, 4: 120.0, 5: 240.0, 6: 480.0}

# Host-staged GPU pairs (PHB, NODE, SYS, or P2P unavailable): NCCL copies through pinned host
# shared memory. Its real rate depends on the CPU, memory and PCIe and varies widely: about 1 to
# 6 GB/s has been observed on workstations and cloud VMs (DESIGN.md section 3; e.g. the nccl-tests
# table in tests/fixtures/topo/22_*: 4.0 GB/s busbw on a P2P-less PIX pair). The range is given
# as uncertain, never as a single number, until bench measures it.
HOST_STAGED_RANGE_GBPS: tuple[float, float] = (1.0, 6.0)

# The standard node: NVIDIA's HGX/DGX baseboards join 8 SXM GPUs through NVSwitch (DGX A100, DGX
# H100/H200 user guides: 8 GPUs per system), and NVIDIA's PCIe server designs hold up to 8 cards
# (NVIDIA OVX: 8 L40S per server). The most GPUs one node is assumed to hold where no link is given.
STANDARD_NODE_GPUS = 8

# NCCL topo.h NET_BW 12.0 for 100 Gbit/s: a NIC's GB/s is its Gbit/s / 8 (before protocol overhead).
BITS_PER_BYTE = 8


def nvlink_gbps_per_link(compute_capability: tuple[int, int] | None) -> float | None:
    """NCCL's per-link NVLink bandwidth for a compute capability, or None if unknown."""
    if compute_capability is None:
        return None
    major, minor = compute_capability
    if (major, minor) in NVLINK_GBPS_BY_SM:
        return NVLINK_GBPS_BY_SM[(major, minor)]
    return NVLINK_GBPS_BY_SM.get((major, None))


def nvlink_gbps_bounds() -> tuple[float, float]:
    """Smallest and largest per-link figure in the table: the range when the GPU is unknown."""
    values = NVLINK_GBPS_BY_SM.values()
    return min(values), max(values)


def pcie_gbps(generation: int | None, width: int | None) -> float | None:
    """NCCL's PCIe link bandwidth (width x lane rate / 80), or None if either input is unknown."""
    if generation is None or width is None or generation not in PCIE_LANE_RATE_BY_GEN:
        return None
    return width * PCIE_LANE_RATE_BY_GEN[generation] / 80.0


def nvlink_datasheet(compute_capability: tuple[int, int] | None) -> tuple[int, float] | None:
    """(links per GPU, raw GB/s per link per direction) of an SXM part of this generation, or None."""
    if compute_capability is None:
        return None
    major, minor = compute_capability
    return NVLINK_DATASHEET_BY_SM.get((major, minor)) or NVLINK_DATASHEET_BY_SM.get((major, None))


def pcie_raw_gbps(generation: int | None, width: int | None) -> float | None:
    """The link's raw rate per direction after line encoding, or None if unknown."""
    if generation is None or width is None or generation not in PCIE_GT_PER_S_BY_GEN:
        return None
    encoding = 0.8 if generation <= 2 else 128 / 130
    return width * PCIE_GT_PER_S_BY_GEN[generation] * encoding / BITS_PER_BYTE


def nic_gbps(rate_gbit: float | None) -> float | None:
    """A NIC's nominal GB/s from its link rate in Gbit/s (NCCL: 100 Gbit ~ 12 GB/s)."""
    if rate_gbit is None or rate_gbit <= 0:
        return None
    return rate_gbit / BITS_PER_BYTE

# NCCL src/graph/tuning.cc (ring algorithm, Simple protocol, the one large messages use):
# baseLat 8.4 us once per collective, hwLat per ring step 3.4 us over NVLink and 5.7 us over PCIe;
# 14 us per network step (DESIGN.md section 3, NCCL v2.30.x). Host-staged (SHM) pairs cross PCIe
# twice, and are given the PCIe figure: their bandwidth, not latency, is the uncertain part.
RING_BASE_LATENCY_US = 8.4
HOP_LATENCY_US = {"NV": 3.4, "PCIE": 5.7, "NET": 14.0}
