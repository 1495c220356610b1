"""What `validate`'s rank worker measured (probes/ranks/validation.py), reduced to the model's inputs and
to what each DDP mode really did.

Every input is measured many times, in turns with the steps it predicts, and reported with its
spread (median, quartiles, extremes, count). The statistic that feeds the model follows from how
a step adds up:
- A DDP step waits for the slowest rank at every all-reduce, so compute per micro-batch is the
  slower rank's: the calibration runs every rank's micro-batches at the same time, and each
  micro-batch counts at the maximum over ranks.
- A step is a sum of micro-batches, and short slow spells (a shared core, another tenant) hit
  some of them: a sum's typical value follows the parts' means, not their medians. Predicting
  one rotation, the machine's level is that rotation's median and the spells are added at the
  rate the whole run measured (mean less median): one rotation has too few samples to tell a
  spell from a level. The interference factors are ratios of two durations measured together;
  they enter as medians over the run, each reported with its spread.
- DDP's own costs per micro-batch (its hooks; the bucket copies of a synced micro-batch) are a
  few milliseconds inside a micro-batch's spread: they are medians of paired differences.
A mode's measured step is the slowest rank's, and its parts come from that rank's timeline.
FSDP's (topoprof.model.fsdp, probes/ranks/fsdp.py): its own work is a level, the passes through FSDP less
the plain micro-batches of the same rotations (`fsdp_costs`); its collectives between compute are
means, a step adding dozens of them (`fsdp_points`).
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Spread:
    """A quantity measured `n` times."""

    value: float   # the statistic the model uses
    median: float
    p25: float
    p75: float
    low: float
    high: float
    n: int
    statistic: str

    @property
    def half_range_pct(self) -> float:
        """Half the interquartile range, as a share of the value (the ± a reader sees)."""
        return 50.0 * (self.p75 - self.p25) / self.value if self.value else 0.0


def _timed(level: Spread | None) -> Spread:
    """The spread of times every rotation measured (so never None)."""
    assert level is not None
    return level


def spread(samples: Sequence[float | None], statistic: str = "median") -> Spread | None:
    values = sorted(x for x in samples if x is not None and x == x)
    if not values:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    value = statistics.fmean(values) if statistic == "mean" else statistics.median(values)
    return Spread(value, statistics.median(values), q[0], q[2], values[0], values[-1], len(values), statistic)


def _per_micro_batch_max(rotation: list[dict], forward: str, backward: str) -> list[tuple[float, float]]:
    """(forward, backward) of the slower rank, micro-batch by micro-batch (they ran together)."""
    out = []
    for j in range(len(rotation[0]["calibration"][forward])):
        pairs = [(r["calibration"][forward][j], r["calibration"][backward][j]) for r in rotation]
        out.append(max(pairs, key=lambda fb: fb[0] + fb[1]))
    return out


def _compute_samples(rotations: list[list[dict]]) -> dict[str, list[float]]:
    """Every compute sample: per micro-batch the slower rank's (they ran together)."""
    plain = [fb for rot in rotations for fb in _per_micro_batch_max(rot, "forward_s", "backward_s")]
    out = {"forward_s": [f for f, _ in plain], "backward_s": [b for _, b in plain],
           "micro_batch_time_s": [f + b for f, b in plain],
           "optimizer_time_s": [max(times) for rot in rotations
                                for times in zip(*(r["calibration"]["optimizer_s"] for r in rot))]}
    # FSDP's optimizer on the shards: per half and wrapping the slower rank's
    fsdp = [max(r["calibration"]["fsdp"][h][w]["optimizer_s"] for r in rot)
            for rot in rotations if rot[0]["calibration"].get("fsdp")
            for h in range(len(rot[0]["calibration"]["fsdp"])) for w in rot[0]["calibration"]["fsdp"][h]]
    if fsdp:
        out["fsdp_optimizer_time_s"] = fsdp
    return out


def _paired_costs(rotations: list[list[dict]], slower: str, faster: str) -> list[float]:
    """What pass `slower` costs over pass `faster`, micro-batch by micro-batch on each rank: the
    same micro-batch, the same rank, a moment apart, so that the machine's level cancels."""
    out = []
    for rot in rotations:
        for r in rot:
            cal = r["calibration"]
            if f"{slower}forward_s" not in cal or f"{faster}forward_s" not in cal:
                continue
            a = [f + b for f, b in zip(cal[f"{slower}forward_s"], cal[f"{slower}backward_s"])]
            b = [f + b for f, b in zip(cal[f"{faster}forward_s"], cal[f"{faster}backward_s"])]
            if not faster:  # the plain pass: the micro-batch each DDP sample repeats
                b = [b[i] for i in cal["ddp_pairs"]]
            out += [x - y for x, y in zip(a, b)]
    return out


