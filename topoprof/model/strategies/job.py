"""One training job as the model takes it: what is trained (`Workload`), on which cluster
(`Cluster`: the comm model, nodes, GPUs per node, backend), with what compute, and K.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from topoprof.errors import InputError
from topoprof.model.comm.collectives import CommModel, HierarchicalComm
from topoprof.model.compute.timing import Compute
from topoprof.model.ddp.buckets import ddp_bucket_limits
from topoprof.model.fsdp.plan import FsdpPlan, fsdp_plan
from topoprof.model.memory.traced import TracedMemory
from topoprof.specs.messages import StepMemory
from topoprof.workload.checkpointing import Checkpointing
from topoprof.workload.layout import Layout
from topoprof.workload.presets import get_preset, synthetic_layout

# Backends whose collectives block the calling thread and whose reduce-scatter is an all-reduce
# (topoprof.model.fsdp): gloo. NCCL's run on streams beside the compute.
BLOCKING_BACKENDS = ("gloo",)

BACKENDS = ("nccl", "gloo")


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise InputError(message)


@dataclass(frozen=True)
class Workload:
    """What is trained: parameter layout, dtypes, batch, DDP bucket options."""

    layout: Layout
    grad_bytes: int = 4  # 4 under torch.autocast (fp32 params), 2 for pure bf16/fp16
    param_bytes: int = 4  # what DataParallel's replicate broadcasts per parameter
    micro_batch_size: int = 1  # samples per GPU per micro-batch
    micro_batch_source: str = "given"  # where it comes from, as the JSON's inputs say
    # per GPU; for the FLOPs estimate. An image model's (layout.unit "image") is its micro_batch_size.
    tokens_per_micro_batch: int | None = None
    bucket_cap_mb: float | None = None  # None = torch default (25 MiB, first bucket 1 MiB)
    gradient_as_bucket_view: bool = False
    dp_output_bytes: int = 0  # per GPU, gathered to GPU 0 by DataParallel (0 = a small loss)
    activation_memory_gb: float | None = None  # per GPU per micro-batch, when the user knows it
    # One GPU's memory by phase over a timed step of this model (probes/ranks/model_timing.py), if any
    measured_memory: StepMemory | None = None
    # FSDP's MixedPrecisionPolicy: bytes per all-gathered parameter (param_dtype; None: the
    # parameters' own, param_bytes) and per reduced gradient (reduce_dtype; None: param_dtype's,
    # as torch reduces in the compute dtype then, _fsdp_api.py MixedPrecisionPolicy)
    fsdp_param_bytes: int | None = None
    fsdp_reduce_bytes: int | None = None
    fsdp_unit: str | None = None  # the module whose children are FSDP's groups (None: by block name)
    # activation checkpointing of the repeated blocks (torchtitan's modes), and what a micro-batch
    # holds under each mode, counted from passes of the model on meta (None: not traced so)
    checkpointing: Checkpointing = Checkpointing()
    traced_memory: TracedMemory | None = None
    traced_memory_failure: str | None = None  # why those passes could not be had, where they were tried

    def __post_init__(self) -> None:
        _need(self.grad_bytes in (2, 4), f"grad_bytes must be 2 or 4, got {self.grad_bytes}")
        _need(self.param_bytes in (2, 4), f"param_bytes must be 2 or 4, got {self.param_bytes}")
        _need(self.micro_batch_size >= 1,
              f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        _need(self.tokens_per_micro_batch is None or self.tokens_per_micro_batch >= 1,
              f"tokens_per_micro_batch must be >= 1, got {self.tokens_per_micro_batch}")
        _need(self.dp_output_bytes >= 0,
              f"dp_output_bytes must be >= 0, got {self.dp_output_bytes}")
        _need(self.activation_memory_gb is None or self.activation_memory_gb >= 0,
              f"activation memory must be >= 0 GB, got {self.activation_memory_gb}")
        if self.layout.unit == "image":  # FLOPs per image: a micro-batch is micro_batch_size images
            _need(self.tokens_per_micro_batch in (None, self.micro_batch_size),
                  f"tokens_per_micro_batch({self.tokens_per_micro_batch}) of an image model is its "
                  f"micro_batch_size({self.micro_batch_size}) images")
            object.__setattr__(self, "tokens_per_micro_batch", self.micro_batch_size)
        ddp_bucket_limits(self.bucket_cap_mb)  # validates
        _need(isinstance(self.checkpointing, Checkpointing),
              f"checkpointing must be a Checkpointing (parse_checkpointing), got {self.checkpointing!r}")
        for name in ("fsdp_param_bytes", "fsdp_reduce_bytes"):
            value = getattr(self, name)
            _need(value is None or value in (2, 4), f"{name} must be 2 or 4, got {value}")

    # read by the memory count, the FSDP timelines and the echo of every prediction of the job
    @cached_property
    def fsdp(self) -> FsdpPlan | str:
        """FSDP2's groups of this layout (`fsdp.plan.fsdp_plan`: by block, or each child of
        `fsdp_unit`), or why it has none."""
        try:
            return fsdp_plan(self.layout, self.fsdp_unit)
        except InputError as err:
            return str(err)

    @property
    def largest_fsdp_group_params(self) -> int:
        """The largest FSDP group's parameters; the whole model where it has no groups."""
        return self.fsdp.largest_group_params if isinstance(self.fsdp, FsdpPlan) else self.layout.params

    @property
    def fsdp_bytes(self) -> tuple[int, int]:
        """(all-gather, reduce-scatter) bytes per element under FSDP's MixedPrecisionPolicy."""
        param = self.fsdp_param_bytes or self.param_bytes
        return param, self.fsdp_reduce_bytes or param

    @classmethod
    def from_preset(cls, name: str, image_size: int | None = None, **kwargs: Any) -> Workload:
        """A preset's workload; `image_size` for a vision preset only (`presets.get_preset`)."""
        return cls(get_preset(name, image_size), **kwargs)

    @classmethod
    def from_params(cls, params: int, **kwargs: Any) -> Workload:
        return cls(synthetic_layout(params), **kwargs)


