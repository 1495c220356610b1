"""Interpolation over a device profile's measured points (`topoprof.model.compute.profile`), in log space.

A rate measured at points of one to three positive coordinates (a GEMM's m, n, k; a memory op's
bytes; an attention's sequence length) is read at any coordinates:

1. coordinates outside the measured range of an axis are clamped to its nearest end (the rate of
   the nearest measured size, not an extrapolation), and the basis says so;
2. a measured point is its own rate;
3. otherwise the smallest box around the point whose corners were all measured (on a full grid:
   the grid cell) gives the rate by multilinear interpolation of log(rate) over log(coordinate),
   i.e. a power law between neighbours: exact at every corner and monotone between two;
4. points that form no such box (a scattered set, such as shared/gpu-facts' shapes) give the
   inverse-distance blend of log(rate) over the NEAREST measured points in log coordinates; how
   far those points disagree (the weighted standard deviation of their log rates, `spread`) is
   how uncertain such a reading is, which a caller may carry as a range.
Several measurements at the same coordinates count as their geometric mean.

Pure Python, no torch: the model reads a profile on any machine.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

NEAREST = 4          # points blended where no box is measured around the query
DEPTH = 4            # measured values tried on each side of the query, per axis, for a box
MAX_BOXES = 4096     # boxes tried before the blend


@dataclass(frozen=True)
class Read:
    value: float
    basis: str
    spread: float = 0.0   # a blend's uncertainty: its points' weighted std of log(rate); 0 where measured or boxed


def _fmt(x: float) -> str:
    return f"{x:g}" if x < 1e6 else f"{x:.3g}"


def _where(names: Sequence[str], coords: Sequence[float]) -> str:
    return " ".join(f"{n}={_fmt(c)}" for n, c in zip(names, coords))


class Grid:
    """Measured (coordinates, rate) points of one kind, ready to read."""

    def __init__(self, names: Sequence[str], points: Sequence[tuple[Sequence[float], float]]):
        if not points:
            raise ValueError("a grid needs at least one measured point")
        self.names = tuple(names)
        by_coords: dict[tuple[float, ...], list[float]] = defaultdict(list)
        for coords, rate in points:
            if len(coords) != len(self.names) or min(coords) <= 0 or not rate > 0:
                raise ValueError(f"bad point {tuple(coords)} -> {rate} for axes {self.names}")
            by_coords[tuple(float(c) for c in coords)].append(float(rate))
        self.logs = {c: sum(math.log(r) for r in rs) / len(rs) for c, rs in by_coords.items()}
        self.counts = {c: len(rs) for c, rs in by_coords.items()}
        self.axes = [sorted({c[i] for c in self.logs}) for i in range(len(self.names))]
        self._read: dict[tuple[float, ...], Read] = {}   # a trace asks for the same shapes many times

    def read(self, *query: float) -> Read:
        if len(query) != len(self.names):
            raise ValueError(f"{len(query)} coordinates for the axes {self.names}")
        if query not in self._read:
            self._read[query] = self._look_up(query)
        return self._read[query]

    def _look_up(self, query: tuple[float, ...]) -> Read:
        clamped, notes = [], []
        for name, q, axis in zip(self.names, query, self.axes):
            c = min(max(float(q), axis[0]), axis[-1])
            if c != q:
                side = "below the smallest" if q < c else "above the largest"
                notes.append(f"{name}={_fmt(q)} {side} measured ({_fmt(c)}): clamped")
            clamped.append(c)
        key = tuple(clamped)
        if key in self.logs:
            n = self.counts[key]
            how = f"measured at {_where(self.names, key)}" + (f" (geometric mean of {n})" if n > 1 else "")
        else:
            box = self._box(key)
            if box is not None:
                return Read(math.exp(self._multilinear(key, box)), "; ".join([self._box_text(box)] + notes))
            value, spread, how = self._blend(key)
            return Read(math.exp(value), "; ".join([how] + notes), spread)
        return Read(math.exp(self.logs[key]), "; ".join([how] + notes))

    # ---- a measured box around the query --------------------------------------------------

    def _pairs(self, q: float, axis: list[float]) -> list[tuple[float, float, float]]:
        """(log width, lo, hi) of the candidate brackets on one axis, narrowest first."""
        on = [q] if q in axis else []   # a measured value: itself first, its neighbours where it has holes
        los = on + [v for v in reversed(axis) if v < q][:DEPTH]
        his = on + [v for v in axis if v > q][:DEPTH]
        return sorted((math.log(hi / lo), lo, hi) for lo in los for hi in his)

    def _complete(self, box: tuple[tuple[float, float], ...]) -> bool:
        return all(corner in self.logs for corner in itertools.product(*({lo, hi} for lo, hi in box)))

    def _box(self, q: tuple[float, ...]) -> tuple[tuple[float, float], ...] | None:
        """The narrowest box (sum of log widths) around q with every corner measured, or None."""
        pairs = [self._pairs(c, axis) for c, axis in zip(q, self.axes)]
        if any(not p for p in pairs):
            return None
        start = (0,) * len(pairs)
        heap = [(sum(p[0][0] for p in pairs), start)]
        seen = {start}
        for _ in range(MAX_BOXES):
            if not heap:
                return None
            _, idx = heapq.heappop(heap)
            box = tuple((pairs[a][i][1], pairs[a][i][2]) for a, i in enumerate(idx))
            if self._complete(box):
                return box
            for a in range(len(idx)):
                nxt = idx[:a] + (idx[a] + 1,) + idx[a + 1:]
                if nxt[a] < len(pairs[a]) and nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(heap, (sum(pairs[b][j][0] for b, j in enumerate(nxt)), nxt))
        return None

    def _multilinear(self, q: tuple[float, ...], box: tuple[tuple[float, float], ...]) -> float:
        total = 0.0
        for corner in itertools.product(*({lo, hi} for lo, hi in box)):
            weight = 1.0
            for c, (lo, hi), x in zip(corner, box, q):
                if lo == hi:
                    continue
                t = math.log(x / lo) / math.log(hi / lo)
                weight *= t if c == hi else 1 - t
            total += weight * self.logs[corner]
        return total

    def _box_text(self, box: tuple[tuple[float, float], ...]) -> str:
        spans = [f"{n} {_fmt(lo)}" if lo == hi else f"{n} {_fmt(lo)}..{_fmt(hi)}"
                 for n, (lo, hi) in zip(self.names, box)]
        return "interpolated (log scale) between measured " + ", ".join(spans)

    # ---- no box: the nearest points -------------------------------------------------------

    def _blend(self, q: tuple[float, ...]) -> tuple[float, float, str]:
        def distance(c: tuple[float, ...]) -> float:
            return math.sqrt(sum(math.log2(a / b) ** 2 for a, b in zip(c, q)))

        nearest = sorted(self.logs, key=lambda c: (distance(c), c))[:NEAREST]
        weights = [1 / distance(c) ** 2 for c in nearest]
        value = sum(w * self.logs[c] for w, c in zip(weights, nearest)) / sum(weights)
        spread = math.sqrt(sum(w * (self.logs[c] - value) ** 2 for w, c in zip(weights, nearest)) / sum(weights))
        first = nearest[0]
        return value, spread, (f"no measured box around {_where(self.names, q)}: inverse-distance blend (log scale) "
                               f"of the {len(nearest)} nearest measured, the nearest {_where(self.names, first)}, "
                               f"x/{math.exp(spread):.3g} across them")