def ddp_costs(rotations: list[list[dict]]) -> dict[str, Spread]:
    """DDP's own compute per micro-batch, as the median of paired differences: through DDP inside
    `no_sync()` less the bare module (`ddp_overhead_s`: its forward and hooks), and synced with a
    hook that communicates nothing less inside `no_sync()` (`ddp_copies_s`: every gradient copied
    into its bucket, divided, and copied back). Each is a few milliseconds under the micro-batch's
    own spread: a pair a moment apart on one rank cancels the machine's level, and the median over
    the run ignores the pairs a slow spell split."""
    out = {"ddp_overhead_s": spread(_paired_costs(rotations, "ddp_", "")),
           "ddp_copies_s": spread(_paired_costs(rotations, "local_", "ddp_"))}
    return {k: v for k, v in out.items() if v is not None}


# FSDP's own work per micro-batch, from the calibration's passes through FSDP with collectives
# that communicate nothing (probes/ranks/fsdp.py), each less the plain pass of the same micro-batch:
# the names `topoprof.model.compute.timing.Compute` gives them once divided per group (validate.py).
FSDP_COSTS = ("fsdp_forward_cost_s", "fsdp_backward_cost_s", "fsdp_backward_no_sync_cost_s", "fsdp_unshard_cost_s")


def fsdp_costs(rotations: list[list[dict]]) -> dict[str, Spread]:
    """What FSDP itself adds to a micro-batch's compute, from passes through FSDP whose
    collectives move one element instead of its buffers (so the ranks block, wait and wake where
    a step's do), less the time inside those collectives: each pass at its slower rank (the ranks
    ran it together), as the plain compute is. Levels, not pairs: the median of those passes less
    the median of the plain micro-batches of the same rotations (when other work shares the cores,
    a pass and its plain twin a moment apart can meet different loads; the levels of a rotation
    move together). Forward (both wrappings, both passes); backward synced and under no_sync (the
    wrapping that keeps its parameters after forward: no all-gather in backward); and what the
    all-gathers of backward add (the resharding wrapping's backward level less the other's)."""
    plain = [fb for rot in rotations for fb in _per_micro_batch_max(rot, "forward_s", "backward_s")]
    if not plain or not rotations[0][0]["calibration"].get("fsdp"):
        return {}
    plain_f = statistics.median(f for f, _ in plain)
    plain_b = statistics.median(b for _, b in plain)
    passes: dict[tuple[str, str, str], list[float]] = {}
    for rot in rotations:
        for h in range(len(rot[0]["calibration"].get("fsdp") or [])):
            for w in rot[0]["calibration"]["fsdp"][h]:
                for kind in ("no_sync", "sync"):
                    runs = [r["calibration"]["fsdp"][h][w][kind] for r in rot]
                    passes.setdefault((w, kind, "forward"), []).append(max(p[0] - p[2] for p in runs))
                    passes.setdefault((w, kind, "backward"), []).append(max(p[1] - p[3] for p in runs))

    def less(samples: list[float], level: float) -> Spread | None:
        return spread([x - level for x in samples])

    out = {"fsdp_forward_cost_s": less([x for (w, k, part), v in passes.items() if part == "forward" for x in v],
                                       plain_f),
           "fsdp_backward_cost_s": less(passes.get(("shard_grad_op", "sync", "backward"), []), plain_b),
           "fsdp_backward_no_sync_cost_s": less(passes.get(("shard_grad_op", "no_sync", "backward"), []), plain_b)}
    keep = [x for kind in ("no_sync", "sync") for x in passes.get(("shard_grad_op", kind, "backward"), [])]
    full = [x for kind in ("no_sync", "sync") for x in passes.get(("full_shard", kind, "backward"), [])]
    if keep and full:
        out["fsdp_unshard_cost_s"] = less(full, statistics.median(keep))
    return {k: v for k, v in out.items() if v is not None}


