"""DistributedDataParallel: its gradient buckets as torch forms them (`buckets`), the timeline
of one synced micro-batch (`timeline`: bucket all-reduces beside backward, the copies), and what it
costs on a GPU beyond the all-reduces (`gpu_costs`: its kernels, NCCL's SMs, the slowest rank).

`timeline` and `gpu_costs` have namesakes in `topoprof.model.fsdp` in the same roles.

Owns: DDP's mechanics. May import: workload, comm, compute.
"""
