"""How long one micro-batch takes on a device: the GPU datasheets (`datasheet`), the
`Compute` a prediction takes and its seconds (`timing`), the roofline that prices a model's own op
trace (`roofline`), which module to trace and how it is priced for a GPU (`traced`), and a model
too large for one GPU timed by its blocks (`scaled`); a device profile measured by `topoprof
profile` (`profile`: its format and lookups; `profile_interp`: interpolation over its grids;
`profile_scale`: carried to another GPU by datasheet ratios; `profile_facts`: the shared H200
facts in its format).

Owns: per-device figures and compute time. May import: workload (what is traced).
"""