def fsdp_points(rotations: list[list[dict]]) -> list[tuple[str, int, Spread]]:
    """(collective, bytes, what one of FSDP's all-gathers or reduce-scatters of that size adds to
    a step on a blocking backend): from the shadow passes before each step (probes/ranks/fsdp.py), the
    plain model's compute with FSDP's collectives where FSDP issues them. Every rank leaves each
    collective at the same moment, so a step's wall time is any rank's compute plus its time
    inside the collectives, and so the ranks' mean compute plus their mean time inside: each
    collective at the mean over ranks (the transfer, the wait for the other ranks' compute, the
    wake-ups). A step adds dozens of them, so the slow ones count at their rate: the mean over the
    rotations given (validate gives a rotation with its neighbours: the rate drifts over tens of
    seconds, and one rotation's passes alone are too few to pin it)."""
    samples: dict[tuple[str, int], list[float]] = {}
    for rot in rotations:
        for i in range(len(rot[0].get("fsdp_replays") or [])):
            events = [r["fsdp_replays"][i]["events"] for r in rot]
            for j, (kind, numel, _) in enumerate(events[0]):
                samples.setdefault((kind, 4 * numel), []).append(statistics.fmean(e[j][2] for e in events))
    return [(kind, size, _timed(spread(v, "mean"))) for (kind, size), v in sorted(samples.items())]


def rank_spread(rotations: list[list[dict]]) -> dict[str, float] | None:
    """How the ranks' compute differs, from the calibration micro-batches they ran at the same
    time: per micro-batch each rank's time less the mean over ranks, split into each rank's own
    level over a rotation (a persistently slower rank) and what is left (jitter). Returns the
    standard deviations pooled over rotations, the persistent one as a share of the mean
    micro-batch (`rank_speed_spread`) and the jitter also as a share (`rank_jitter`: it is carried
    to other models in proportion to their compute), with the number of ranks; None with one rank
    or one micro-batch."""
    persistent, jitter, means = [], [], []
    for rot in rotations:
        times = [[f + b for f, b in zip(r["calibration"]["forward_s"], r["calibration"]["backward_s"])] for r in rot]
        n, m = len(times), min(len(t) for t in times)
        if n < 2 or m < 2:
            continue
        per_batch = [statistics.fmean(t[j] for t in times) for j in range(m)]
        levels = [statistics.fmean(t[j] - per_batch[j] for j in range(m)) for t in times]
        rest = [t[j] - per_batch[j] - level for t, level in zip(times, levels) for j in range(m)]
        var_jitter = sum(e * e for e in rest) / ((n - 1) * (m - 1))
        # a rank's level over m micro-batches carries 1/m of the jitter's variance: take it out
        var_level = max(0.0, sum(x * x for x in levels) / (n - 1) - var_jitter / m)
        persistent.append(var_level)
        jitter.append(var_jitter)
        means.append(statistics.fmean(per_batch))
    if not means:
        return None
    return {"rank_speed_spread": (statistics.fmean(persistent) ** 0.5) / statistics.fmean(means),
            "rank_jitter": (statistics.fmean(jitter) ** 0.5) / statistics.fmean(means),
            "rank_spread_world_size": len(rotations[0])}


def calibration(rotations: list[list[dict]], run: list[list[dict]] | None = None) -> dict[str, Spread]:
    """The model's inputs, each with its spread, from the calibration records of `rotations`.

    Alone, the times are the means of the samples. With `run` (every rotation of the run, of
    which `rotations` is a part), each time is the machine's level in `rotations` (the median of
    their samples, which one slow spell does not move) plus what slow spells cost on average over
    the whole run (its mean less its median): a step adds its micro-batches, so spells count at
    their rate, and that rate is measured from all the samples, not from the few of one rotation.
    DDP's own costs and the interference factors come from the whole run."""
    own = _compute_samples(rotations)
    if run is None:
        out = {k: spread(v, "mean") for k, v in own.items()}
    else:
        pooled = _compute_samples(run)
        out = {}
        for k, values in own.items():
            level = spread(values)
            assert level is not None  # every rotation timed its compute
            shift = statistics.fmean(pooled[k]) - statistics.median(pooled[k])
            out[k] = dataclasses.replace(level, value=level.median + shift, statistic="median + run's mean-median")
    source = run if run is not None else rotations
    out.update(ddp_costs(source))
    out.update(fsdp_costs(rotations))  # levels of these rotations: they move with the machine's load
    samples = [r.get("interference") or {} for rot in source for r in rot]
    out["compute_slowdown_during_comm"] = spread([s.get("compute_slowdown") for s in samples])
    by_size = comm_slowdowns(source)
    if by_size:  # the single factor: the one at the largest size, as for big models' buckets
        out["comm_slowdown_during_compute"] = by_size[-1][1]
    return {k: v for k, v in out.items() if v is not None}


