"""DDP's timeline for one synced micro-batch: when each bucket's gradients are ready, when its
all-reduce starts and ends on the one communication stream, what backward and the all-reduces
lose to each other, the bucket copies, and what is left exposed. One entry point,
`ddp_timeline`; `topoprof.model.strategies` turns it into step times.

Sources: torch/csrc/distributed/c10d/reducer.cpp (`mark_bucket_ready` launches buckets strictly
in order; `mark_variable_ready_dense` and `finalize_backward` copy gradients into and out of the
buckets), torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py (`fp16_compress_hook`).
The buckets themselves are `topoprof.model.ddp.buckets`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from topoprof.errors import InputError
from topoprof.model.comm.collectives import GB, CommModel
from topoprof.model.ddp.buckets import Bucket

FP16_BYTES = 2  # torch.float16, what fp16_compress_hook sends per element


def ddp_copy_bytes(params: int, grad_bytes: int, gradient_as_bucket_view: bool) -> int:
    """Memory traffic of DDP's bucket copies per synced backward. reducer.cpp
    `mark_variable_ready_dense` copies each gradient into its bucket (dividing by world size)
    and `finalize_backward` copies the reduced bucket back: read + write G each way, 4G bytes.
    With gradient_as_bucket_view the gradients are the bucket; the in-place divide is left: 2G."""
    passes = 2 if gradient_as_bucket_view else 4
    return passes * grad_bytes * params


def fp16_cast_bytes(numel: int, grad_bytes: int) -> int:
    """Memory traffic fp16_compress_hook adds to one bucket (default_hooks.py `_compress_hook`):
    `buffer.to(float16)` reads grad_bytes and writes 2 per element, `div_` reads and writes 2,
    and `decompress` copies back (reads 2, writes grad_bytes): numel * (2*grad_bytes + 8)."""
    return numel * (2 * grad_bytes + 4 * FP16_BYTES)


@dataclass(frozen=True)
class Overlap:
    backward_end_s: float  # wall time backward ends (slowed while an all-reduce runs)
    comm_end_s: float  # when the last bucket's all-reduce ends
    exposed_s: float  # max(backward_end, comm_end) - T_bwd: time communication adds


def _per_bucket(comm_slowdown: float | Sequence[float], n: int) -> list[float]:
    slowdowns = [float(comm_slowdown)] * n if isinstance(comm_slowdown, (int, float)) else list(comm_slowdown)
    if len(slowdowns) != n:
        raise InputError(f"{len(slowdowns)} communication slowdowns for {n} buckets")
    return slowdowns


def simulate_overlap(ready_s: Sequence[float], comm_s: Sequence[float], backward_s: float,
                     slowdown: float = 1.0, comm_slowdown: float | Sequence[float] = 1.0) -> Overlap:
    """DDP's bucket pipeline. Bucket j (launch order) starts once backward has produced its last
    gradient and bucket j-1 has finished: start_j = max(ready_j, end_{j-1}); reducer.cpp
    `mark_bucket_ready` launches buckets strictly in order, and one communication stream runs
    them one at a time. `ready_s` is in seconds of backward compute, `comm_s` in seconds of an
    all-reduce running alone.

    While both run they share the machine: backward advances at 1/slowdown of its own speed and
    the all-reduce at 1/comm_slowdown of its own (communication threads or kernels competing with
    compute for the same cores or SMs; 1.0 = no interference). Either runs at full speed alone.
    comm_slowdown may be one factor per bucket: beside compute a small all-reduce loses more than
    a large one (on CPU ranks its threads wait for a core on every message)."""
    comm_slowdowns = _per_bucket(comm_slowdown, len(comm_s))
    if slowdown < 1 or min(comm_slowdowns, default=1.0) < 1:
        raise InputError(f"slowdowns must be >= 1, got compute {slowdown}, communication {comm_slowdown}")
    # Tracked as lag = wall clock - backward progress: it grows only while the two share the
    # machine (by what backward loses) or an all-reduce runs after backward; summing small lags
    # keeps precision when backward is long and communication short.
    lag = progress = 0.0
    backward_lag = None  # lag when backward finishes
    comm_end = 0.0
    for ready, duration, comm_slowdown in zip(ready_s, comm_s, comm_slowdowns):
        progress = max(progress, ready)  # backward alone until this bucket is ready
        left = duration  # seconds of all-reduce-alone work still to do
        if progress < backward_s and left > 0:
            # Both run until the first of them finishes.
            both = min(left * comm_slowdown, (backward_s - progress) * slowdown)
            left = max(0.0, left - both / comm_slowdown)
            progress = min(backward_s, progress + both / slowdown)
            lag += both * (1 - 1 / slowdown)
        if progress >= backward_s and backward_lag is None:
            backward_lag = lag
        lag += left  # the rest of the all-reduce runs alone, after backward
        comm_end = progress + lag
    if backward_lag is None:
        backward_lag = lag  # backward finishes after the last all-reduce
    return Overlap(backward_s + backward_lag, comm_end, lag)


def overlap_floor_s(ready_fractions: Sequence[float], comm_s: Sequence[float],
                    slowdown: float = 1.0, comm_slowdown: float | Sequence[float] = 1.0) -> float:
    """The least exposed time however long backward is: buckets ready only when backward ends
    run after it in full; the others run beside backward for d * comm_slowdown of wall time, in
    which backward advances only 1/slowdown of that, so each adds d * comm_slowdown * (1 - 1/slowdown)."""
    return sum(d if f >= 1.0 else m * (1 - 1 / slowdown) * d
               for f, d, m in zip(ready_fractions, comm_s, _per_bucket(comm_slowdown, len(comm_s))))


def hiding_backward_s(ready_fractions: Sequence[float], comm_s: Sequence[float],
                      slowdown: float = 1.0, comm_slowdown: float | Sequence[float] = 1.0) -> float:
    """The shortest backward for which the exposed time reaches `overlap_floor_s`. The exposed
    time never grows with backward time (more compute, more room to overlap) and reaches the
    floor at a finite time, so: bracket by doubling, then bisect."""
    floor = overlap_floor_s(ready_fractions, comm_s, slowdown, comm_slowdown)

    def at_floor(backward_s: float) -> bool:
        ready = [f * backward_s for f in ready_fractions]
        exposed = simulate_overlap(ready, comm_s, backward_s, slowdown, comm_slowdown).exposed_s
        return exposed <= floor * (1 + 1e-9) + 1e-15

    if at_floor(0.0):
        return 0.0
    low, high = 0.0, max(sum(comm_s), 1e-12)
    for _ in range(200):
        if at_floor(high):
            break
        low, high = high, high * 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (low, mid) if at_floor(mid) else (mid, high)
    return high


@dataclass(frozen=True)
class DdpSetting:
    """What a DDP micro-batch's timeline depends on besides its buckets and links."""

    backward_s: float                    # T_bwd: backward compute alone
    params: int
    grad_bytes: int
    memory_bandwidth_gbps: float | None  # for the bucket copies and fp16 casts; None: counted 0
    compute_slowdown: float = 1.0        # backward runs 1/x as fast while an all-reduce runs
    comm_slowdown: float = 1.0           # an all-reduce runs 1/x as fast beside backward
    comm_slowdown_by_size: tuple[tuple[float, float], ...] = ()  # the same per all-reduce size
    gradient_as_bucket_view: bool = False
    copy_bandwidth_gbps: float | None = None  # the bucket copies' measured rate; None: memory's
    kernels_s: float = 0.0  # the reducer's kernels at their fixed cost each (topoprof.model.ddp.gpu_costs)


