"""The measurement stage. Takes a job (which worker, how many ranks, which backend) and gives
what the ranks measured: bench rows (time, algbw, busbw, #wrong per size), their fit
t(S) = alpha + S/beta, slow ranks, the transports NCCL chose, the nodes of a multi-node job.

  launch, runner  start and watch local ranks, or run as one rank of torchrun/SLURM
  bench           a collective sweep end to end, and its JSON payload
  collectives     the collectives and their bus-bandwidth factors (nccl-tests')
  fit, spread     the alpha-beta fit; ranks consistently slower than the others
  cluster         per-node facts of a multi-node job, compared
  nccl_tests      nccl-tests *_perf logs read into the same rows
  nccl_log        NCCL_DEBUG=INFO logs: transports and channels per peer pair
  user_model      the user's own model (`--model`) read and timed in a process of its own
  op_trace        a model's pass on the meta device, in a process of its own
  profile         this machine's device profile (`topoprof profile`), in a process of its own
  torch_support   the oldest torch topoprof runs on, and the features that need a newer one

`bench`, `profile` and `user_model` share their names with the command (`topoprof.commands`) and
the model's inputs (`topoprof.model.inputs.user_model`) of the same feature: each is that
feature's measuring stage.
"""
