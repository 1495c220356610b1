"""The hardware readers, one module per interface, below the topology stage that combines them:
`nvidia_smi` (with `smi_table` and `smi_text`, its matrix and text), `nvml`, `host` (CPU, NUMA,
NIC rates from /proc and /sys), `cuda_ids` (which CUDA device is which PCI bus id).
Each reads; none decides. May import: topoprof's base (errors) only."""
