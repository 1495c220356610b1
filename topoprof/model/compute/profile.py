"""A device profile: what one GPU (or CPU) really does with eager PyTorch training work, as
`topoprof profile` measures it (`probes/device_profile/profile_worker.py`), in a versioned JSON format, and the rates
read from it for any shape.

Sections (JSON keys; units in the names):
- machine: device, SMs, memory, driver, CUDA, torch, Python, host CPU, when;
- host_costs: seconds per op from Python by kind (`HOST_KINDS`), each with how it was measured;
  where a kind was not measured but could be bounded from what was (shared/gpu-facts' calls of
  several ops, `profile_facts`), its range (`ranges`: [low, high]) with how it was derived;
- gemm: achieved FLOP/s of `a @ b` (a: m x k, b: k x n) at points of a grid, by dtype;
- memory: bytes read + written per second of memory-bound kinds (`MEMORY_KINDS`) by size;
- sdpa: scaled_dot_product_attention forward + backward FLOP/s by sequence, head dim, causal;
- optimizer: fused AdamW's bytes per second over its per-parameter traffic;
- cpu (a CPU only): the cost of writing fresh pages (`probes/device_profile/device_costs.py`);
- conventions (how each figure is counted), skipped (points not measured, with why), notes.

The lookups return the value and a short basis (`Read`): measured, interpolated (log scale) or
clamped at the edge of what was measured (`topoprof.model.compute.profile_interp`). Another GPU is priced
from a profile by `topoprof.model.compute.profile_scale`. No torch here.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

from topoprof import __version__
from topoprof.errors import InputError
from topoprof.jsonio import load_json, to_jsonable
from topoprof.model.compute.datasheet import NamedGpu, named_gpu
from topoprof.model.compute.profile_interp import Grid, Read
from topoprof.model.compute.profile_reader import Reader
from topoprof.model.compute.profile_records import (
    FreshPages,
    GemmPoint,
    Machine,
    MemoryPoint,
    OptimizerRate,
    SdpaPoint,
    Skipped,
)
from topoprof.specs.profile_schema import OLDEST_SCHEMA_VERSION, PROFILE_KIND, PROFILE_SCHEMA_VERSION

SECTIONS = ("machine", "host_costs", "gemm", "memory", "sdpa", "optimizer")

HOST_KINDS = {
    "op": "a plain op (no autograd) on a tiny tensor",
    "autograd_forward": "an op recorded by autograd (forward)",
    "autograd_backward_node": "one node of the autograd engine's backward",
    "autocast_op": "a matmul under autocast, its input's cast included (2 kernels)",
    "selective_checkpoint_op": "an op recorded by autograd under selective op checkpointing's forward and recompute "
                               "modes (per op, the two together)",
    "optimizer_per_tensor": "the optimizer step's host cost per parameter tensor",
    "conv_forward": "a tiny convolution's forward (a CPU's convolution library per call)",
    "conv_backward": "a tiny convolution's backward node",
}
MEMORY_KINDS = ("copy", "add", "gelu", "layer_norm", "rms_norm", "softmax", "upcast")
# A memory-bound kind that was not measured reads as the measured kind nearest in what it does;
# anything else as a generic elementwise op (GENERIC_KIND: two inputs read, one output written).
NEAREST_KIND = {
    "mul": "add", "sub": "add", "div": "add", "where": "add",
    "clone": "copy", "cat": "copy", "contiguous": "copy", "embedding": "copy",
    "silu": "gelu", "relu": "gelu", "tanh": "gelu", "sigmoid": "gelu", "dropout": "gelu",
    "group_norm": "layer_norm", "batch_norm": "layer_norm", "log_softmax": "softmax",
    "downcast": "upcast", "cast": "upcast",
}
GENERIC_KIND = "add"
# Tensor cores run a GEMM best when every dimension is a multiple of 16 bytes (8 bf16/fp16
# elements); otherwise cuBLAS (11.0 and later) still uses them, at a lower rate (NVIDIA, "Matrix
# Multiplication Background User's Guide", §2.2 "Tensor Core Requirements"). shared/gpu-facts
# shows it: 4096x50257x768 in bf16 at 126 TFLOP/s beside 610-810 for aligned shapes of that size.
ALIGN_BYTES = 16
ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
# the model's --precision and the dtype a profile was measured in
DTYPE_OF_PRECISION = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PRECISION_OF_DTYPE = {dtype: precision for precision, dtype in DTYPE_OF_PRECISION.items()}


@dataclass(frozen=True)
class DeviceProfile:
    source: str                       # who made it: measured by `topoprof profile`, or converted from what
    citation: str                     # how to cite its figures
    machine: Machine
    dtype: str                        # the training dtype: GEMM, memory and attention points are at it
    host_seconds_per_op: dict[str, float]
    host_how: dict[str, str]
    gemm: tuple[GemmPoint, ...]
    memory: tuple[MemoryPoint, ...]
    sdpa: tuple[SdpaPoint, ...]
    optimizer: OptimizerRate | None
    conventions: dict[str, str]
    quick: bool = False
    cpu: FreshPages | None = None
    skipped: tuple[Skipped, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float | None = None      # how long measuring it took
    section_seconds: dict[str, float] = field(default_factory=dict)
    schema_version: int = PROFILE_SCHEMA_VERSION
    # kinds not measured, bounded from what was (low, high) seconds; `host_how` says how
    host_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    @cached_property
    def gpu(self) -> NamedGpu:
        """Its device as the datasheet knows it (no row for a CPU or an unknown GPU), looked up once
        per profile."""
        named = named_gpu(self.machine.device)
        return named if named is not None else NamedGpu(self.machine.device, None)

    # ---- lookups ------------------------------------------------------------------------------

    def gemm_flops_per_s(self, m: int, n: int, k: int, dtype: str | None = None) -> Read:
        """FLOP/s of an m x k by k x n product, from the points of its dtype and of its alignment
        (every dimension a multiple of 16 bytes, or not: the two run at different rates)."""
        dtype = dtype or self.dtype
        aligned = _aligned((m, n, k), dtype)
        same = self._gemm_class(m, n, k, dtype)
        note = [] if same else [f"no {'aligned' if aligned else 'misaligned'} shape measured: read from the others"]
        read = self._grid("gemm", dtype, aligned if same else None).read(m, n, k)
        cls = "aligned" if aligned else f"misaligned (a dimension not a multiple of {ALIGN_BYTES} bytes)"
        return Read(read.value, "; ".join([f"{dtype} {cls}: {read.basis}"] + note), read.spread)

    def gemm_points_read(self, m: int, n: int, k: int, dtype: str | None = None) -> tuple[GemmPoint, ...]:
        """The measured points `gemm_flops_per_s(m, n, k)` reads from: those of its dtype and
        alignment class, or all of its dtype where its class has none."""
        dtype = dtype or self.dtype
        return self._gemm_class(m, n, k, dtype) or tuple(p for p in self.gemm if p.dtype == dtype)

    def gemm_smallest_read(self, m: int, n: int, k: int) -> tuple[int, int, int]:
        """The smallest measured m, n and k among the points `gemm_points_read(m, n, k)` gives: one
        answer per alignment class, found once (a model's pricing asks per product)."""
        key = _aligned((m, n, k), self.dtype)
        if key not in self._smallest:
            points = self.gemm_points_read(m, n, k)
            self._smallest[key] = (min(p.m for p in points), min(p.n for p in points), min(p.k for p in points))
        return self._smallest[key]

    @cached_property
    def _smallest(self) -> dict[bool, tuple[int, int, int]]:
        return {}

    @cached_property
    def smallest_copy_bytes(self) -> int | None:
        """The fewest bytes a measured copy of the profile's dtype moved (None: none measured)."""
        return min((p.bytes_moved for p in self.memory if p.dtype == self.dtype), default=None)

    def _gemm_class(self, m: int, n: int, k: int, dtype: str) -> tuple[GemmPoint, ...]:
        classes = self._gemm_classes.get(dtype)
        if classes is None:
            raise InputError(f"device profile of {self.machine.device}: no GEMM measured at {dtype}")
        return classes[_aligned((m, n, k), dtype)]

    @cached_property
    def _gemm_classes(self) -> dict[str, dict[bool, tuple[GemmPoint, ...]]]:
        """The GEMM points of each dtype, split by alignment once: a model's pricing asks for them
        per product, thousands of times."""
        out: dict[str, dict[bool, tuple[GemmPoint, ...]]] = {}
        for dtype in dict.fromkeys(p.dtype for p in self.gemm):
            points = [p for p in self.gemm if p.dtype == dtype]
            out[dtype] = {aligned: tuple(p for p in points if _aligned((p.m, p.n, p.k), dtype) == aligned)
                          for aligned in (True, False)}
        return out

    def memory_bytes_per_s(self, kind: str, nbytes: int, dtype: str | None = None) -> Read:
        """Bytes read + written per second of a memory-bound `kind` moving `nbytes` (read + written)."""
        dtype = dtype or self.dtype
        measured = sorted({p.kind for p in self.memory if p.dtype == dtype})
        if not measured:
            raise InputError(f"device profile of {self.machine.device}: no memory-bound op measured at {dtype}")
        use, note = kind, []
        if kind not in measured:
            use = NEAREST_KIND.get(kind, GENERIC_KIND)
            if use not in measured:
                use = GENERIC_KIND if GENERIC_KIND in measured else measured[0]
            generic = use == GENERIC_KIND and kind not in NEAREST_KIND
            what = "a generic elementwise op" if generic else "the nearest kind"
            note = [f"{kind!r} not measured: read as {use} ({what})"]
        read = self._grid("memory", dtype, use).read(nbytes)
        return Read(read.value, "; ".join([f"{use} ({dtype}): {read.basis}"] + note), read.spread)

    def sdpa_flops_per_s(self, seq: int, head_dim: int, causal: bool) -> Read:
        """Forward + backward FLOP/s of fused attention (counted as `conventions["sdpa"]` says)."""
        same = [p for p in self.sdpa if p.causal == causal and p.dtype == self.dtype]
        if not same:
            raise InputError(f"device profile of {self.machine.device}: no {'causal' if causal else 'non-causal'} "
                             "attention measured")
        dims = sorted({p.head_dim for p in same})
        dim = min(dims, key=lambda d: (abs(math.log(d / head_dim)), d))
        note = [] if dim == head_dim else [f"head dim {head_dim} not measured: read at {dim}"]
        read = self._grid("sdpa", causal, dim).read(seq)
        what = f"{'causal' if causal else 'full'} attention, head dim {dim}"
        return Read(read.value, "; ".join([f"{what}: {read.basis}"] + note), read.spread)

    def host_seconds(self, kind: str) -> Read | None:
        """Seconds of host time per op of `kind` (HOST_KINDS); None where this profile lacks it."""
        if kind not in HOST_KINDS:
            raise InputError(f"host cost kind {kind!r} unknown (known: {', '.join(HOST_KINDS)})")
        if kind not in self.host_seconds_per_op:
            return None
        return Read(self.host_seconds_per_op[kind], self.host_how.get(kind, "measured"))

    def host_range(self, kind: str) -> tuple[float, float, str] | None:
        """(low, high, basis) seconds per op of `kind`: a measured one as (value, value), else the
        range derived from what was measured; None where the profile has neither."""
        read = self.host_seconds(kind)
        if read is not None:
            return read.value, read.value, read.basis
        if kind in self.host_ranges:
            low, high = self.host_ranges[kind]
            return low, high, self.host_how.get(kind, "derived")
        return None

    def optimizer_bytes_per_s(self) -> Read | None:
        if self.optimizer is None:
            return None
        o = self.optimizer
        return Read(o.bytes_per_s, f"{o.name}: {o.bytes_per_step:,} B per step over {o.params:,} parameters")

    def _grid(self, section: str, *key: Any) -> Grid:
        at = (section, *key)
        return self._grids[at]

    @cached_property
    def _grids(self) -> "_Grids":
        return _Grids(self)


class _Grids(dict):
    """The profile's points, built into interpolation grids on first use, by (section, key...)."""

    def __init__(self, profile: DeviceProfile):
        super().__init__()
        self.profile = profile

    def __missing__(self, key: tuple) -> Grid:
        p, section = self.profile, key[0]
        if section == "gemm":
            dtype, aligned = key[1], key[2]
            grid = Grid(("m", "n", "k"), [((g.m, g.n, g.k), g.flops_per_s) for g in p.gemm if g.dtype == dtype
                                          and (aligned is None or _aligned((g.m, g.n, g.k), dtype) == aligned)])
        elif section == "memory":
            grid = Grid(("bytes",), [((m.bytes_moved,), m.bytes_per_s) for m in p.memory
                                     if m.dtype == key[1] and m.kind == key[2]])
        else:
            grid = Grid(("seq",), [((s.seq,), s.flops_per_s) for s in p.sdpa
                                   if s.causal == key[1] and s.head_dim == key[2] and s.dtype == p.dtype])
        self[key] = grid
        return grid


def _aligned(dims: tuple[int, int, int], dtype: str) -> bool:
    per = max(1, ALIGN_BYTES // ITEM_BYTES.get(dtype, 2))
    return all(d % per == 0 for d in dims)


# ---- the JSON format ------------------------------------------------------------------------------

def profile_to_json(profile: DeviceProfile) -> dict:
    """The profile as its JSON document: the head every topoprof document carries, then the sections."""
    body = to_jsonable(profile)
    body.pop("schema_version")
    host_costs = {"seconds_per_op": body.pop("host_seconds_per_op"), "how": body.pop("host_how")}
    ranges = body.pop("host_ranges")
    if ranges:
        host_costs["ranges"] = ranges
    return {"schema_version": profile.schema_version, "kind": PROFILE_KIND,
            "tool": {"name": "topoprof", "version": __version__},
            "host": profile.machine.hostname, "created_utc": profile.machine.created_utc,
            **body, "host_costs": host_costs}


def load_profile(path: str) -> DeviceProfile:
    """A profile file, or InputError naming the file and what is wrong, in one line. Read once per
    version of the file: a command that prices with it in several places shares one profile (and
    the grids it builds on first use)."""
    try:
        stat = os.stat(path)
    except OSError:  # load_json says what is wrong with the path
        return _read_profile(path)
    return _read_profile_version(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _read_profile_version(path: str, mtime_ns: int, size: int) -> DeviceProfile:
    return _read_profile(path)


def _read_profile(path: str) -> DeviceProfile:
    return profile_from_dict(load_json(path), path)


def profile_from_dict(doc: Any, where: str) -> DeviceProfile:
    if not isinstance(doc, dict) or doc.get("kind") != PROFILE_KIND:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"{where}: not a device profile (kind {kind!r}, want {PROFILE_KIND!r}); "
                         "write one with `topoprof profile`")
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise InputError(f"{where}: no schema_version (an integer) in the device profile")
    if version > PROFILE_SCHEMA_VERSION:
        raise InputError(f"{where}: schema_version {version} is newer than this topoprof reads "
                         f"({OLDEST_SCHEMA_VERSION}..{PROFILE_SCHEMA_VERSION}); upgrade topoprof")
    if version < OLDEST_SCHEMA_VERSION:
        raise InputError(f"{where}: schema_version {version} is older than this topoprof reads "
                         f"({OLDEST_SCHEMA_VERSION}..{PROFILE_SCHEMA_VERSION}); measure it again with "
                         "`topoprof profile`")
    missing = [s for s in SECTIONS if s not in doc]
    if missing:
        raise InputError(f"{where}: device profile without section(s) {', '.join(missing)}")
    r = Reader(where)
    host = r.obj(doc["host_costs"], "host_costs")
    seconds_per_op = r.obj(host.get("seconds_per_op", {}), "host_costs.seconds_per_op")
    return DeviceProfile(
        source=str(doc.get("source", "")), citation=str(doc.get("citation", "")),
        machine=r.machine(doc["machine"]), dtype=r.text(doc, "dtype", "profile"),
        host_seconds_per_op={k: r.positive(seconds_per_op, k, "host_costs.seconds_per_op") for k in seconds_per_op},
        host_how={str(k): str(v) for k, v in r.obj(host.get("how", {}), "host_costs.how").items()},
        host_ranges={str(k): r.span(v, f"host_costs.ranges.{k}")
                     for k, v in r.obj(host.get("ranges", {}), "host_costs.ranges").items()},
        gemm=tuple(GemmPoint(r.count(e, "m", w), r.count(e, "n", w), r.count(e, "k", w), r.text(e, "dtype", w),
                             r.positive(e, "seconds", w), r.positive(e, "flops_per_s", w))
                   for w, e in r.entries(doc["gemm"], "gemm")),
        memory=tuple(MemoryPoint(r.text(e, "kind", w), r.text(e, "dtype", w), r.count(e, "tensor_bytes", w),
                                 r.count(e, "bytes_moved", w), r.positive(e, "seconds", w),
                                 r.positive(e, "bytes_per_s", w))
                     for w, e in r.entries(doc["memory"], "memory")),
        sdpa=tuple(SdpaPoint(r.count(e, "seq", w), r.count(e, "head_dim", w), r.flag(e, "causal", w),
                             r.count(e, "batch", w), r.count(e, "heads", w), r.text(e, "dtype", w),
                             r.positive(e, "seconds", w), r.positive(e, "flops_per_s", w))
                   for w, e in r.entries(doc["sdpa"], "sdpa")),
        optimizer=None if doc["optimizer"] is None else r.optimizer(doc["optimizer"]),
        conventions={str(k): str(v) for k, v in r.obj(doc.get("conventions", {}), "conventions").items()},
        quick=bool(doc.get("quick", False)), cpu=None if doc.get("cpu") is None else r.pages(doc["cpu"]),
        skipped=tuple(Skipped(str(e.get("section", "")), str(e.get("what", "")), str(e.get("reason", "")))
                      for _, e in r.entries(doc.get("skipped", []), "skipped")),
        notes=tuple(str(n) for n in doc.get("notes", [])),
        seconds=doc.get("seconds") if isinstance(doc.get("seconds"), (int, float)) else None,
        section_seconds={str(k): float(v) for k, v in r.obj(doc.get("section_seconds", {}), "section_seconds").items()
                         if isinstance(v, (int, float))},
        schema_version=version)
