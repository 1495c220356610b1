"""From what a user or a scan gives to the model's inputs: the `model` command's options
(`options`), the user's own model and a preset timed here (`user_model`), and the predictions a
scan makes from what it measured (`scan`).

Each module is the inputs stage of the feature of its name elsewhere: `options` as the scan's
request (`topoprof.scan.options`), `user_model` as its measurement (`topoprof.measure.user_model`),
`scan` as the command, `search` as the search over micro-batch sizes itself
(`topoprof.model.strategies.search`).

Owns: measuring and tracing what the prediction needs, and the choice of sources. May import:
every room below it (workload, comm, compute, ddp, fsdp, memory, strategies).
"""
