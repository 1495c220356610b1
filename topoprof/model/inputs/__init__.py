"""From what a user or a scan gives to the model's inputs: the `model` command's options
(`options`), the user's own model and a preset timed here (`user_model`), and the predictions a
scan makes from what it measured (`scan`).

Owns: measuring and tracing what the prediction needs, and the choice of sources. May import:
every room below it (workload, comm, compute, ddp, fsdp, memory, strategies).
"""
