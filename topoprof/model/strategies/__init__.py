"""Every strategy's predicted step, put together from the rooms below: a job's inputs
(`job`: Workload, Cluster, ModelInputs), resolved to numbers with their sources (`resolve`), each
strategy's step (`steps`), memory per strategy (`memory`), `predict` and what changing K, the GPU
count or the global batch would gain (`predict`), DataParallel's traffic (`dataparallel`), a
one-GPU node's what-ifs (`whatif`), the records (`results`) and their JSON (`payload`).

`memory`, `steps` and `whatif` are charted by `topoprof.report.plots`' namesakes; `job` is one
training job as the model takes it.

Owns: the strategies and the prediction. May import: workload, comm, compute, ddp, fsdp, memory.
"""
