"""The wiring stage. Takes what the probes read (the `nvidia-smi topo -m` matrix, an NVML
snapshot, the host), or a saved file, and gives a `Topology`: every GPU and NIC, every GPU pair's
path, P2P status and nominal bandwidth per direction with its basis (a range where uncertain),
and what became of each source.

  collect    ask each probe, a failure becomes a status         -> Topology
  build      combine the sources                                 -> Topology
  load       a saved `nvidia-smi topo -m` text or topology JSON  -> Topology
  constants  NCCL's and the datasheets' link figures, with sources
  visible    which GPUs are the job's (CUDA_VISIBLE_DEVICES, CUDA's own ids) -> job_gpus
  render     the Topology as text tables
"""
