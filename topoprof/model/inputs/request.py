"""What `topoprof model` is asked, as one typed request: the command's options turned once, at
its edge, into frozen dataclasses by concern, each checked when it is built. An error names the
option and shows the arithmetic (`world_size(8) != nodes(3) * gpus_per_node(3)`), exit 2.

  WorkloadRequest   what is trained: --params, --preset or --model; batch, tokens, images;
                    gradient bytes, DDP's bucket cap, FSDP2's MixedPrecisionPolicy and unit
  ComputeRequest    how long a micro-batch takes: measured, calibrated, or a --gpu what-if
  MemoryRequest     what the GPU holds: its memory, the activations if known
  ClusterRequest    the links and the shape: a bench fit, a topology, or numbers; nodes, GPUs
  ModelRequest      the four, with K and whether to sweep

`topoprof.model.inputs.gather.gather` measures, traces and reads what a `ModelRequest` leaves
open, and `topoprof.model.inputs.resolve.resolve` turns the two into the model's inputs. Nothing
here imports torch.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from topoprof.errors import InputError
from topoprof.model.compute.datasheet import NamedGpu, known_gpus, named_gpu
from topoprof.model.compute.profile import load_profile
from topoprof.model.compute.profile_choice import check_pricable
from topoprof.workload.checkpointing import parse_checkpointing
from topoprof.workload.layout import Layout
from topoprof.workload.presets import (
    LLAMA_PRESETS,
    PRESETS,
    RMSNORMS,
    VISION_PRESETS,
    get_preset,
    is_vision,
    synthetic_layout,
)
from topoprof.workload.vision import check_image_size
from topoprof.zoo.hf_spec import HFModelError, check_installed, config_path, is_hf_spec, with_attn

_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMbBtT]?)\s*$")
_COUNT_UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
PRECISIONS = ("bf16", "fp16", "fp32")
# FSDP2's MixedPrecisionPolicy dtypes, by the bytes each element moves
FSDP_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def parse_count(text: str) -> int:
    """'124439808', '125M', '1.3B', '7B' -> parameters (decimal units, as model names use)."""
    match = _COUNT_RE.match(text)
    if not match:
        raise InputError(f"--params {text!r}: expected a number with optional K, M, B or T (e.g. 125M, 1.3B, 7B)")
    value = float(match.group(1)) * _COUNT_UNITS[match.group(2).lower()]
    if value < 1:
        raise InputError(f"--params {text!r} = {value:g}: must be >= 1")
    return int(round(value))


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """'0,1,2,3' -> (0, 1, 2, 3); None when not given."""
    if text is None:
        return None
    try:
        chosen = tuple(int(g) for g in text.split(",") if g.strip())
    except ValueError:
        chosen = ()
    if not chosen:
        raise InputError(f"--gpus {text!r}: expected a comma list of GPU indices, e.g. 0,1,2,3")
    return chosen


def check_image_options(preset: str | None, image_size: int | None, tokens: int | None) -> None:
    """--image-size only with a vision preset; --tokens not with one (its FLOPs count the
    micro-batch's images, --micro-batch-size of them)."""
    if is_vision(preset):
        if tokens is not None:
            raise InputError(f"--tokens: {preset.strip().lower()} is an image model: its FLOPs are per image, "
                             "--micro-batch-size images per micro-batch (at --image-size); leave --tokens out")
        if image_size is not None:
            check_image_size(image_size)
    elif image_size is not None:
        if preset:
            get_preset(preset, image_size)  # unknown name, or a text preset: refused by name
        raise InputError(f"--image-size applies to a vision preset ({', '.join(VISION_PRESETS)}), "
                         "not to --params or --model")


def check_gpu_name(gpu: NamedGpu | None) -> None:
    """A --gpu must be one the datasheet table knows: refused by name, with the list."""
    if gpu is None or gpu.row is not None:
        return
    why = gpu.why or f"GPU {gpu.name!r} is not in the datasheet table"
    raise InputError(f"--gpu: {why.split(' (known')[0]}; known: {', '.join(known_gpus())}")


def check_gpu_profile(path: str, gpu: NamedGpu | None, precision: str) -> None:
    """A --gpu-profile must load (`load_profile`: one line naming the file and what is wrong) and be
    able to price the what-if: in its precision, of the --gpu named or scalable to it."""
    check_pricable(load_profile(path), gpu, precision, f"--gpu-profile {path}")


def _positive(option: str, value: float | None, unit: str = "") -> None:
    if value is not None and not value > 0:
        raise InputError(f"{option} {value:g}: must be > 0{unit}")


def _with_hf_attn(user_model: str | None, hf_attn: str | None) -> str | None:
    """`--model hf:PATH` with `--hf-attn ATTN`: the spec that builds that attention
    (`topoprof.zoo.hf_spec`); --hf-attn without an hf: model is refused."""
    if hf_attn is None:
        return user_model
    if user_model is None or not is_hf_spec(user_model):
        raise InputError(f"--hf-attn {hf_attn}: applies to a Hugging Face --model hf:PATH")
    try:
        return with_attn(user_model, hf_attn)
    except HFModelError as err:
        raise InputError(str(err)) from None


@dataclass(frozen=True)
class WorkloadRequest:
    """What is trained. Exactly one of `params` (a count such as 1.3B: an even synthetic layout),
    `preset` (a real architecture's layout) or `user_model` (PATH.py:CALLABLE)."""

    params: str | None = None
    preset: str | None = None
    user_model: str | None = None
    image_size: int | None = None          # a vision preset's square side in pixels
    micro_batch_size: int = 1
    # False where --micro-batch-size was not given: a --model is then planned at the samples its
    # example batch holds (`user_record.planned_as_read`), the rest at 1
    micro_batch_stated: bool = True
    tokens: int | None = None              # per GPU per micro-batch (not for an image model)
    grad_bytes: int = 4
    bucket_cap_mb: float | None = None
    fsdp_param_dtype: str | None = None
    fsdp_reduce_dtype: str | None = None
    fsdp_unit: str | None = None
    time_here: bool = False                # --model timed on this machine even for a --gpu what-if
    activation_checkpointing: str | None = None  # none, full, layer:N, op (topoprof.workload.checkpointing)
    rmsnorm: str = "eager"                 # a Llama preset's RMSNorm: eager or fused (topoprof/zoo/llama.py)

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.params, self.preset, self.user_model)) != 1:
            raise InputError("give exactly one of --params N, --preset NAME or --model PATH.py:CALLABLE")
        if self.time_here and self.user_model is None:
            raise InputError("--time-here times your --model on this machine; "
                             "it does not apply to a preset or --params")
        if self.params is not None:
            parse_count(self.params)
        if self.preset is not None:
            if self.preset.strip().lower() not in PRESETS:
                raise InputError(f"--preset {self.preset!r}: unknown preset; valid names: {', '.join(sorted(PRESETS))}")
        if self.user_model is not None:
            check_spec(self.user_model)
        check_image_options(self.preset, self.image_size, self.tokens)
        self._check_rmsnorm()
        if self.grad_bytes not in (2, 4):
            raise InputError(f"--grad-bytes {self.grad_bytes}: "
                             "4 under autocast (fp32 parameters) or 2 (pure bf16/fp16)")
        if self.micro_batch_size < 1:
            raise InputError(f"--micro-batch-size {self.micro_batch_size}: must be >= 1")
        if self.tokens is not None and self.tokens < 1:
            raise InputError(f"--tokens {self.tokens}: must be >= 1")
        _positive("--bucket-cap-mb", self.bucket_cap_mb, " MB")
        for option, value in (("--fsdp-param-dtype", self.fsdp_param_dtype),
                              ("--fsdp-reduce-dtype", self.fsdp_reduce_dtype)):
            if value is not None and value not in FSDP_DTYPE_BYTES:
                raise InputError(f"{option} {value}: valid: {', '.join(FSDP_DTYPE_BYTES)}")
        if self.fsdp_unit is not None:
            unit = self.fsdp_unit.strip()
            if not unit or unit.strip(".") != unit:
                raise InputError(f"--fsdp-unit {self.fsdp_unit!r}: a module name such as model.layers")
            object.__setattr__(self, "fsdp_unit", unit)
        self.checkpointing  # noqa: B018 - parsed now: a bad mode is refused before anything runs

    def _check_rmsnorm(self) -> None:
        if self.rmsnorm not in RMSNORMS:
            raise InputError(f"--rmsnorm {self.rmsnorm!r}: one of {', '.join(RMSNORMS)}")
        if self.rmsnorm != "eager" and self.preset_name not in LLAMA_PRESETS:
            raise InputError(f"--rmsnorm {self.rmsnorm}: applies to a Llama preset ({', '.join(LLAMA_PRESETS)}), "
                             f"not {self.what()}")

    @property
    def preset_sizes(self) -> dict | None:
        """The preset module's arguments this request changes (`topoprof/zoo/preset_modules.py:build`'s
        `sizes`): its RMSNorm; None where it is built as published."""
        return {"norm": self.rmsnorm} if self.rmsnorm != "eager" else None

    @property
    def checkpointing(self):
        return parse_checkpointing(self.activation_checkpointing)

    @property
    def param_count(self) -> int | None:
        return None if self.params is None else parse_count(self.params)

    @property
    def preset_name(self) -> str | None:
        return None if self.preset is None else self.preset.strip().lower()

    @property
    def layout(self) -> Layout | None:
        """The parameters of the preset named (at --image-size), or of the synthetic model of
        --params; None for a --model, whose worker reads them."""
        if self.preset is not None:
            return get_preset(self.preset, self.image_size)
        return None if self.params is None else synthetic_layout(parse_count(self.params))

    def what(self) -> str:
        """The model as an error message names it."""
        return self.preset_name or (f"--params {self.params}" if self.params else f"--model {self.user_model}")

    @property
    def fsdp_casts_weights(self) -> bool:
        """FSDP's param_dtype is 16-bit: the weights it computes with are cast (the memory passes'
        `cast` variant)."""
        return self.fsdp_param_bytes == 2

    @property
    def fsdp_param_bytes(self) -> int | None:
        """MixedPrecisionPolicy's param_dtype in bytes, as `Workload` takes it; None where not given."""
        return None if self.fsdp_param_dtype is None else FSDP_DTYPE_BYTES[self.fsdp_param_dtype]

    @property
    def fsdp_reduce_bytes(self) -> int | None:
        return None if self.fsdp_reduce_dtype is None else FSDP_DTYPE_BYTES[self.fsdp_reduce_dtype]


