"""The rank side: `fork_server` is the process the launcher starts
(`python -m topoprof.probes.ranks.fork_server`) and forks each rank from, `rank_main` what one rank
runs, and each other module a worker it runs:
`collective_timing`, `copy_bandwidth`, `training`, `validation`, `fsdp`, `numerics`, `nodes`, and
`model_timing` (the only place the user's own model code runs on its device).
May import: the base, `topoprof.specs`, `topoprof.workload`, `topoprof.zoo`, `topoprof.trace`, the
hardware readers and the topology stage; never measure or anything after it."""
