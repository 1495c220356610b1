"""From what a user or a scan gives to the model's inputs, in two stages:

  gather       runs, traces and reads what a `model` request leaves open: the user's own model
               and a preset timed here (`user_model`), the passes on meta (`traces`), the files,
               this machine's topology; into the typed records of `evidence`
  resolve      the request and those records alone into the model's inputs; pure, as are
               `link_choice` (the links from the first source given), `evidence`,
               `user_record` (the layout and ready order made of a model's record),
               `candidates` (what the passes trace, and their compute priced) and `search`

The search for what fits is a second round: the memory predicted names its candidates, whose
passes `gather.gather_candidates` runs and `search.fits_priced` prices. `scan` makes the
predictions a scan makes from what it measured; `request` is the command's typed request, as
`topoprof.scan.options` is the scan's.

Owns: measuring and tracing what the prediction needs, and the choice of sources. May import:
every room below it (workload, comm, compute, ddp, fsdp, memory, strategies).
"""
