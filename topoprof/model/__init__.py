"""The model stage. Takes a workload (a parameter layout, `topoprof.workload`), compute per micro-batch, and links
(a measured fit, a topology's nominal ring, or numbers) and gives the predicted step time of
every strategy (single, dp, ddp_synced, ddp_no_sync, ddp_no_sync_backward_only,
ddp_fp16_compress, FSDP2's and HSDP's), what communication stays exposed, what fits in memory,
and what changing K or the GPU count would gain; `validate` checks it against real training loops.

Its rooms, each importing only those above it in this list (tests/test_layering.py holds it):

  comm         how long a collective takes on links
  compute      how long a micro-batch takes on a device: datasheets, the roofline over op traces
  ddp          DDP's buckets, its timeline, its costs on a GPU
  fsdp         FSDP2's groups and timeline
  memory       what each strategy holds per GPU, and whether it fits
  strategies   every strategy's step, put together; sweeps, what-ifs, the JSON
  inputs       from a command's options or a scan's measurements to the model's inputs
  validate     predicted vs measured on real training loops
"""