@dataclass(frozen=True)
class ComputeRequest:
    """How long a micro-batch takes: given (`micro_batch_time_s`, measured by the user), from a
    `validate` calibration file, timed on this machine's GPU, or for a `gpu` named here a what-if
    priced from the model's own ops (or its datasheet peak x `utilization`)."""

    gpu: str | None = None
    precision: str = "bf16"
    micro_batch_time_s: float | None = None
    backward_fraction: float | None = None
    calibration: str | None = None         # a `validate --save-calibration` or `validate --json` file
    utilization: float | None = None
    compiled: bool = False
    optimizer: str = "adamw"
    optimizer_time_s: float | None = None
    gpu_profile: str | None = None         # a device profile file (`topoprof profile`) to price the what-if with
    # `gpu` with its datasheet row, looked up once here: what gathers and prices for it takes this
    named: NamedGpu | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "named", named_gpu(self.gpu))
        if self.precision not in PRECISIONS:
            raise InputError(f"--precision {self.precision}: valid: {', '.join(PRECISIONS)}")
        if self.gpu_profile is not None:
            check_gpu_profile(self.gpu_profile, self.named, self.precision)
        _positive("--micro-batch-time", self.micro_batch_time_s, " seconds")
        if self.backward_fraction is not None and not 0 < self.backward_fraction < 1:
            raise InputError(f"--backward-fraction {self.backward_fraction:g}: the share of a micro-batch in "
                             "backward, between 0 and 1")
        if self.utilization is not None and not 0 < self.utilization <= 1:
            raise InputError(f"--utilization {self.utilization:g}: a share of peak FLOP/s, in (0, 1]")
        if self.optimizer_time_s is not None and self.optimizer_time_s < 0:
            raise InputError(f"--optimizer-time {self.optimizer_time_s:g}: must be >= 0 seconds")

    @property
    def given(self) -> bool:
        """The compute is given or calibrated: nothing here measures or prices it."""
        return self.micro_batch_time_s is not None or bool(self.calibration)


