"""torch.nn.DataParallel's communication per micro-batch, none of it overlapped with compute:
`replicate` broadcasts every parameter from GPU 0, `gather` brings the outputs to GPU 0, and
after the whole backward `ReduceAddCoalesced` sums every gradient onto GPU 0, both in 10 MiB
chunks. torch/nn/parallel/data_parallel.py, replicate.py, _functions.py, comm.py, torch/_utils.py.
"""
from __future__ import annotations

from collections.abc import Sequence

from topoprof.model.comm.collectives import CommModel

DATAPARALLEL_COALESCE_BYTES = 10485760  # torch/nn/parallel/comm.py buffer_size (10 MiB)


def take_tensors(sizes_bytes: Sequence[int], size_limit: int = DATAPARALLEL_COALESCE_BYTES
                 ) -> list[int]:
    """Chunk sizes of torch `_take_tensors` (torch/_utils.py), which DataParallel's
    `broadcast_coalesced` and `reduce_add_coalesced` use: start a new chunk when the next
    tensor would push it past the limit; a tensor larger than the limit travels alone."""
    chunks: list[int] = []
    current = 0
    for size in sizes_bytes:
        if current + size > size_limit and current > 0:
            chunks.append(current)
            current = 0
        current += size
    if current > 0:
        chunks.append(current)
    return chunks


def dataparallel_comm_s(comm: CommModel, numel: Sequence[int], param_bytes: int,
                        grad_bytes: int, output_bytes: int) -> float:
    """torch.nn.DataParallel per forward/backward, none of it overlapped with compute:
    `replicate` broadcasts every parameter from GPU 0 (`broadcast_coalesced`, 10 MiB chunks),
    `gather` copies each GPU's outputs to GPU 0, and after the whole backward
    `ReduceAddCoalesced` sums every gradient onto GPU 0 (10 MiB chunks, NCCL reduce).
    torch/nn/parallel/data_parallel.py, replicate.py, _functions.py, comm.py."""
    broadcast = sum(comm.broadcast_s(c) for c in take_tensors([n * param_bytes for n in numel]))
    reduce = sum(comm.reduce_s(c) for c in take_tensors([n * grad_bytes for n in numel]))
    return broadcast + reduce + (comm.gather_s(output_bytes) if output_bytes else 0.0)
