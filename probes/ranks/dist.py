"""torch.distributed set-up for rank workers: the one place that creates process groups.

Each rank finds its place from the environment torchrun (or topoprof's launcher) sets: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; under srun, from SLURM's own variables (the
runner fills MASTER_ADDR/MASTER_PORT from the step's node list and reserved ports).
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str          # "cuda:N" for NCCL, "cpu" for gloo


def rank_env_from_environ(backend: str) -> RankEnv:
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    # a step may run fewer tasks than the job has (srun -n2 in a 4-task job): the step's count
    world = int(env.get("WORLD_SIZE", env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1"))))
    local = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
    device = "cpu"
    if backend == "nccl":
        import torch  # lazy: torch; the CLI imports this module and runs without torch

        # srun may give each task only its own GPU (CUDA_VISIBLE_DEVICES of one): index modulo.
        device = f"cuda:{local % max(1, torch.cuda.device_count())}"
    return RankEnv(rank, world, local, backend, device)


def init(backend: str, timeout_s: float) -> RankEnv:
    """Join the process group; collectives that wait longer than timeout_s fail instead of hanging."""
    import torch  # lazy: torch; the CLI imports this module and runs without torch
    import torch.distributed as dist  # lazy: torch; the CLI imports this module and runs without torch

    info = rank_env_from_environ(backend)
    if backend == "nccl":
        torch.cuda.set_device(torch.device(info.device))
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = torch.device(info.device)  # eager NCCL init, bound to this GPU
        dist.init_process_group(
            backend=backend, init_method="env://", rank=info.rank, world_size=info.world_size,
            timeout=datetime.timedelta(seconds=timeout_s), **kwargs,
        )
    return info


def synchronize(device: str) -> None:
    """Wait for all queued device work (CUDA); CPU (gloo) collectives are already synchronous."""
    if device.startswith("cuda"):
        import torch  # lazy: torch; the CLI imports this module and runs without torch

        torch.cuda.synchronize(device)


def synchronize_compute(device: str) -> None:
    """Wait for the work queued on the device's current stream only (CUDA): the compute, not a
    collective that NCCL runs on its own stream beside it (`torch.cuda.synchronize` waits for
    every stream). CPU compute is already done when the call returns."""
    if device.startswith("cuda"):
        import torch  # lazy: torch; the CLI imports this module and runs without torch

        torch.cuda.current_stream(device).synchronize()


def finish() -> None:
    import torch.distributed as dist  # lazy: torch; the CLI imports this module and runs without torch

    if dist.is_initialized():
        dist.destroy_process_group()