@dataclass(frozen=True)
class MemoryRequest:
    gpu_memory_gb: float | None = None     # the GPU's memory (default: the --gpu datasheet's, or the timed GPU's)
    activation_memory_gb: float | None = None

    def __post_init__(self) -> None:
        _positive("--gpu-memory", self.gpu_memory_gb, " GB")
        if self.activation_memory_gb is not None and self.activation_memory_gb < 0:
            raise InputError(f"--activation-memory {self.activation_memory_gb:g}: must be >= 0 GB")


@dataclass(frozen=True)
class ClusterRequest:
    """The links and the job's shape. Links from the first source given: a `bench` fit, explicit
    numbers (`link_bandwidth_gbps`), a `topology` file, or this machine's topology; one GPU, or
    one GPU per node, needs no intra-node link."""

    bench: str | None = None
    topology: str | None = None
    gpus: tuple[int, ...] | None = None    # the job's GPUs within the topology
    link_bandwidth_gbps: float | None = None
    link_latency_us: float | None = None
    world_size: int | None = None
    nodes: int = 1
    gpus_per_node: int | None = None
    network_bandwidth_gbps: float | None = None
    network_latency_us: float | None = None
    # GPUs per node from --gpus-per-node, or --world-size over --nodes (checked against each
    # other here); None when neither is given
    gpus_per_node_given: int | None = field(init=False, compare=False)
    # one GPU per node, or one --gpus index without a --topology to check it in: no intra-node
    # link to read (gather) nor to build (the link choice)
    needs_no_link: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise InputError(f"--nodes {self.nodes}: must be >= 1")
        for option, value in (("--world-size", self.world_size), ("--gpus-per-node", self.gpus_per_node)):
            if value is not None and value < 1:
                raise InputError(f"{option} {value}: must be >= 1")
        _positive("--link-bandwidth", self.link_bandwidth_gbps, " GB/s")
        _positive("--network-bandwidth", self.network_bandwidth_gbps, " GB/s")
        for option, latency in (("--link-latency", self.link_latency_us),
                                ("--network-latency", self.network_latency_us)):
            if latency is not None and latency < 0:
                raise InputError(f"{option} {latency:g}: must be >= 0 microseconds")
        object.__setattr__(self, "gpus_per_node_given", self._gpus_per_node_given())
        one_index = self.gpus is not None and len(self.gpus) == 1
        object.__setattr__(self, "needs_no_link", (self.gpus_per_node_given == 1 and not self.gpus)
                           or (one_index and not self.topology))

    def _gpus_per_node_given(self) -> int | None:
        if self.gpus_per_node:
            if self.world_size is not None and self.world_size != self.nodes * self.gpus_per_node:
                raise InputError(f"world_size({self.world_size}) != nodes({self.nodes}) * "
                                 f"gpus_per_node({self.gpus_per_node})")
            return self.gpus_per_node
        if self.world_size is None:
            return None
        gpn, rest = divmod(self.world_size, self.nodes)
        if rest or gpn < 1:
            raise InputError(f"world_size({self.world_size}) != nodes({self.nodes}) * gpus_per_node(an integer)")
        return gpn

    @property
    def link_options_given(self) -> list[str]:
        """The intra-node link options given, as the user typed them."""
        return [flag for value, flag in ((self.link_bandwidth_gbps, "--link-bandwidth"),
                                         (self.link_latency_us, "--link-latency"), (self.topology, "--topology"))
                if value is not None]


