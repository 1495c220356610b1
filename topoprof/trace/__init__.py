"""The meta-device trace stage. Takes a module from the zoo and the device it stands for, and
gives one forward and backward op by op on the meta device (`op_trace`): FLOPs, bytes, the
gradient-ready order and what is alive when (`live_bytes`), with the kernels and casts the target
device runs where meta cannot tell (`target_lens`); `meta_device` builds on meta and
`activation_bytes` counts saved tensors through autograd's hooks, as a check on the trace.
It touches no hardware: it runs wherever torch imports. May import: the base, `topoprof.workload`
and `topoprof.zoo`."""
