"""Rings that run at once over an NVLink mesh without NVSwitch: NCCL's channels.

NCCL does not run one ring: its ring search (`src/graph/search.cc`, as of its 2020 and 2022
revisions, NCCL v2.7-v2.1x: ncclTopoSearchRec, followPath, ncclTopoCompareGraphs) looks for
several channels, each a ring through every GPU, and takes a channel's bandwidth off every link
it crosses (followPath subtracts the channel's speed from each link's width), so a ring goes on
only while its links have bandwidth left; the search keeps the graph with the most
channels x speed (ncclTopoCompareGraphs), and first tries to replay the last channel. A bonded
NV# pair is one link of # x the per-link rate in NCCL's graph (`src/graph/topo.cc`), so it carries
# rings in each direction at the per-link rate; links are full duplex, so a ring and its reverse
do not compete.

Here the same packing as pure logic: each directed GPU pair has its NV# links; repeatedly find a
ring over all the GPUs through pairs with a link left in that direction, the one whose slowest
link is fastest (then the one through the pairs with the most links left, then the reverse of
the ring just taken), and take one link from each pair it crosses. The rings' bottlenecks added up
are the bus bandwidth the job's all-reduce can reach together; no GPU can send faster than its
own NVLinks to the others (`link_bound`; NCCL's getTotalWidth adds up a GPU's NVLink widths too).
Exhaustive per ring up to `exhaustive_limit` GPUs, nearest-neighbour greedy beyond. The packing is
greedy: on an irregular mesh an optimal one may find more rings (never fewer than one, when any
ring exists).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

Rate = tuple[float, float]  # (low, high) GB/s per direction; equal when exact


@dataclass(frozen=True)
class Packing:
    rings: tuple[tuple[int, ...], ...]
    ring_gbps: tuple[Rate, ...]  # each ring's bottleneck: the per-link rate of its slowest pair

    @property
    def total_gbps(self) -> Rate:
        return (math.fsum(r[0] for r in self.ring_gbps), math.fsum(r[1] for r in self.ring_gbps))


def _key(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _edges(ring: Sequence[int]) -> list[tuple[int, int]]:
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))]


def link_bound(gpus: Sequence[int], links: Mapping[tuple[int, int], int],
               per_link: Mapping[tuple[int, int], Rate]) -> Rate:
    """The most any GPU can send: its NVLinks to the other chosen GPUs x their per-link rate,
    for the GPU with the least (a ring takes one outgoing link of every GPU)."""
    def out(g: int, end: int) -> float:
        return math.fsum(links.get(_key(g, h), 0) * per_link[_key(g, h)][end]
                         for h in gpus if h != g and links.get(_key(g, h), 0))
    return (min(out(g, 0) for g in gpus), min(out(g, 1) for g in gpus))


def pack_rings(gpus: Sequence[int], links: Mapping[tuple[int, int], int],
               per_link: Mapping[tuple[int, int], Rate], exhaustive_limit: int) -> Packing:
    """The rings that fit together over `links` (NV# per GPU pair, keyed (low, high) index) at
    `per_link` GB/s per link of each pair; no ring when the pairs do not join every GPU."""
    gpus = list(gpus)
    if len(gpus) < 2:
        return Packing((), ())
    spare = {}
    for (a, b), count in links.items():
        if a in gpus and b in gpus and count > 0:
            spare[(a, b)] = spare[(b, a)] = count
    rings: list[tuple[int, ...]] = []
    rates: list[Rate] = []
    while True:
        last = rings[-1] if rings else None
        found = (_best_ring(gpus, spare, per_link, last) if len(gpus) <= exhaustive_limit
                 else _greedy_ring(gpus, spare, per_link))
        if found is None:
            break
        ring, rate = found
        for edge in _edges(ring):
            spare[edge] -= 1
        rings.append(tuple(ring))
        rates.append(rate)
    return Packing(tuple(rings), tuple(rates))


def _rings(gpus: list[int], spare: Mapping[tuple[int, int], int]) -> Iterator[list[int]]:
    """Every ring from gpus[0] through all GPUs over directed pairs with a link to spare."""
    first = gpus[0]
    path = [first]

    def extend(left: list[int]) -> Iterator[list[int]]:
        if not left:
            if spare.get((path[-1], first), 0) > 0:
                yield list(path)
            return
        for i, g in enumerate(left):
            if spare.get((path[-1], g), 0) > 0:
                path.append(g)
                yield from extend(left[:i] + left[i + 1:])
                path.pop()

    yield from extend(gpus[1:])


def _rate(ring: Sequence[int], per_link: Mapping[tuple[int, int], Rate]) -> Rate:
    return min((per_link[_key(a, b)] for a, b in _edges(ring)), key=lambda r: (r[0], r[1]))


def _best_ring(gpus, spare, per_link, last) -> tuple[list[int], Rate] | None:
    reverse = [last[0], *reversed(last[1:])] if last else None
    best, best_score = None, None
    for ring in _rings(gpus, spare):
        rate = _rate(ring, per_link)
        room = [spare[e] for e in _edges(ring)]
        score = (rate[0], rate[1], min(room), sum(room), ring == reverse)
        if best_score is None or score > best_score:
            best, best_score = (ring, rate), score
    return best


def _greedy_ring(gpus, spare, per_link) -> tuple[list[int], Rate] | None:
    """Nearest neighbour: from gpus[0], always on to the GPU over the fastest pair with a link
    left (then the most links left); None when it strands."""
    ring, left = [gpus[0]], list(gpus[1:])
    while left:
        here = ring[-1]
        options = [g for g in left if spare.get((here, g), 0) > 0]
        if not options:
            return None
        nxt = max(options, key=lambda g: (per_link[_key(here, g)], spare[(here, g)]))
        ring.append(nxt)
        left.remove(nxt)
    if spare.get((ring[-1], ring[0]), 0) <= 0:
        return None
    return ring, _rate(ring, per_link)