@dataclass(frozen=True)
class DdpTimeline:
    """One synced micro-batch, in seconds from the start of backward."""

    ready_s: tuple[float, ...]     # when each bucket's last gradient is ready (backward compute)
    comm_s: tuple[float, ...]      # each bucket's all-reduce, running alone (with fp16 casts)
    overlap: Overlap
    copies_s: float                # bucket copies in and out, fully exposed

    @property
    def exposed_s(self) -> float:
        """E: what DDP adds to backward per synced micro-batch."""
        return self.overlap.exposed_s + self.copies_s


def _memory_s(setting: DdpSetting, traffic_bytes: float) -> float:
    if setting.memory_bandwidth_gbps is None:
        return 0.0  # unknown: recorded in warnings, never guessed
    return traffic_bytes / (setting.memory_bandwidth_gbps * GB)


def bucket_comm_s(setting: DdpSetting, buckets: Sequence[Bucket], comm: CommModel,
                  fp16_compress: bool = False) -> list[float]:
    """Each bucket's time on the communication chain; with the fp16 hook, half the bytes
    plus the casts around its all-reduce."""
    if not fp16_compress:
        return [comm.allreduce_s(b.size_bytes) for b in buckets]
    return [comm.allreduce_s(b.numel * FP16_BYTES) + _memory_s(setting, fp16_cast_bytes(b.numel, setting.grad_bytes))
            for b in buckets]


