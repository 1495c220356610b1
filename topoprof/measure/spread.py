"""Per-rank timing spread: which rank is consistently slower than its peers.

Each bench row keeps every rank's time for that size. A collective completes on all ranks at
about the same moment, so a healthy job shows a spread of a few percent, mostly arrival skew.
A rank that is late by more than `threshold` over the median on most sizes is flagged: a slow
GPU, a downtrained link or a busy node shows up that way.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Sequence


@dataclass(frozen=True)
class SlowRank:
    rank: int
    collective: str
    slower_sizes: int          # sizes where this rank exceeded the median by > threshold
    sizes: int                 # sizes considered
    median_excess_pct: float   # median of (rank time / median time - 1) over those sizes


def slow_ranks(rows: Sequence, threshold: float = 0.10, min_share: float = 0.75,
               min_size_bytes: int = 1 << 16) -> list[SlowRank]:
    """Ranks slower than the median by > threshold on at least min_share of the sizes.

    Small sizes are skipped (their times are dominated by launch jitter).
    """
    by_coll: dict[tuple, list] = {}
    for row in rows:
        times = getattr(row, "rank_times_us", ())
        if len(times) >= 2 and row.size_bytes >= min_size_bytes:
            key = (row.collective, getattr(row, "level", "job"), getattr(row, "group", ""))
            ranks = tuple(getattr(row, "ranks", ()) or range(len(times)))
            by_coll.setdefault(key, []).append(dict(zip(ranks, times)))
    flagged = []
    for (coll, level, group), series in by_coll.items():
        for rank in sorted(set.intersection(*(set(t) for t in series))):
            excess = [t[rank] / median(t.values()) - 1.0 for t in series if median(t.values()) > 0]
            slower = sum(1 for e in excess if e > threshold)
            if excess and slower >= min_share * len(excess):
                label = coll if level == "job" else f"{coll} ({level} {group})".replace(" )", ")")
                flagged.append(SlowRank(rank, label, slower, len(excess), 100.0 * median(excess)))
    return flagged
