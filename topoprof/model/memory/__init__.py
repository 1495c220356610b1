"""Memory per GPU: what each strategy holds, part by part (`holding`: weights, gradients,
optimizer state, DDP's buckets, FSDP's unsharded groups, activations), and whether it fits.

Owns: the counts and the fit. May import: nothing else of the model.
"""
