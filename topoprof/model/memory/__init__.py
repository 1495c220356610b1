"""Memory per GPU: what each strategy holds, part by part (`holding`: weights, gradients,
optimizer state, DDP's buckets, FSDP's unsharded groups, activations, the logits, autocast's copies,
the backward's and the optimizer step's transients), what a micro-batch holds under each
activation checkpointing mode counted from the model's op trace (`traced`), what the process holds
besides its tensors (`environment`: the CUDA context, NCCL's buffers, the allocator's reserve), and
whether it fits.

`traced` reads the op trace for this room's concern, as `topoprof.model.compute.traced` does for
compute; `timeline` is this room's timeline of a micro-batch, as DDP's and FSDP's rooms have theirs.

Owns: the counts and the fit. May import: workload (the checkpointing modes, a model's layout); nothing
else of the model.
"""
