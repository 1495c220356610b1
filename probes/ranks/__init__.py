"""The rank side: `rank_main` is the entry point of one rank the launcher starts
(`python -m topoprof.probes.ranks.rank_main`), and each other module a worker it runs:
`collective_timing`, `copy_bandwidth`, `training`, `validation`, `fsdp`, `numerics`, `nodes`, and
`model_timing` (the only place the user's own model code runs on its device).
May import: the base, `topoprof.specs`, `topoprof.workload`, `topoprof.zoo`, `topoprof.trace`, the
hardware readers and the topology stage; never measure or anything after it."""
