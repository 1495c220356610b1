"""Collective specs and the bench row record, following NVIDIA nccl-tests' conventions.

Every number here matches what an nccl-tests `*_perf` binary prints for the same run, so a
topoprof bench row and an imported nccl-tests row can be compared column by column.

Conventions (NVIDIA/nccl-tests, src/common.cu):
  * `size` column = max(send bytes, recv bytes) of one rank; `count` column = the count
    argument handed to the NCCL call (`max(args->sendBytes, args->expectedBytes)` and
    `args->nbytes / wordSize(type)` in TimeTest's PRINT).
  * The requested size S becomes `count = S / typesize` elements (setupArgs), which each
    collective's `*GetCollByteCount` turns into per-rank send/recv counts.
  * `algbw = S / t` with S = count * typesize * (nranks for the gathered/scattered
    collectives); `busbw = algbw * factor` (each `*GetBw`; doc/PERFORMANCE.md).
  * GB/s is 1e9 bytes/s (`/ 1.0E9 / sec` in every `*GetBw`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from topoprof.errors import InputError
from topoprof.jsonio import from_jsonable

# NCCL datatypes are 1, 2, 4 or 8 bytes (ncclInt8 .. ncclFloat64, src/common.cu test_types).
ELEM_BYTES_ALLOWED = (1, 2, 4, 8)

# Gathered/scattered collectives align each rank's chunk to 16 bytes:
# `base = (count/nranks) & -(16/eltSize)` in the *GetCollByteCount of src/all_gather.cu,
# src/reduce_scatter.cu and src/alltoall.cu (NVIDIA/nccl-tests master, e.g. reduce_scatter.cu
# at 2becba88). 2022-era copies round to 4 elements (`(count/(4*nranks))*4`, "#define ALIGN 4")
# and releases up to ~2020 used plain `count/nranks`; logs from those versions keep their own
# printed sizes, which nccl_tests.py reads as printed.
CHUNK_ALIGN_BYTES = 16

# More sizes than this is almost certainly a typo (e.g. a 1-byte step up to 1 GiB).
MAX_SWEEP_POINTS = 4096


def _check_args(nranks: int, elem_bytes: int) -> None:
    if not isinstance(nranks, int) or nranks < 1:
        raise InputError(f"nranks must be a whole number >= 1, got {nranks!r}")
    if elem_bytes not in ELEM_BYTES_ALLOWED:
        raise InputError(f"element size must be one of {ELEM_BYTES_ALLOWED} bytes, got {elem_bytes!r}")


def _chunk_count(count: int, nranks: int, elem_bytes: int) -> int:
    """Per-rank chunk in elements, rounded down to a 16-byte multiple (nccl-tests' `base`)."""
    per_rank_multiple = CHUNK_ALIGN_BYTES // elem_bytes
    return (count // nranks) // per_rank_multiple * per_rank_multiple


def _whole_counts(count: int, nranks: int, elem_bytes: int) -> tuple[int, int, int]:
    # (send, recv, param): every rank sends and receives the whole buffer. nccl-tests:
    # AllReduceGetCollByteCount (src/all_reduce.cu), BroadcastGetCollByteCount
    # (src/broadcast.cu), ReduceGetCollByteCount (src/reduce.cu), SendRecvGetCollByteCount
    # (src/sendrecv.cu) all set sendcount = recvcount = paramcount = count.
    return count, count, count


def _all_gather_counts(count: int, nranks: int, elem_bytes: int) -> tuple[int, int, int]:
    # src/all_gather.cu AllGatherGetCollByteCount: sendcount = base, recvcount = base*nranks,
    # paramcount = base. The printed size is the gathered output, base*nranks*typesize.
    base = _chunk_count(count, nranks, elem_bytes)
    return base, base * nranks, base


def _reduce_scatter_counts(count: int, nranks: int, elem_bytes: int) -> tuple[int, int, int]:
    # src/reduce_scatter.cu ReduceScatterGetCollByteCount: sendcount = base*nranks,
    # recvcount = base, paramcount = base (NCCL's recvcount argument).
    base = _chunk_count(count, nranks, elem_bytes)
    return base * nranks, base, base


def _all_to_all_counts(count: int, nranks: int, elem_bytes: int) -> tuple[int, int, int]:
    # src/alltoall.cu AlltoAllGetCollByteCount: paramcount = base (per peer),
    # sendcount = recvcount = nranks*base.
    base = _chunk_count(count, nranks, elem_bytes)
    return base * nranks, base * nranks, base


def _factor_all_reduce(n: int) -> float:
    # src/all_reduce.cu AllReduceGetBw: 2(n-1)/n. (With NCCL_ALGO=NVLS/NVLSTREE set, nccl-tests
    # prints (n-1)/(n+1) instead; such logs show up as busbw mismatches on import.)
    return 2.0 * (n - 1) / n


def _factor_n_minus_1_over_n(n: int) -> float:
    # src/all_gather.cu, src/reduce_scatter.cu, src/alltoall.cu *GetBw: (n-1)/n.
    return (n - 1) / n


def _factor_one(n: int) -> float:
    # src/broadcast.cu, src/reduce.cu, src/sendrecv.cu *GetBw: busbw = algbw.
    return 1.0


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective as nccl-tests sizes and scores it."""

    name: str
    nccl_tests_binary: str
    # (count, nranks, elem_bytes) -> (send, recv, param) element counts; nranks -> factor.
    _counts: Callable[[int, int, int], tuple[int, int, int]] = field(repr=False)
    _factor: Callable[[int], float] = field(repr=False)

    def busbw_factor(self, nranks: int) -> float:
        """busbw / algbw for this collective on `nranks` ranks (doc/PERFORMANCE.md)."""
        _check_args(nranks, 1)
        return self._factor(nranks)

    def _all_counts(self, size_bytes: int, nranks: int, elem_bytes: int) -> tuple[int, int, int]:
        _check_args(nranks, elem_bytes)
        if not isinstance(size_bytes, int) or size_bytes < 0:
            raise InputError(f"size must be a whole number of bytes >= 0, got {size_bytes!r}")
        # setupArgs in src/common.cu: count = size / wordSize(type), rounding down.
        return self._counts(size_bytes // elem_bytes, nranks, elem_bytes)

    def counts(self, size_bytes: int, nranks: int, elem_bytes: int) -> tuple[int, int]:
        """(send elements per rank, recv elements per rank) for a requested size."""
        send, recv, _ = self._all_counts(size_bytes, nranks, elem_bytes)
        return send, recv

    def printed_count(self, size_bytes: int, nranks: int, elem_bytes: int) -> int:
        """The `count` column: the element count passed to the NCCL call."""
        return self._all_counts(size_bytes, nranks, elem_bytes)[2]

    def aligned_size(self, size_bytes: int, nranks: int, elem_bytes: int) -> int:
        """The `size` column for a requested size: max(send, recv) bytes of one rank."""
        send, recv, _ = self._all_counts(size_bytes, nranks, elem_bytes)
        return max(send, recv) * elem_bytes


def _spec(name: str, binary: str, counts, factor) -> CollectiveSpec:
    return CollectiveSpec(name=name, nccl_tests_binary=binary, _counts=counts, _factor=factor)


# Adding a collective = adding one entry.
COLLECTIVES: dict[str, CollectiveSpec] = {
    s.name: s
    for s in (
        _spec("all_reduce", "all_reduce_perf", _whole_counts, _factor_all_reduce),
        _spec("all_gather", "all_gather_perf", _all_gather_counts, _factor_n_minus_1_over_n),
        _spec("reduce_scatter", "reduce_scatter_perf", _reduce_scatter_counts, _factor_n_minus_1_over_n),
        _spec("broadcast", "broadcast_perf", _whole_counts, _factor_one),
        _spec("all_to_all", "alltoall_perf", _all_to_all_counts, _factor_n_minus_1_over_n),
        _spec("sendrecv", "sendrecv_perf", _whole_counts, _factor_one),
        _spec("reduce", "reduce_perf", _whole_counts, _factor_one),
    )
}


def get_collective(name: str) -> CollectiveSpec:
    """Look a collective up by topoprof name or nccl-tests binary name ("alltoall_perf")."""
    if name in COLLECTIVES:
        return COLLECTIVES[name]
    for spec in COLLECTIVES.values():
        if name == spec.nccl_tests_binary or name == spec.nccl_tests_binary[: -len("_perf")]:
            return spec
    valid = ", ".join(COLLECTIVES)
    raise InputError(f"unknown collective {name!r}; valid names: {valid}")


@dataclass(frozen=True)
class BenchRow:
    """One size of one collective: the columns of an nccl-tests out-of-place (or in-place) row."""

    collective: str
    size_bytes: int
    count: int
    dtype: str
    time_us: float
    # None on one rank: nothing crosses a link, so S / t is no bandwidth of anything
    algbw_gbps: float | None
    busbw_gbps: float | None
    wrong: int | None  # None when not checked (nccl-tests prints N/A with -c 0)
    rank_times_us: tuple[float, ...] = ()  # per-rank times when measured by topoprof
    # Multi-node jobs measure three levels: "intra" (the ranks of one node, `group` = its host),
    # "inter" (one rank per node: the network alone) and "job" (every rank).
    level: str = "job"
    group: str = ""
    ranks: tuple[int, ...] = ()  # global ranks that took part


def row_from_dict(data: dict, where: str = "row") -> BenchRow:
    """A BenchRow from its JSON form, through the one typed reader (`SchemaError` names where it differs)."""
    return from_jsonable(BenchRow, data, where)


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """S / t in GB/s (1e9 B/s): bytes per microsecond / 1e3."""
    return size_bytes / time_us / 1e3


def make_row(
    spec: CollectiveSpec,
    size_bytes: int,
    nranks: int,
    dtype: str,
    elem_bytes: int,
    time_us: float,
    wrong: int | None,
    rank_times_us: tuple[float, ...] = (),
    level: str = "job",
    group: str = "",
    ranks: tuple[int, ...] = (),
) -> BenchRow:
    """A row as nccl-tests would print it: count from the spec, algbw = size/time, busbw = algbw*factor.
    On one rank the collective moves nothing between GPUs, so neither bandwidth is given: the row
    keeps only its time."""
    if not time_us > 0:
        raise InputError(f"time must be > 0 us, got {time_us!r} for {spec.name} at {size_bytes} B")
    alg = algbw_gbps(size_bytes, time_us) if nranks > 1 else None
    return BenchRow(
        collective=spec.name,
        size_bytes=size_bytes,
        count=spec.printed_count(size_bytes, nranks, elem_bytes),
        dtype=dtype,
        time_us=float(time_us),
        algbw_gbps=alg,
        busbw_gbps=alg * spec.busbw_factor(nranks) if alg is not None else None,
        wrong=wrong,
        rank_times_us=tuple(float(t) for t in rank_times_us),
        level=level,
        group=group,
        ranks=tuple(ranks),
    )


# nccl-tests' parsesize (src/common.cu) reads "%lf %1s": a number, then K/M/G in either case
# meaning powers of 1024. "B"/"iB" after the unit are accepted here for readability only.
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kKmMgG])(?:i?[bB])?|[bB])?\s*$")
_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str) -> int:
    """'8' -> 8, '1K' -> 1024, '64M', '1G', '512KB', '64MiB' (K/M/G are powers of 1024)."""
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InputError(f"bad size {text!r}: expected a number with optional K, M or G (powers of 1024), e.g. 8, "
                         f"512K, 64M, 1G")
    number, unit = match.groups()
    scaled = float(number) * (_UNITS[unit.lower()] if unit else 1)
    if scaled != int(scaled):
        raise InputError(f"bad size {text!r}: {number} x {_UNITS[unit.lower()] if unit else 1} = {scaled:g} is not a "
                         f"whole number of bytes")
    return int(scaled)


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2, step_bytes: int | None = None) -> list[int]:
    """Sizes visited by nccl-tests `-b min -e max -f factor` (or `-f 1 -i step`).

    TimeTest in src/common.cu loops `size <= maxbytes`, multiplying by the step factor when it
    is > 1 and adding `-i` stepbytes otherwise; the factor is an integer (parsed with strtol).
    """
    for label, value in (("min", min_bytes), ("max", max_bytes)):
        if not isinstance(value, int) or value < 0:
            raise InputError(f"{label} size must be a whole number of bytes >= 0, got {value!r}")
    if min_bytes > max_bytes:
        raise InputError(f"min size {min_bytes} B > max size {max_bytes} B")
    if not isinstance(factor, int) or factor < 1:
        raise InputError(f"factor must be a whole number >= 1 (nccl-tests -f), got {factor!r}")
    if factor > 1:
        if step_bytes is not None:
            raise InputError(f"give either factor > 1 or step_bytes, not both (nccl-tests ignores -i {step_bytes} when "
                             f"-f {factor})")
        if min_bytes == 0:
            raise InputError(f"min size 0 with factor {factor} never grows (0 x {factor} = 0); start at >= 1 B")
        count = 1
        while min_bytes * factor**count <= max_bytes:
            count += 1
        sizes = [min_bytes * factor**i for i in range(count)]
    else:
        if step_bytes is None or not isinstance(step_bytes, int) or step_bytes < 1:
            raise InputError(f"factor 1 steps by adding step_bytes (nccl-tests -i, default 1M): give step_bytes >= 1, "
                             f"got {step_bytes!r}")
        count = (max_bytes - min_bytes) // step_bytes + 1
        sizes = [] if count > MAX_SWEEP_POINTS else [min_bytes + i * step_bytes for i in range(count)]
    if len(sizes) > MAX_SWEEP_POINTS or not sizes:
        raise InputError(
            f"sweep {min_bytes}..{max_bytes} B gives {count} sizes, more than {MAX_SWEEP_POINTS}; use a larger factor "
            f"or step"
        )
    return sizes


COMBINE_RULES = ("avg", "min", "max", "rank0")


DTYPES = {  # name -> (torch dtype attribute, element bytes)
    "float32": ("float32", 4), "float16": ("float16", 2), "bfloat16": ("bfloat16", 2),
    "float64": ("float64", 8), "int32": ("int32", 4), "int64": ("int64", 8),
    "int8": ("int8", 1), "uint8": ("uint8", 1),
}


def combine(times_us: list[float], rule: str) -> float:
    if rule == "avg":
        return sum(times_us) / len(times_us)
    if rule == "min":
        return min(times_us)
    if rule == "max":
        return max(times_us)
    return times_us[0]
