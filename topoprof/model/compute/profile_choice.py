"""Which device profile prices a what-if, and the pricer it makes (`profiled.ProfiledDevice`), or
the datasheet's (`roofline.gpu_device`) where no profile can be had; and the device a pass on
meta must be traced for to be priced so (`target_for`, `Pricing.target`). No torch here.

The profiles to choose from: one given (`model --gpu-profile FILE`, a scan's own), else those
shipped in topoprof/model/compute/profiles/ (shared/gpu-facts converted by `profile_facts`, and
any profile `topoprof profile` measured and committed there). The nearest to the GPU named, by
this rule, first match wins:
  1. a profile of that GPU (the same datasheet row), used as measured;
  2. of another GPU of the same compute capability (the same architecture and SM), scaled;
  3. of the same compute capability major (Ampere's 8.0 and Ada's 8.9 alike), scaled;
  4. of any other GPU, the nearest compute capability, scaled.
From step 3 on the kernels may differ (another architecture, or another chip of it) beyond what
the datasheet ratios say, and the output says so.
and among profiles of one step: one measured by `topoprof profile` before a conversion of
gpu-facts, a full one before a quick one, the newest first. A profile qualifies only in the
what-if's precision (its dtype) and where the datasheet has both GPUs' figures to scale by
(`profile_scale.datasheet_ratios`). Where none qualifies (a V100 or T4 in bf16: no bf16 to scale
by; fp16 or fp32 with only bf16 profiles) the datasheet path prices it, and the output says so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from topoprof.errors import InputError
from topoprof.model.compute.datasheet import SM_COUNT, NamedGpu
from topoprof.model.compute.host_costs import host_costs_from
from topoprof.model.compute.profile import DTYPE_OF_PRECISION, DeviceProfile, load_profile
from topoprof.model.compute.profile_scale import datasheet_ratios
from topoprof.model.compute.profiled import ProfiledDevice
from topoprof.model.compute.roofline import gpu_device
from topoprof.specs.traced_pass import TraceTarget

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
RULES = ("a profile of this GPU", "a profile of another GPU of the same compute capability",
         "a profile of the same compute capability major", "a profile of another architecture")


@lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[str, DeviceProfile], ...]:
    if not os.path.isdir(SHIPPED_DIR):
        return ()
    return tuple((os.path.join(SHIPPED_DIR, f), load_profile(os.path.join(SHIPPED_DIR, f)))
                 for f in sorted(os.listdir(SHIPPED_DIR)) if f.endswith(".json"))


def shipped_profiles() -> tuple[tuple[str, DeviceProfile], ...]:
    """(path, profile) of every profile shipped with topoprof."""
    return _shipped()


def _preference(profile: DeviceProfile) -> tuple:
    measured = profile.source.startswith("measured by `topoprof profile`")
    return (not measured, profile.quick, _negated(profile.machine.created_utc or ""))


def _negated(text: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in text)


@dataclass(frozen=True)
class Choice:
    profile: DeviceProfile
    path: str
    rule: int                          # index in RULES

    def text(self, target: str) -> str:
        return (f"chosen for {target} as {RULES[self.rule]} ({os.path.basename(self.path)}; rule: same GPU, then "
                "same compute capability, then same major, then the nearest other)")


def nearest_profile(gpu: NamedGpu, precision: str, candidates=None) -> Choice | None:
    """The profile that prices `gpu` at `precision` by the module's rule, or None."""
    target = gpu.row
    dtype = DTYPE_OF_PRECISION.get(precision)
    if target is None or target.compute_capability is None:
        return None
    ranked = []
    for path, profile in (shipped_profiles() if candidates is None else candidates):
        source = profile.gpu.row
        if profile.machine.kind != "cuda" or profile.dtype != dtype or source is None or not source.compute_capability:
            continue
        try:
            datasheet_ratios(profile, gpu)
        except InputError:
            continue
        same, cc = source.name == target.name, source.compute_capability
        rule = (0 if same else 1 if cc == target.compute_capability
                else 2 if cc[0] == target.compute_capability[0] else 3)
        distance = abs((cc[0] * 10 + cc[1]) - (target.compute_capability[0] * 10 + target.compute_capability[1]))
        ranked.append(((rule, distance, _preference(profile)), path, profile))
    if not ranked:
        return None
    (rule, _, _), path, profile = min(ranked, key=lambda r: r[0])
    return Choice(profile, path, rule)


