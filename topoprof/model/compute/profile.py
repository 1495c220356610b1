"""A device profile: what one GPU (or CPU) really does with eager PyTorch training work, as
`topoprof profile` measures it (`probes/profile.py`), in a versioned JSON format, and the rates
read from it for any shape.

Sections (JSON keys; units in the names):
- machine: device, SMs, memory, driver, CUDA, torch, Python, host CPU, when;
- host_costs: seconds per op from Python by kind (`HOST_KINDS`), each with how it was measured;
- gemm: achieved FLOP/s of `a @ b` (a: m x k, b: k x n) at points of a grid, by dtype;
- memory: bytes read + written per second of memory-bound kinds (`MEMORY_KINDS`) by size;
- sdpa: scaled_dot_product_attention forward + backward FLOP/s by sequence, head dim, causal;
- optimizer: fused AdamW's bytes per second over its per-parameter traffic;
- cpu (a CPU only): the cost of writing fresh pages (`probes/device_costs.py`);
- conventions (how each figure is counted), skipped (points not measured, with why), notes.

The lookups return the value and a short basis (`Read`): measured, interpolated (log scale) or
clamped at the edge of what was measured (`topoprof.model.compute.profile_interp`). Another GPU is priced
from a profile by `topoprof.model.compute.profile_scale`. No torch here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from topoprof import __version__
from topoprof.errors import InputError
from topoprof.model.compute.profile_interp import Grid, Read

PROFILE_KIND = "device_profile"
PROFILE_SCHEMA_VERSION = 1       # what this topoprof writes
OLDEST_SCHEMA_VERSION = 1        # the oldest it still reads
SECTIONS = ("machine", "host_costs", "gemm", "memory", "sdpa", "optimizer")

HOST_KINDS = {
    "op": "a plain op (no autograd) on a tiny tensor",
    "autograd_forward": "an op recorded by autograd (forward)",
    "autograd_backward_node": "one node of the autograd engine's backward",
    "autocast_op": "a matmul under autocast, its input's cast included (2 kernels)",
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


@dataclass(frozen=True)
class Machine:
    kind: str                         # "cuda" or "cpu"
    device: str                       # the GPU's name (torch.cuda.get_device_name) or the CPU's model
    sm_count: int | None = None
    memory_bytes: int | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    python: str | None = None
    cpu_model: str | None = None
    threads: int | None = None
    hostname: str | None = None
    created_utc: str | None = None
    missing: dict[str, str] = field(default_factory=dict)   # field -> why it is None


@dataclass(frozen=True)
class GemmPoint:
    m: int
    n: int
    k: int
    dtype: str
    seconds: float
    flops_per_s: float


@dataclass(frozen=True)
class MemoryPoint:
    kind: str
    dtype: str
    tensor_bytes: int                 # the input tensor's size
    bytes_moved: int                  # bytes read + written per call
    seconds: float
    bytes_per_s: float


@dataclass(frozen=True)
class SdpaPoint:
    seq: int
    head_dim: int
    causal: bool
    batch: int
    heads: int
    dtype: str
    seconds: float
    flops_per_s: float


@dataclass(frozen=True)
class OptimizerRate:
    name: str
    params: int
    bytes_per_step: int
    seconds: float
    bytes_per_s: float


@dataclass(frozen=True)
class FreshPages:
    fresh_page_s_per_byte: float
    fresh_page_min_bytes: int
    how: str


@dataclass(frozen=True)
class Skipped:
    section: str
    what: str
    reason: str


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

    # ---- lookups ------------------------------------------------------------------------------

    def gemm_flops_per_s(self, m: int, n: int, k: int, dtype: str | None = None) -> Read:
        """FLOP/s of an m x k by k x n product, from the points of its dtype and of its alignment
        (every dimension a multiple of 16 bytes, or not: the two run at different rates)."""
        dtype = dtype or self.dtype
        aligned = _aligned((m, n, k), dtype)
        points = [p for p in self.gemm if p.dtype == dtype]
        if not points:
            raise InputError(f"device profile of {self.machine.device}: no GEMM measured at {dtype}")
        same = [p for p in points if _aligned((p.m, p.n, p.k), dtype) == aligned]
        note = [] if same else [f"no {'aligned' if aligned else 'misaligned'} shape measured: read from the others"]
        read = self._grid("gemm", dtype, aligned if same else None).read(m, n, k)
        cls = "aligned" if aligned else f"misaligned (a dimension not a multiple of {ALIGN_BYTES} bytes)"
        return Read(read.value, "; ".join([f"{dtype} {cls}: {read.basis}"] + note))

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
        return Read(read.value, "; ".join([f"{use} ({dtype}): {read.basis}"] + note))

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
        return Read(read.value, "; ".join([f"{what}: {read.basis}"] + note))

    def host_seconds(self, kind: str) -> Read | None:
        """Seconds of host time per op of `kind` (HOST_KINDS); None where this profile lacks it."""
        if kind not in HOST_KINDS:
            raise InputError(f"host cost kind {kind!r} unknown (known: {', '.join(HOST_KINDS)})")
        if kind not in self.host_seconds_per_op:
            return None
        return Read(self.host_seconds_per_op[kind], self.host_how.get(kind, "measured"))

    def optimizer_bytes_per_s(self) -> Read | None:
        if self.optimizer is None:
            return None
        o = self.optimizer
        return Read(o.bytes_per_s, f"{o.name}: {o.bytes_per_step:,} B per step over {o.params:,} parameters")

    def _grid(self, section: str, *key: Any) -> Grid:
        return self._grids[(section, *key)]

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
    from topoprof.jsonio import to_jsonable

    body = to_jsonable(profile)
    body.pop("schema_version")
    host_costs = {"seconds_per_op": body.pop("host_seconds_per_op"), "how": body.pop("host_how")}
    return {"schema_version": profile.schema_version, "kind": PROFILE_KIND,
            "tool": {"name": "topoprof", "version": __version__},
            "host": profile.machine.hostname, "created_utc": profile.machine.created_utc,
            **body, "host_costs": host_costs}


def load_profile(path: str) -> DeviceProfile:
    """A profile file, or InputError naming the file and what is wrong, in one line."""
    from topoprof.jsonio import load_json

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
    r = _Reader(where)
    host = r.obj(doc["host_costs"], "host_costs")
    seconds_per_op = r.obj(host.get("seconds_per_op", {}), "host_costs.seconds_per_op")
    return DeviceProfile(
        source=str(doc.get("source", "")), citation=str(doc.get("citation", "")),
        machine=r.machine(doc["machine"]), dtype=r.text(doc, "dtype", "profile"),
        host_seconds_per_op={k: r.positive(seconds_per_op, k, "host_costs.seconds_per_op") for k in seconds_per_op},
        host_how={str(k): str(v) for k, v in r.obj(host.get("how", {}), "host_costs.how").items()},
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


class _Reader:
    """Field checks with one-line errors: FILE: SECTION[i]: what is wrong."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.where}: {what}")

    def obj(self, value: Any, name: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(f"{name} must be an object")
        return value

    def entries(self, value: Any, name: str):
        if not isinstance(value, list):
            raise self.fail(f"{name} must be a list")
        for i, entry in enumerate(value):
            yield f"{name}[{i}]", self.obj(entry, f"{name}[{i}]")

    def _get(self, entry: dict, key: str, where: str) -> Any:
        if key not in entry:
            raise self.fail(f"{where}: missing {key!r}")
        return entry[key]

    def positive(self, entry: dict, key: str, where: str) -> float:
        value = self._get(entry, key, where)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise self.fail(f"{where}: {key} must be a positive number, got {value!r}")
        return float(value)

    def count(self, entry: dict, key: str, where: str) -> int:
        value = self._get(entry, key, where)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(f"{where}: {key} must be a positive integer, got {value!r}")
        return value

    def text(self, entry: dict, key: str, where: str) -> str:
        value = self._get(entry, key, where)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where}: {key} must be a non-empty string, got {value!r}")
        return value

    def flag(self, entry: dict, key: str, where: str) -> bool:
        value = self._get(entry, key, where)
        if not isinstance(value, bool):
            raise self.fail(f"{where}: {key} must be true or false, got {value!r}")
        return value

    def machine(self, value: Any) -> Machine:
        m = self.obj(value, "machine")
        known = {f for f in Machine.__dataclass_fields__}
        fields = {k: v for k, v in m.items() if k in known}
        self.text(m, "kind", "machine")
        self.text(m, "device", "machine")
        fields["missing"] = {str(k): str(v) for k, v in self.obj(m.get("missing", {}), "machine.missing").items()}
        return Machine(**fields)

    def optimizer(self, value: Any) -> OptimizerRate:
        o, w = self.obj(value, "optimizer"), "optimizer"
        return OptimizerRate(self.text(o, "name", w), self.count(o, "params", w), self.count(o, "bytes_per_step", w),
                             self.positive(o, "seconds", w), self.positive(o, "bytes_per_s", w))

    def pages(self, value: Any) -> FreshPages:
        c, w = self.obj(value, "cpu"), "cpu"
        rate = self._get(c, "fresh_page_s_per_byte", w)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise self.fail(f"cpu: fresh_page_s_per_byte must be a number >= 0, got {rate!r}")
        return FreshPages(float(rate), self.count(c, "fresh_page_min_bytes", w), str(c.get("how", "")))
