"""How long one micro-batch takes on a device: the GPU datasheets (`datasheet`), the `Compute` a
prediction takes and its seconds (`timing`), a model's own op trace priced and composed as the
device runs it (`roofline`: the composition and the datasheet path; `roofline_terms`: the ranges and
terms they share; `op_kinds`: what each op is; `profiled`: each op from a device profile's rates;
`host_costs`: the host's time per op by kind; `fusion`: the trace as torch.compile fuses it), which
module to trace and how it is priced for a GPU (`traced`), what the pricing found beside its seconds
(`modelled`), a model's compute as timed here, or by its blocks where it is too large for one GPU
(`measured`); a device profile measured by `topoprof profile` (`profile`: its format and lookups,
with `profile_records` and `profile_reader`; `profile_interp`: interpolation over its grids;
`profile_scale`: carried to another GPU by datasheet ratios; `profile_facts`: the shared H200 facts
in its format; `profile_choice`: which profile prices a what-if; `profiles/`: the profiles shipped).

Owns: per-device figures and compute time. May import: workload (what is traced), specs (the
traced and timed records).
"""
