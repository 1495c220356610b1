"""The probes: where topoprof reads the hardware and measures it. Installed as `topoprof.probes`.

Its rooms, by concern:

  hardware        readers of the machine: `nvidia-smi topo -m`, NVML, the host (CPU, NUMA, NICs),
                  CUDA's device ids; one module per interface
  ranks           the rank processes the launcher forks (`fork_server`, `rank_main`) and their workers: the
                  collectives, the copies, the training and validation loops, FSDP2, the numerics,
                  the nodes, and the user's model timed on its device
  device_profile  `topoprof profile`'s worker: what this GPU (or CPU) does with eager PyTorch work

They read the definitions below them (`topoprof.specs`, `topoprof.workload`), the models they build
(`topoprof.zoo`) and the meta-device trace (`topoprof.trace`); the rank side may ask the topology
stage for its node's wiring. Nothing here imports the stages that read their results.
"""
