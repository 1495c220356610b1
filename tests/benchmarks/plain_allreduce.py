"""The plainest torch.distributed all-reduce timing loop: the reference topoprof's bench must match.

Run as one rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment). Prints one JSON
line per size from rank 0: {"size_bytes", "time_us", "busbw_gbps"}.
"""
import json
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    sizes = [int(s) for s in sys.argv[1].split(",")]
    iters, warmup = int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    for size in sizes:
        x = torch.zeros(size // 4, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(x)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        elapsed = (time.perf_counter() - start) / iters
        times = [torch.zeros(1, dtype=torch.float64) for _ in range(n)]
        dist.all_gather(times, torch.tensor([elapsed], dtype=torch.float64))
        t = sum(float(v) for v in times) / n  # averaged over ranks, as nccl-tests does
        if dist.get_rank() == 0:
            print(json.dumps({"size_bytes": size, "time_us": t * 1e6,
                              "busbw_gbps": size / t / 1e9 * 2 * (n - 1) / n}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