def comm_slowdowns(rotations: list[list[dict]]) -> list[tuple[int, Spread]]:
    """(bytes, how much slower an all-reduce of that size runs beside compute than alone): per
    rotation the slower rank's beside over its alone (a collective ends with its last rank). The
    value is the ratio of the sums over rotations, which a single odd rotation moves less than a
    median of few ratios; the spread is that of the per-rotation ratios."""
    # interference is sampled in some rotations only (probes/ranks/validation.py): the sizes come from
    # the first that has it
    first = next((r["interference"] for rot in rotations for r in rot if r.get("interference")), None)
    if not first:
        return []
    out = []
    for i, size in enumerate(first["bytes"]):
        beside, alone = [], []
        for rot in rotations:
            samples = [r["interference"] for r in rot if r.get("interference")]
            if samples:
                beside.append(max(s["allreduce_beside_s"][i] for s in samples))
                alone.append(max(s["allreduce_alone_s"][i] for s in samples))
        ratios = spread([b / a for b, a in zip(beside, alone)])
        if ratios is not None:
            out.append((size, dataclasses.replace(ratios, value=sum(beside) / sum(alone), statistic="ratio of sums")))
    return out


def allreduce_points(rotations: list[list[dict]]) -> list[tuple[int, Spread]]:
    """(bytes, time of one bucket's all-reduce alone) per bucket size: a collective ends when its
    last rank does, so each rotation counts at the maximum over ranks."""
    numel = rotations[0][0].get("bucket_numel") or []
    return [(4 * n, _timed(spread([max(r["allreduce_alone_s"][i] for r in rot) for rot in rotations])))
            for i, n in enumerate(numel)]


def step_parts(rotation: list[dict], mode: str, rank: int) -> dict[str, float]:
    """One rank's DDP step in the model's parts. compute: forward, and backward until the last
    rank has launched the micro-batch's last bucket (its last gradient is ready everywhere, so
    waiting for a slower rank counts as compute, as the model's slower-rank compute does);
    exposed communication: from there to backward's return (the all-reduce tail and the bucket
    copies); the optimizer; and the rest (zero_grad, and what no part covers). Ranks are lined
    up by the machine's monotonic clock."""
    step = rotation[rank]["modes"][mode]
    if "collectives" in (step["micro"] or [{}])[0]:
        return fsdp_step_parts(step)
    t0 = step["t0"]
    forward = sum(mb["forward"][1] - mb["forward"][0] for mb in step["micro"])
    backward = exposed = 0.0
    for j, mb in enumerate(step["micro"]):
        start, end = mb["backward"]
        launches = [r["modes"][mode]["t0"] + r["modes"][mode]["micro"][j]["buckets"][-1][2] - t0
                    for r in rotation if r["modes"][mode]["micro"][j]["buckets"]]
        last = min(max(launches), end) if launches else end
        backward += last - start
        exposed += end - last
    optimizer = step["optimizer"][1] - step["optimizer"][0]
    return {"compute": forward + backward, "exposed_comm": exposed, "optimizer": optimizer,
            "other": step["step_s"] - (forward + backward + exposed + optimizer)}


def fsdp_step_parts(step: dict) -> dict[str, float]:
    """One rank's FSDP step in the model's parts: compute is forward and backward less the time
    spent inside the collectives FSDP issued (on a blocking backend, gloo, the thread waits in
    each until it is done, so that time is the exposed communication); the optimizer; the rest.
    On a streamed backend (NCCL) a collective returns at launch and the waits fall in compute."""
    forward = sum(mb["forward"][1] - mb["forward"][0] for mb in step["micro"])
    backward = sum(mb["backward"][1] - mb["backward"][0] for mb in step["micro"])
    inside = sum(end - start for mb in step["micro"] for _, _, start, end in mb["collectives"])
    optimizer = step["optimizer"][1] - step["optimizer"][0]
    return {"compute": forward + backward - inside, "exposed_comm": inside, "optimizer": optimizer,
            "other": step["step_s"] - (forward + backward + optimizer)}


def measured_mode(rotations: list[list[dict]], mode: str) -> dict:
    """A mode's step (the slowest rank's, median over rotations) and the parts of the median
    rotation's step (so that they add up to a step that happened), with the share of it the
    named parts cover."""
    def slowest(rot):
        return max(range(len(rot)), key=lambda r: rot[r]["modes"][mode]["step_s"])

    steps = [rot[slowest(rot)]["modes"][mode]["step_s"] for rot in rotations]
    middle = sorted(range(len(steps)), key=steps.__getitem__)[(len(steps) - 1) // 2]
    parts = step_parts(rotations[middle], mode, slowest(rotations[middle]))
    return {"step": spread(steps), "steps": steps, "middle": middle, "parts": parts,
            "parts_cover_pct": 100.0 * (1 - parts["other"] / steps[middle])}
