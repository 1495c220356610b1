"""The model stage. Takes a workload (a parameter layout), compute per micro-batch, and links
(a measured fit, a topology's nominal ring, or numbers) and gives the predicted step time of
every strategy (single, dp, ddp_synced, ddp_no_sync, ddp_no_sync_backward_only,
ddp_fp16_compress), what communication stays exposed, and what changing K or the GPU count
would gain; `validate` checks it against real training loops.

  inputs        the model's inputs from what a user gives
  presets, synthetic  parameter layouts: real architectures, the synthetic model
  user_model    the user's own model (`--model`): its measured layout and compute
  compute       datasheet figures, compute and optimizer time
  roofline, traced  compute from the model's own operations (its op trace) on a device
  comm, links   collective times (ring, fit, measured curve, several nodes)
  buckets       DDP's gradient buckets, as torch forms them
  ddp           the DDP timeline of one synced micro-batch (one entry point)
  dataparallel  torch.nn.DataParallel's traffic
  strategies    step time per strategy, sweeps, thresholds; `results` are its records
  payload       a prediction as JSON; `predictions` the ones a scan makes
  validate      predicted vs measured on real loops; `rotations` reads their samples
  tcp           what TCP's slow start after idle can cost a multi-node step
"""