def copies_traffic_s(setting: DdpSetting) -> float:
    """The bucket copies' memory traffic: at their measured rate, else the memory bandwidth."""
    traffic = ddp_copy_bytes(setting.params, setting.grad_bytes, setting.gradient_as_bucket_view)
    if setting.copy_bandwidth_gbps is not None:
        return traffic / (setting.copy_bandwidth_gbps * GB)
    return _memory_s(setting, traffic)


def copies_s(setting: DdpSetting) -> float:
    """DDP's own work per synced micro-batch: the copies' traffic and the reducer's kernels."""
    return copies_traffic_s(setting) + setting.kernels_s


def slowdown_at(points: tuple[tuple[float, float], ...], default: float, size_bytes: float) -> float:
    """A slowdown measured at several sizes ((bytes, factor), by size), for `size_bytes`:
    interpolated in log size between them, the nearest one's beyond them; `default` without them."""
    if not points:
        return default
    if size_bytes <= points[0][0]:
        return points[0][1]
    for (s0, f0), (s1, f1) in zip(points, points[1:]):
        if size_bytes <= s1:
            w = math.log(size_bytes / s0) / math.log(s1 / s0) if s1 > s0 else 1.0
            return f0 + w * (f1 - f0)
    return points[-1][1]


def comm_slowdowns(setting: DdpSetting, buckets: Sequence[Bucket], fp16_compress: bool = False) -> list[float]:
    """Each bucket's communication slowdown beside compute, at the size it sends."""
    return [slowdown_at(setting.comm_slowdown_by_size, setting.comm_slowdown,
                        b.numel * FP16_BYTES if fp16_compress else b.size_bytes) for b in buckets]


def ddp_timeline(setting: DdpSetting, buckets: Sequence[Bucket], comm: CommModel,
                 fp16_compress: bool = False) -> DdpTimeline:
    """The whole timeline of one synced micro-batch: readiness, the all-reduce chain, the
    interference between backward and the all-reduces, and the copies."""
    ready = tuple(b.ready_fraction * setting.backward_s for b in buckets)
    comm_s = tuple(bucket_comm_s(setting, buckets, comm, fp16_compress))
    overlap = simulate_overlap(ready, comm_s, setting.backward_s, setting.compute_slowdown,
                               comm_slowdowns(setting, buckets, fp16_compress))
    return DdpTimeline(ready, comm_s, overlap, copies_s(setting))


def hiding_threshold(setting: DdpSetting, buckets: Sequence[Bucket], comm: CommModel) -> tuple[float, float]:
    """(backward time at which E reaches its floor, that floor): the floor is what no amount of
    compute hides (buckets ready only at the end, the slowdown on the rest, the copies)."""
    fractions = [b.ready_fraction for b in buckets]
    comm_s = bucket_comm_s(setting, buckets, comm)
    args = (setting.compute_slowdown, comm_slowdowns(setting, buckets))
    return (hiding_backward_s(fractions, comm_s, *args),
            overlap_floor_s(fractions, comm_s, *args) + copies_s(setting))
