"""The device profile's document, as `topoprof profile`'s worker writes it
(`topoprof.probes.device_profile`) and the compute model reads it (`topoprof.model.compute.profile`):
its kind, its schema versions, and the attention FLOP convention its rates are stated in."""
from __future__ import annotations

PROFILE_KIND = "device_profile"
PROFILE_SCHEMA_VERSION = 1       # what this topoprof writes
OLDEST_SCHEMA_VERSION = 1        # the oldest it still reads
SDPA_CONVENTION = ("forward + backward FLOPs = 3.5 x the forward's 4 b h t^2 d (two matmuls forward, five backward), "
                   "halved when causal; over the time of one forward + backward (shared/gpu-facts/opbench.py)")
