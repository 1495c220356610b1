"""What a scan is asked to do, checked before anything runs, and the sweeps it chooses."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topoprof.errors import InputError
from topoprof.measure.launch import multi_node
from topoprof.model.inputs.request import check_image_options, check_spec, parse_count
from topoprof.model.inputs.user_record import trained_micro_batch, user_layout
from topoprof.model.validate.run import ValidateOptions, cpu_threads_per_rank
from topoprof.specs.messages import CollectivesJob, UserModelRecord
from topoprof.workload.checkpointing import parse_checkpointing
from topoprof.workload.presets import PRESETS
from topoprof.workload.synthetic import spec_for_params


@dataclass(frozen=True)
class ScanOptions:
    backend: str
    nproc: int
    note: str
    quick: bool = False
    validate: bool = True
    params: str | None = None
    preset: str | None = None
    image_size: int | None = None  # a vision preset's image side (pixels); default 224
    micro_batch_time_s: float | None = None
    tokens: int | None = None
    micro_batch_size: int = 1
    micro_batch_stated: bool = False  # --micro-batch-size given (a --model is read at its example batch)
    accum: int = 8
    timeout_s: float = 120.0
    user_model: str | None = None  # --model PATH.py:CALLABLE
    activation_checkpointing: str | None = None  # none, full, layer:N, op (a preset's or --params' blocks)
    # what `probes/ranks/model_timing.py` measured of it (set by the scan before its ranks start)
    user_record: UserModelRecord | None = field(default=None, repr=False, compare=False)
    # this GPU's quick device profile (`topoprof profile --quick`), measured by the scan, which its
    # what-if compute is priced with (None: the profiles shipped with topoprof)
    device_profile: dict | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if sum(bool(x) for x in (self.params, self.preset, self.user_model)) > 1:
            raise InputError("give at most one of --params, --preset or --model")
        if self.user_model:
            check_spec(self.user_model)
            if self.micro_batch_stated:
                raise InputError("--micro-batch-size: a scan trains your --model on the example batch its callable "
                                 "returns, at the samples it holds; build that batch at the micro-batch you want")
        if self.accum < 1:
            raise InputError(f"--accum {self.accum}: accumulation steps K must be >= 1")
        # Bad input is refused before anything runs; a model that fails later is a report note.
        if self.params:
            parse_count(self.params)
        if self.preset:
            if self.preset.strip().lower() not in PRESETS:
                raise InputError(f"--preset {self.preset!r}: valid names: {', '.join(sorted(PRESETS))}")

        check_image_options(self.preset, self.image_size, self.tokens)
        if self.user_model and self.checkpointing.mode != "none":
            raise InputError(f"--activation-checkpointing {self.activation_checkpointing}: applies to a --preset or "
                             "--params; your --model checkpoints as its own code does (torch.utils.checkpoint)")

    @property
    def checkpointing(self):
        return parse_checkpointing(self.activation_checkpointing)


def bench_job(opts: ScanOptions) -> CollectivesJob:
    """A quick sweep: enough sizes for the fit and the plateau, little time. Across nodes, three
    levels: each node alone, the network alone (one rank per node), and the whole job."""
    gpu = opts.backend == "nccl"
    if opts.quick:
        sizes, collectives = [4096 * 4 ** i for i in range(7)], ["all_reduce"]       # 4 KiB..16 MiB
    elif gpu:
        sizes, collectives = [8 * 4 ** i for i in range(14)] + [1 << 30], ["all_reduce", "all_gather", "reduce_scatter"]
    else:
        sizes, collectives = [1024 * 2 ** i for i in range(15)], ["all_reduce"]     # 1 KiB..16 MiB
    return CollectivesJob(collectives, sizes, iters=5 if opts.quick else 10, warmup=2, dtype="float32",
                          combine="avg", check=True,
                          levels=["intra", "inter", "job"] if multi_node() else ["job"])


# Timed rotations of the validation (each: a calibration, every DDP mode, the interference
# samples). The prediction is checked on medians over them: enough that one slow spell of a
# shared machine moves a median little, few enough for the scan's time budget.
ROTATIONS, QUICK_ROTATIONS = 8, 6


def validate_options(opts: ScanOptions):
    gpu = opts.backend == "nccl"
    spec = spec_for_params(25_000_000 if gpu else 1_000_000, seq_len=256 if gpu else 64)
    user: dict[str, Any] = {}
    if opts.user_record is not None:  # the user's own model is trained instead

        layout = user_layout(opts.user_record)
        user = dict(user_model=opts.user_model, user_layout=layout, label=layout.name,
                    micro_batch=trained_micro_batch(opts.user_record))
    return ValidateOptions(**{"label": f"synthetic {spec.params / 1e6:.1f}M", "micro_batch": 8 if gpu else 4, **user},
                           backend=opts.backend, nproc=opts.nproc, spec=spec, accum=4,
                           steps=QUICK_ROTATIONS if opts.quick else ROTATIONS,
                           warmup_steps=1 if opts.quick else 2, numerics=not opts.quick,
                           threads=None if gpu else cpu_threads_per_rank(opts.nproc), timeout_s=opts.timeout_s)


