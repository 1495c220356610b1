"""Memory per GPU: what each strategy holds, part by part (`holding`: weights, gradients,
optimizer state, DDP's buckets, FSDP's unsharded groups, activations, the logits, autocast's copies,
the backward's and the optimizer step's transients), what a micro-batch holds under each
activation checkpointing mode counted from the model's op trace (`traced`), what the process holds
besides its tensors (`environment`: the CUDA context, NCCL's buffers, the allocator's reserve), and
whether it fits.

Owns: the counts and the fit. May import: workload (the checkpointing modes); nothing else of the
model.
"""
