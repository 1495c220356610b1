"""What a training process holds on a GPU besides its tensors, and the optimizer step's transient:
each a figure or a range with its source, so the memory count names every part.

- The CUDA context: the driver's state and the kernels loaded into it. With lazy module loading
  (CUDA >= 11.7, PyTorch's default since pytorch/pytorch#86509) a process that has made one tensor
  holds 287,047,680 B (`cudaMemGetInfo` total - free), with every kernel loaded at start 666,632,192 B
  (the same PR's measurement): a training run loads the kernels it uses, so it lies between.
- What the driver keeps from CUDA: NVML's total over what CUDA hands out (`torch.cuda.
  get_device_properties(0).total_memory`), measured on the H200 of reports/gpu-nvidia-h200-20261126
  (machine.txt: 143771 MiB against 150,109,880,320 B): 644,939,776 B. One GPU's figure, used for all.
- NCCL's buffers, per communicator on each GPU: for each channel, each peer it receives from holds
  one buffer per protocol (src/transport/p2p.cc: the receiver allocates them; src/init.cc
  computeBuffSizes): Simple `NCCL_BUFFSIZE`, 4 MiB by default (NCCL docs, env.html; `DEFAULT_BUFFSIZE
  (1 << 22)`), LL `NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x 16 B` = 8 x 512 x 8 x 16
  = 512 KiB, LL128 `NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8 B` = 120 x 640 x
  8 x 8 = 4,915,200 B (src/include/device.h). The channels: at least the rings' (2 per ring,
  src/graph/connect.cc), at most MAXCHANNELS (32), each with a ring peer and at most a tree peer
  besides.
- The caching allocator's reserve over what is allocated: its rounding (counted from the op trace,
  `topoprof/trace/live_bytes.py`), and the split blocks it cannot hand out when memory runs short (it frees
  its unsplit cached blocks and retries before it fails, c10/cuda/CUDACachingAllocator.cpp
  `release_cached_blocks`): at an out-of-memory, reserved-but-unallocated was 1.83 of 75.31 GiB
  allocated (2.4 %, vllm-project/compressed-tensors#587, Llama 3.3 70B) and 121 MiB of 13.8 GiB (0.9 %,
  vllm-project/vllm#10637). Up to that 2.4 % is the range's top; a pattern that splits large blocks
  finely can strand far more (pytorch/pytorch#44742 saw 13 GB of a 32 GB card in split free blocks),
  which `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` avoids.
- cuBLAS's workspace: torch hands each cuBLAS handle a workspace per stream from its caching
  allocator (aten/src/ATen/cuda/CublasHandlePool.cpp `setWorkspaceForHandle`, `getNewWorkspace`), so
  it is in `max_memory_allocated` from the first matmul on, for the process's life. Its size
  (`parseChosenWorkspaceSize`, no CUBLAS_WORKSPACE_CONFIG): 4096 KiB x 8 = 32 MiB on compute
  capability 9.0, else 4096 KiB x 2 + 16 KiB x 8. Handles are reserved per thread (`thread_local`
  PoolWindow), and autograd runs a GPU's backward on its own device thread: a training step holds
  two. Seen on the H100 of reports/gpu-nvidia-h100-80gb-hbm3-20261127: 33,554,432 B beyond the tensors
  at the first forward matmul and 33,554,432 B more at the first backward's; a bf16 matmul under
  autocast added none (cuBLASLt shares it).
- The optimizer step: torch's default on CUDA is the foreach implementation
  (torch/optim/optimizer.py `_default_to_fused_or_foreach`). Adam/AdamW's (torch/optim/adam.py
  `_multi_tensor_adam`) makes a list the size of the gradients (`torch._foreach_mul(device_grads,
  1 - beta2)`), frees it, then one the size of exp_avg_sq (`torch._foreach_sqrt(device_exp_avg_sqs)`):
  one parameter-sized list of state at a time, after the backward has freed the activations. SGD's
  (torch/optim/sgd.py `_multi_tensor_sgd`) updates in place: none. Off CUDA (CPU ranks) the default
  is the for-loop implementation (`_single_tensor_adam`, per parameter in order: `denom =
  (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`): the square root and the quotient at once,
  while the previous parameter's `denom` lives until the name is bound again, so at parameter i
  two of its size and one of parameter i-1's (`single_tensor_transient`); SGD's (`_single_tensor_sgd`)
  updates in place: none.
"""
from __future__ import annotations

MB = 2 ** 20

CUDA_CONTEXT_BYTES = (287_047_680, 666_632_192)
CUDA_CONTEXT_BASIS = ("0.29-0.67 GB: a process with one tensor, kernels loaded lazily (CUDA's default) or all at start "
                      "(pytorch/pytorch#86509)")

DRIVER_RESERVE_BYTES = 150_754_820_096 - 150_109_880_320  # NVML total (143771 MiB) - CUDA total, H200
DRIVER_RESERVE_BASIS = ("NVML's total over what CUDA hands out: 0.64 GB on the H200 of "
                        "reports/gpu-nvidia-h200-20261126 "
                        "(machine.txt), taken for every GPU")

