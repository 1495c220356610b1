"""`topoprof profile`'s worker (`profile_worker`): what this GPU or CPU really does with eager
PyTorch work, measured section by section (`sections`) from a plan of shapes (`plan`) with one
clock (`clock`, `timing_run`); `device_costs` is what a CPU costs beyond a GPU's sections.
Its document's schema is `topoprof.specs.profile_schema`. May import what the ranks may."""
