"""What `topoprof model` gathered before it predicts, as typed records (`Evidence`, filled by
`gather.gather`): what was measured or traced here, the files read, the links' source. Also the
choices both stages make alike from the request and these records (`what_if_priced`). Pure:
nothing here runs, reads or imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topoprof.model.compute.datasheet import NamedGpu
from topoprof.model.compute.measured import MeasuredCompute
from topoprof.model.compute.profile import DeviceProfile
from topoprof.model.compute.profile_choice import Pricing
from topoprof.model.inputs.candidates import ModelShape, UserShape
from topoprof.model.inputs.request import ComputeRequest, ModelRequest
from topoprof.model.inputs.sampled import SampledPasses
from topoprof.model.inputs.user_record import ReadyOrder, UserModelRead
from topoprof.model.memory.traced import TracedMemory
from topoprof.specs.messages import TraceFailure, UserModelRecord
from topoprof.specs.traced_pass import TracedPass


@dataclass(frozen=True)
class UserModelRun:
    """The user's model as its worker read it: timed here (`record.passes`) or traced on meta
    only, the gradient-ready order that fits the device predicted, whether a timing here is
    the compute of the GPU predicted (`timed_on`: no --gpu named, or the GPU it ran on; never
    another device's), and the record read for the model's inputs at the micro-batch planned
    (`read_user_model`)."""

    record: UserModelRecord
    order: ReadyOrder
    timing_stands: bool
    read: UserModelRead

    @property
    def timed(self) -> bool:
        return self.record.timed


@dataclass(frozen=True)
class MainTrace:
    """A preset's or `--params` model's pass on meta for the GPU predicted (`trace`), or why none
    could be run (`why`: a text model without --tokens, a GPU the datasheet does not know)."""

    trace: TracedPass | TraceFailure | None = None
    note: str | None = None  # how the stated shape was fitted to the model
    why: str | None = None


@dataclass(frozen=True)
class LinkEvidence:
    """What the links are read from: a bench's all-reduce fit, or a topology (a file's or this
    machine's); neither where the request gives the links or needs none."""

    bench_fit: tuple[float, float, int, dict] | None = None
    topology: Any = None
    read_here: bool = False  # the topology is this machine's, read now


@dataclass(frozen=True)
class Evidence:
    """Everything `resolve.resolve` predicts from (module docstring)."""

    request: ModelRequest
    compute: ComputeRequest  # the request's, its --gpu named from a --gpu-profile's device where not given
    # how the model's own ops are priced, chosen once: for the GPU predicted, or the GPU a user's
    # model was timed on (`gather._timed_gpu_priced`)
    pricing: Pricing
    profile: DeviceProfile | None = None
    calibration: dict | None = None
    user: UserModelRun | None = None
    preset_timed: MeasuredCompute | None = None  # a preset timed at its real size on this machine's GPU
    main_trace: MainTrace | None = None
    traced_memory: TracedMemory | str | None = None  # str: why those passes failed
    # what the memory's and the candidates' passes trace (`candidates.traced_shape`): a user's model
    # with its alike blocks, where its passes were cut to them; or why a model is not traced so
    shape: ModelShape | UserShape | str | None = None
    links: LinkEvidence = LinkEvidence()
    # the GPU predicted, with its datasheet row: named (--gpu, or a --gpu-profile's device), else
    # the one a preset was timed on
    gpu: NamedGpu | None = None
    # the memory's passes at 2 and 3 samples, which the search's candidates extend (`sampled`)
    sampled: SampledPasses | None = None


def what_if_priced(compute: ComputeRequest) -> bool:
    """A user's model is priced from its own ops as the compute of the GPU predicted: a GPU is
    named or profiled, and neither the compute nor a utilization is given (unless it was timed on
    that GPU: `UserModelRun.timing_stands`)."""
    return ((compute.gpu is not None or compute.gpu_profile is not None) and not compute.given
            and compute.utilization is None)
