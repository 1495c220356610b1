"""FSDP2 (`fully_shard`): its groups (`plan`: which parameters each group holds, in forward
order) and the timeline of a micro-batch and a step (`timeline`: all-gathers, reduce-scatters,
HSDP's all-reduce beside compute, with and without `set_requires_gradient_sync`), and what it
costs on a GPU beside its collectives (`gpu_costs`: its copies and its hooks' host steps);
`timeline` and `gpu_costs` in the roles of DDP's namesakes.

Owns: FSDP's mechanics. May import: workload, comm.
"""