def _profiled(profile: DeviceProfile, gpu: NamedGpu | None, precision: str, compiled: bool, choice: str,
              notes: tuple[str, ...] = ()) -> ProfiledDevice:
    """A pricer from `profile` for `gpu` (None: the profiled device itself)."""
    if profile.dtype != DTYPE_OF_PRECISION.get(precision, precision) and profile.machine.kind == "cuda":
        raise InputError(f"the device profile of {profile.machine.device} was measured in {profile.dtype}: it cannot "
                         f"price --precision {precision}")
    source, target = profile.gpu.row, gpu.row if gpu is not None else None
    same = gpu is None or profile.gpu.same_row(gpu)
    if profile.machine.kind != "cuda":
        if gpu is not None:
            raise InputError(f"the device profile of {profile.machine.device} is a CPU's: it cannot be scaled to GPU "
                             f"{gpu.name!r} (leave --gpu out to price the model on that CPU)")
        return ProfiledDevice(f"{profile.machine.device} ({profile.dtype}, {'compiled' if compiled else 'eager'}, "
                              "profile)", profile, host_costs_from(profile), False, choice, compiled=compiled,
                              notes=notes)
    ratios = None if same or gpu is None else datasheet_ratios(profile, gpu)
    profile_sms = profile.machine.sm_count or (SM_COUNT.get(source.name) if source else None)
    if same:
        target_sms, how = profile_sms, "profile"
    else:
        assert source is not None and target is not None  # datasheet_ratios found both
        target_sms, how = SM_COUNT.get(target.name), f"scaled from the {source.name} profile"
    where = (target.name if target else profile.machine.device)
    return ProfiledDevice(f"{where} ({precision}, {'compiled' if compiled else 'eager'}, {how})", profile,
                          host_costs_from(profile), True, choice, ratios, compiled, profile_sms, target_sms,
                          notes=notes)


def pricer_for(gpu: NamedGpu | None, precision: str, compiled: bool, profile: DeviceProfile | None = None,
               profile_path: str | None = None):
    """(pricer, notes): `profile` (given) as measured or scaled to `gpu`; else the nearest shipped
    profile; else the datasheet path, with a note saying so. InputError where a given profile
    cannot price it, or the GPU is unknown."""
    if profile is not None:
        source, target = profile.gpu.row, gpu.row if gpu is not None else None
        # as the shipped profiles' rule has it (RULES): another compute capability is another architecture
        other = source is not None and target is not None and source.compute_capability != target.compute_capability
        notes = (_another_architecture(profile.machine.device, target.name),) if other and target is not None else ()
        return _profiled(profile, gpu, precision, compiled, f"given ({profile_path or 'a profile'})", notes), \
            list(notes)
    spec = gpu.row if gpu is not None else None
    if gpu is None or spec is None:
        raise InputError(f"GPU {gpu.name if gpu is not None else None!r} is not in the datasheet table")
    choice = nearest_profile(gpu, precision)
    if choice is not None:
        notes = () if choice.rule < 2 else (_another_architecture(choice.profile.machine.device, spec.name),)
        return _profiled(choice.profile, gpu, precision, compiled, choice.text(spec.name), notes), list(notes)
    have = ", ".join(f"{p.machine.device} in {p.dtype}" for _, p in shipped_profiles()) or "none"
    note = (f"compute: no device profile can be scaled to {spec.name} in {precision} (profiles: {have}); priced on "
            "its datasheet peak and bandwidth with cited shares")
    return gpu_device(spec, precision, compiled), [note]


def gpu_target(precision: str, gpu: NamedGpu | None = None) -> TraceTarget:
    """A CUDA target at `precision`, with the compute capability of the GPU named where its
    datasheet gives one (its attention backend depends on it: `topoprof.trace.target_lens`)."""
    capability = gpu.capability if gpu is not None else None
    return TraceTarget("cuda", precision, capability=capability or None)


def target_for(precision: str, profile=None, gpu: NamedGpu | None = None) -> TraceTarget:
    """The device the pass stands for: a CPU where the profile is a CPU's, else a GPU at `precision`:
    the GPU named, else the profile's own."""
    if profile is not None and profile.machine.kind != "cuda":
        return TraceTarget("cpu", "fp32")
    return gpu_target(precision, gpu or (profile.gpu if profile is not None else None))


@dataclass(frozen=True)
class Pricing:
    """How a model's ops are priced at one precision for one GPU (`gpu`; None: the profile's own
    device), chosen once (`pricing_for`): the pricer and its notes, or why none can price them."""

    gpu: NamedGpu | None
    precision: str
    compiled: bool
    profile: DeviceProfile | None = None
    pricer: Any = None  # a ProfiledDevice, or the datasheet's DeviceModel
    notes: tuple[str, ...] = ()
    why: str | None = None  # an unknown GPU, a profile that cannot price it

    @property
    def target(self) -> TraceTarget:
        """The device a pass must be traced for to be priced so (`target_for`)."""
        return target_for(self.precision, self.profile, self.gpu)


def pricing_for(gpu: NamedGpu | None, precision: str, compiled: bool, profile: DeviceProfile | None = None,
                profile_path: str | None = None) -> Pricing:
    """`pricer_for`'s choice as a record; its InputError kept as `why`, for each pass priced to say."""
    try:
        pricer, notes = pricer_for(gpu, precision, compiled, profile, profile_path)
    except InputError as err:
        return Pricing(gpu, precision, compiled, profile, why=str(err))
    return Pricing(gpu, precision, compiled, profile, pricer, tuple(notes))


def _another_architecture(profiled: str, gpu: str) -> str:
    return (f"{profiled} is another architecture than {gpu}: its kernels differ beyond the datasheet ratios "
            "the range spans")


def check_pricable(profile: DeviceProfile, gpu: NamedGpu | None, precision: str, where: str) -> None:
    """InputError naming `where` (the option) when `profile` cannot price `gpu` at `precision`."""
    try:
        _profiled(profile, gpu, precision, False, where)
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