@dataclass(frozen=True)
class Cluster:
    comm: CommModel
    nodes: int = 1
    gpus_per_node: int = 1
    world_size: int | None = None  # optional; checked against nodes * gpus_per_node
    backend: str = "nccl"  # what runs the collectives: gloo blocks (topoprof.model.fsdp)

    def __post_init__(self) -> None:
        _need(self.backend in BACKENDS, f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        _need(self.nodes >= 1 and self.gpus_per_node >= 1, f"nodes({self.nodes}) and "
              f"gpus_per_node({self.gpus_per_node}) must be >= 1")
        n = self.nodes * self.gpus_per_node
        _need(self.world_size is None or self.world_size == n, f"world_size({self.world_size}) "
              f"!= nodes({self.nodes}) * gpus_per_node({self.gpus_per_node})")
        _need(self.comm.world_size == n, f"comm model world_size({self.comm.world_size}) != "
              f"nodes({self.nodes}) * gpus_per_node({self.gpus_per_node})")
        if isinstance(self.comm, HierarchicalComm):
            _need(self.comm.nodes == self.nodes,
                  f"comm model nodes({self.comm.nodes}) != nodes({self.nodes})")
        object.__setattr__(self, "world_size", n)

    @property
    def gpus(self) -> int:
        """The world size, nodes x gpus_per_node (`world_size` once constructed)."""
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ModelInputs:
    workload: Workload
    compute: Compute
    cluster: Cluster
    accumulation_steps: int = 1

    def __post_init__(self) -> None:
        _need(isinstance(self.accumulation_steps, int) and self.accumulation_steps >= 1,
              f"accumulation_steps must be an integer >= 1, got {self.accumulation_steps}")