NCCL_SIMPLE_BYTES = 4 * MB                  # NCCL_BUFFSIZE default
NCCL_LL_BYTES = 8 * 512 * 8 * 16            # lines/thread x threads x steps x 16 B
NCCL_LL128_BYTES = 120 * 640 * 8 * 8        # elements/thread x threads x steps x 8 B
NCCL_CONNECTION_BYTES = NCCL_SIMPLE_BYTES + NCCL_LL_BYTES + NCCL_LL128_BYTES
NCCL_CHANNELS_PER_RING = 2                  # src/graph/connect.cc
NCCL_MAX_CHANNELS = 32                      # MAXCHANNELS, src/include/device.h
NCCL_BASIS = ("per channel and peer, Simple 4 MiB (NCCL_BUFFSIZE) + LL 0.5 MiB + LL128 4.7 MiB (NCCL "
              "src/include/device.h, src/init.cc); 2 channels per ring and one ring peer, up to 32 channels with a "
              "ring and a tree peer")

FRAGMENTATION_SHARE = (0.0, 0.024)
ALLOCATOR_BASIS = ("the caching allocator's rounding (512 B blocks, large segments to 2 MiB, counted from the op "
                   "trace) and up to 2.4 % of what is allocated stranded in split blocks at an out-of-memory "
                   "(vllm-project/compressed-tensors#587: 1.83 of 75.31 GiB; vllm#10637: 0.9 %)")

CUBLAS_WORKSPACE_SM90 = 4096 * 1024 * 8
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_HANDLES_IN_TRAINING = 2  # the thread that runs the forward and autograd's device thread


def cublas_workspace(capability: tuple[int, int] | None) -> tuple[float, str]:
    """Bytes of cuBLAS workspace a training process holds on a GPU of `capability` (module
    docstring), and its basis; an unknown GPU is read as not 9.0."""
    each = CUBLAS_WORKSPACE_SM90 if capability == (9, 0) else CUBLAS_WORKSPACE_OTHER
    gpu = ("compute capability 9.0" if capability == (9, 0) else
           f"compute capability {capability[0]}.{capability[1]}" if capability else "a GPU not named (not 9.0)")
    return (CUBLAS_HANDLES_IN_TRAINING * each,
            f"{each / MB:g} MiB per cuBLAS handle on {gpu} (torch's CublasHandlePool.cpp "
            "parseChosenWorkspaceSize), one for the forward's thread and one for autograd's backward thread, from "
            "the caching allocator at the first matmul")


# Optimizer state lists the foreach step holds at once, in parameters' worth of state (module docstring)
OPTIMIZER_TRANSIENT_LISTS = {"adamw": 1, "adam": 1, "sgd_momentum": 0, "sgd": 0}
OPTIMIZER_TRANSIENT_BASIS = {
    "adamw": "foreach AdamW (torch's CUDA default): one parameter-sized list of state at a time (torch/optim/adam.py "
             "_multi_tensor_adam: _foreach_mul of the gradients, then _foreach_sqrt of exp_avg_sq)",
    "sgd": "foreach SGD updates in place (torch/optim/sgd.py _multi_tensor_sgd): none",
}
OPTIMIZER_TRANSIENT_BASIS["adam"] = OPTIMIZER_TRANSIENT_BASIS["adamw"]
OPTIMIZER_TRANSIENT_BASIS["sgd_momentum"] = OPTIMIZER_TRANSIENT_BASIS["sgd"]


def nccl_bytes(rings: int) -> tuple[float, float]:
    """(low, high) bytes one NCCL communicator holds on each GPU (module docstring)."""
    low = min(NCCL_MAX_CHANNELS, NCCL_CHANNELS_PER_RING * max(1, rings)) * NCCL_CONNECTION_BYTES
    return float(low), float(NCCL_MAX_CHANNELS * 2 * NCCL_CONNECTION_BYTES)


def communicators(strategy: str, world_size: int) -> int:
    """NCCL communicators a strategy's process holds: none on one GPU or for `single`; HSDP's two
    (its shard group and its replicate group); one otherwise (DDP's, FSDP's, DataParallel's
    broadcast and reduce over its GPUs)."""
    if world_size <= 1 or strategy == "single":
        return 0
    return 2 if strategy.startswith("hsdp") else 1


def single_tensor_transient(optimizer: str, numels: tuple[int, ...]) -> int:
    """Elements the for-loop optimizer holds at once beyond its states (module docstring):
    Adam/AdamW the most of 2 x n_i + n_(i-1) over the parameters in order; SGD none."""
    if OPTIMIZER_TRANSIENT_LISTS.get(optimizer, 0) == 0:
        return 0
    return max((2 * n + prev for prev, n in zip((0, *numels), numels)), default=0)