@dataclass(frozen=True)
class ModelRequest:
    workload: WorkloadRequest
    compute: ComputeRequest = field(default_factory=ComputeRequest)
    cluster: ClusterRequest = field(default_factory=ClusterRequest)
    memory: MemoryRequest = field(default_factory=MemoryRequest)
    accum: int = 1                         # K, micro-batches per optimizer step
    sweep: bool = True

    def __post_init__(self) -> None:
        if self.accum < 1:
            raise InputError(f"--accum {self.accum}: accumulation steps K must be >= 1 "
                             "(K micro-batches per optimizer step)")
        self._check_tokens_for_a_what_if()
        check_gpu_name(self.compute.named)

    def _check_tokens_for_a_what_if(self) -> None:
        """A text model's --gpu what-if prices its tokens: without --tokens (or a compute measured
        or calibrated) it has nothing to price, so say which option is missing."""
        w, c = self.workload, self.compute
        if ((c.gpu is None and c.gpu_profile is None) or w.tokens is not None or c.given or w.user_model
                or is_vision(w.preset)):
            return
        raise InputError(f"--tokens: a {'--gpu' if c.gpu else '--gpu-profile'} what-if of {w.what()} needs the tokens "
                         f"per GPU per micro-batch (e.g. "
                         f"--tokens 1024 for one sequence of 1024), or give --micro-batch-time SECONDS (measured)")

    @classmethod
    def from_options(cls, opts: dict) -> ModelRequest:
        """The request from `topoprof model`'s options (click's names): the command's one edge."""
        return cls(
            workload=WorkloadRequest(
                params=opts["params"], preset=opts["preset"],
                user_model=_with_hf_attn(opts["user_model"], opts.get("hf_attn")),
                image_size=opts["image_size"], micro_batch_size=opts["micro_batch_size"] or 1,
                micro_batch_stated=opts["micro_batch_size"] is not None, tokens=opts["tokens"],
                grad_bytes=int(opts["grad_bytes"]), bucket_cap_mb=opts["bucket_cap_mb"],
                fsdp_param_dtype=opts["fsdp_param_dtype"], fsdp_reduce_dtype=opts["fsdp_reduce_dtype"],
                fsdp_unit=opts["fsdp_unit"], time_here=bool(opts.get("time_here")),
                rmsnorm=opts.get("rmsnorm") or "eager",
                activation_checkpointing=opts.get("activation_checkpointing")),
            compute=ComputeRequest(
                gpu=opts["gpu"], precision=opts["precision"], micro_batch_time_s=opts["micro_batch_time"],
                backward_fraction=opts["backward_fraction"], calibration=opts["calibration"],
                utilization=opts["utilization"], compiled=bool(opts["compiled"]), optimizer=opts["optimizer"],
                optimizer_time_s=opts["optimizer_time"], gpu_profile=opts.get("gpu_profile")),
            cluster=ClusterRequest(
                bench=opts["bench"], topology=opts["topology"], gpus=parse_gpus(opts["gpus"]),
                link_bandwidth_gbps=opts["link_bandwidth"], link_latency_us=opts["link_latency"],
                world_size=opts["world_size"], nodes=opts["nodes"], gpus_per_node=opts["gpus_per_node"],
                network_bandwidth_gbps=opts["network_bandwidth"], network_latency_us=opts["network_latency"]),
            memory=MemoryRequest(gpu_memory_gb=opts["gpu_memory"], activation_memory_gb=opts["activation_memory"]),
            accum=opts["accum"], sweep=opts["sweep"])


def check_spec(spec: str) -> str:
    """`PATH.py:CALLABLE`, `package.module:CALLABLE` or `hf:PATH[#ATTN]`; a path must exist (and
    an `hf:` config name its architecture, with transformers installed). One line otherwise."""
    if is_hf_spec(spec):
        try:
            config_path(spec)
            check_installed()
        except HFModelError as err:
            raise InputError(f"--model {spec}: {err}") from None
        return spec
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise InputError(f"--model {spec!r}: expected PATH.py:CALLABLE, package.module:CALLABLE "
                         "(e.g. train.py:build) or hf:PATH (a Hugging Face config.json or its folder)")
    if (target.endswith(".py") or os.sep in target) and not os.path.isfile(target):
        raise InputError(f"--model {spec!r}: no such file: {target}")
    return spec
