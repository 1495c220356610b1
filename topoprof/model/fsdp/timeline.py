"""FSDP2 (`torch.distributed.fsdp.fully_shard`) step timelines: which parameters each FSDP group
holds, the collectives FSDP issues per micro-batch in the order it issues them, and a simulation
of the compute stream beside the communication streams. One entry point, `fsdp_micro_batch`, and
its step, `fsdp_step`; `topoprof.model.strategies` turns them into step times beside DDP's.

Every choice follows torch 2.13's `torch/distributed/fsdp/_fully_shard/` (cited per line below as
`file.py:line`):

Forward. A group's pre-forward hook all-gathers its parameters and the compute waits for them
(`_fsdp_param_group.py:540-555` `pre_forward`: `unshard` then `wait_for_unshard`); the first
all-gather (the root's) is therefore exposed. The all-gathers run on their own stream
(`_fsdp_param_group.py:87-89`), so the next group's runs beside this group's compute: implicit
prefetching, limited by the all-gather buffers: group j's all-gather waits for the copy-out of
group j-2 (`wait_for_unshard`, `_fsdp_param_group.py:429-432` and 476-485), i.e. until that
group's compute starts. `reshard_after_forward=True` frees the parameters after forward
(`_fsdp_param_group.py:498-509`); the root is never resharded after forward when left at its
default (`_fsdp_state.py:203-207`), as torch recommends (`_fully_shard.py:183-186`).

Backward. A group's pre-backward hook waits for its all-gather (issued again only if it was
resharded after forward) and prefetches the group run before it in forward
(`_fsdp_param_group.py:575-585` and `_backward_prefetch` 795-830: `post_forward_order[curr_index
- 1]`); the root's hook, first in backward, prefetches the last block. A checkpointed block's
backward begins with its recompute (torch/utils/checkpoint.py: the first saved tensor unpacked
runs the forward again), on the compute stream after that hook: after its all-gather, whose
parameters it reads. After a group's backward
its post-backward hook copies the gradients into the reduce-scatter buffer on the compute stream
(`_fsdp_collectives.py:603`), then reduce-scatters it on the reduce-scatter stream, which waits
for that copy (`_fsdp_collectives.py:607-624`); before that, the compute stream waits for the
previous group's reduce-scatter to release its buffer (`_fsdp_param_group.py:639-658`, one
buffer by default). The root's inputs (token ids) need no gradient, so its post-backward runs in
the final callback after all backward compute (`_fsdp_state.py:411-415`): the last reduce-scatter
is exposed, as backward ends waiting for every reduction (`finalize_backward`,
`_fsdp_param_group.py:763-766`; `_fsdp_state.py:418-431`). All-gathers and reduce-scatters use
the same process group unless `set_separate_reduce_scatter_group` gives the reduce-scatter its
own "so the two can overlap in backward" (`_fsdp_param_group.py:975-979`): by default they run
one at a time, in the order they were issued, on one channel.

HSDP. Shard inside a node, replicate across nodes: after each group's reduce-scatter, an
all-reduce of the reduced shard across the replicas, on a stream of its own "since collectives
use different network resources and can overlap" (`_fsdp_param_group.py:99-102`;
`_fsdp_collectives.py:634-672`).

No sync. `set_requires_gradient_sync(False)` sets `reduce_grads` (and `all_reduce_grads`) False
(`_fully_shard.py:413-435`), and `post_backward` then returns before any reduction
(`_fsdp_param_group.py:607-612`): no reduce-scatter or all-reduce until the last micro-batch.
Parameters are still resharded after backward (`reshard_after_backward`, default True,
`_fsdp_param_group.py:223`), so every micro-batch all-gathers again in forward.

FSDP's own work (`topoprof.model.fsdp.gpu_costs`). The all-gather's copy-in runs on the copy-in
stream, before the all-gather that waits for it; its copy-out and the reduce-scatter's chunk-cat
run on the compute stream; each group's hooks are host work, placed on the compute stream at the
hook (pre-forward, with its post-forward's reshard; the unshard in backward; post-backward) as
far as the device's time does not hide them. Where `validate` measured FSDP's own work per group
(`FsdpOverhead`), that stands in for the copies and the hooks.

Bytes. `MixedPrecisionPolicy` (`_fsdp_api.py:13-51`): the all-gather moves `param_dtype`
elements, the reduce-scatter `reduce_dtype` ones (the compute dtype when None).

Between micro-batches nothing overlaps: the root's pre-forward makes the all-gather streams wait
for everything before (`_fsdp_state.py:152-154`), and backward ends waiting for every reduction.
The optimizer steps the local shards only (`_fully_shard.py:110-111`; `_fsdp_api.py:31`: "The
optimizer step uses the sharded parameter"): T_opt / shard degree unless measured.

A blocking backend (gloo): every collective FSDP issues blocks the calling thread
(`torch/distributed/distributed_c10d.py` `all_gather_into_tensor`, `reduce_scatter_single`:
`work.wait()` when not `async_op`, and FSDP never passes `async_op` by default,
`_fsdp_param_group.py:244`), and on CPU the streams are the host thread: nothing overlaps.
And gloo has no reduce-scatter of its own: `ProcessGroupGloo::reduce_scatter_tensor_coalesced`
(torch/csrc/distributed/c10d/ProcessGroupGloo.cpp) clones the whole input, all-reduces it and
copies out this rank's chunk, so without a measured reduce-scatter curve one is priced as an
all-reduce of the whole buffer plus that clone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from topoprof.errors import InputError
from topoprof.model.comm.collectives import GB, CommModel
from topoprof.model.fsdp.gpu_costs import group_copies_s, hook_seconds
from topoprof.model.fsdp.plan import FsdpPlan
from topoprof.specs.fsdp_modes import FsdpMode

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class FsdpOverhead:
    """FSDP's own work on the compute stream (hooks, buffer copies, views, allocations), measured
    by `validate` through collectives that communicate nothing: per group per forward (its
    pre/post-forward and all-gather copy-in/out), per group per synced backward (its
    post-backward and reduce-scatter copy-in and views), per group per backward under no_sync,
    and per all-gather again in backward (a resharded group's unshard)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    backward_no_sync_s: float = 0.0
    unshard_s: float = 0.0


@dataclass(frozen=True)
class FsdpSetting:
    """What an FSDP timeline depends on besides the plan and the links."""

    forward_s: float                      # T_fwd per micro-batch
    backward_s: float                     # T_bwd per micro-batch
    param_bytes: int                      # all-gather element (MixedPrecisionPolicy.param_dtype)
    reduce_bytes: int                     # reduce-scatter element (reduce_dtype)
    memory_bandwidth_gbps: float | None   # FSDP's buffer copies when not measured; None: 0
    blocking: bool = False                # every collective blocks the issuing thread (gloo)
    reduce_scatter_as_allreduce: bool = False  # gloo: clone + all-reduce + copy a chunk
    overhead: FsdpOverhead | None = None  # measured per-group costs (replace the copies' estimate)
    compute_slowdown: float = 1.0         # compute runs 1/x as fast while a collective runs
    comm_slowdown: float = 1.0            # a collective runs 1/x as fast beside compute
    own_param_bytes: int | None = None    # the parameters' own element (the copy-in casts); None: param_bytes
    host_step_s: float = 0.0              # one step of FSDP's hooks on the host (fsdp.gpu_costs); 0: unpriced
    host_hidden_s: float | None = None    # host time the device hides per micro-batch; None: unknown, none
    # activation checkpointing's recompute per group (seconds, by group index; empty: none apart
    # from backward_s): each group's forward run again at the start of its backward
    recompute_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.compute_slowdown < 1 or self.comm_slowdown < 1:
            raise InputError(f"slowdowns must be >= 1, got compute {self.compute_slowdown}, "
                             f"communication {self.comm_slowdown}")


@dataclass(frozen=True)
class Collectives:
    """Seconds of each group's collectives running alone, and of FSDP's buffer copies around them
    at the memory bandwidth (`topoprof.model.fsdp.gpu_costs`; 0 where validate measured FSDP's own
    work, which holds them, or where the bandwidth is unknown)."""

    all_gather_s: tuple[float, ...]
    reduce_scatter_s: tuple[float, ...]
    all_reduce_s: tuple[float, ...] = ()  # HSDP's across replicas; empty for FSDP
    copy_in_s: tuple[float, ...] = ()     # the all-gather's copy-in, on its stream before it
    copy_out_s: tuple[float, ...] = ()    # the all-gather's copy-out, on the compute stream
    chunk_cat_s: tuple[float, ...] = ()   # the reduce-scatter's copy-in, on the compute stream


def collective_times(plan: FsdpPlan, setting: FsdpSetting, shard: CommModel,
                     replicate: CommModel | None = None) -> Collectives:
    """Each group's all-gather (param_bytes per element, S = the gathered buffer) and
    reduce-scatter (reduce_bytes, S = the buffer scattered) over the shard group, at the padded
    sizes FSDP allocates; with HSDP the all-reduce of the group's reduced bytes across replicas
    over `replicate`, whose bandwidth is what the shard ranks' concurrent all-reduces share (a
    node's NICs together)."""
    n = shard.world_size
    measured_rs = bool(getattr(shard, "curve", lambda _: ())("reduce_scatter"))
    ag, rs = [], []
    for g in plan.groups:
        numel = g.padded_numel(n)
        ag.append(shard.all_gather_s(numel * setting.param_bytes) if numel else 0.0)
        size = numel * setting.reduce_bytes
        if not numel:
            rs.append(0.0)
        elif setting.reduce_scatter_as_allreduce and not measured_rs:
            rs.append(shard.allreduce_s(size) + _memory_s(setting, 2 * size))  # + the clone
        else:
            rs.append(shard.reduce_scatter_s(size))
    ar = () if replicate is None else tuple(replicate.allreduce_s(g.padded_numel(n) * setting.reduce_bytes)
                                           if g.numel else 0.0 for g in plan.groups)
    if setting.overhead is not None:  # validate measured FSDP's own work: the copies are in it
        return Collectives(tuple(ag), tuple(rs), ar)
    return Collectives(tuple(ag), tuple(rs), ar, *group_copies_s(plan, n, setting.param_bytes, setting.reduce_bytes,
                                                                  setting.own_param_bytes,
                                                                 setting.memory_bandwidth_gbps))


def _memory_s(setting: FsdpSetting, traffic_bytes: float) -> float:
    if setting.memory_bandwidth_gbps is None:
        return 0.0
    return traffic_bytes / (setting.memory_bandwidth_gbps * GB)


@dataclass
class _Op:
    kind: str              # "all_gather", "reduce_scatter", "all_reduce"
    group: int
    channel: str           # "shard" (all-gathers and reduce-scatters share it) or "replicate"
    seconds: float
    gates: list[str] = field(default_factory=list)  # compute marks that must be reached first
    after: list[int] = field(default_factory=list)  # ops that must have ended first
    start: float | None = None
    end: float | None = None
    left: float = 0.0


def _op_time(op: _Op) -> OpTime:
    """A finished op's times (the timeline ends when every op has ended)."""
    assert op.start is not None and op.end is not None
    return OpTime(op.kind, op.group, op.start, op.end)


@dataclass(frozen=True)
class Work:
    seconds: float
    kind: str  # "compute" (the model's) or "fsdp" (FSDP's own work on the compute stream)
    part: str = ""  # FSDP's own: which (`fsdp_parts`)


@dataclass(frozen=True)
class Wait:
    ops: tuple[int, ...]


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class OpTime:
    kind: str
    group: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch, in seconds from its start."""

    wall_s: float
    forward_end_s: float
    compute_busy_s: float        # the compute stream working (the model's compute and FSDP's own)
    fsdp_work_s: float           # FSDP's own share of that, alone
    ops: tuple[OpTime, ...]
    fsdp_parts: dict[str, float] = field(default_factory=dict)  # fsdp_work_s by part, alone
    recomputes: tuple[OpTime, ...] = ()  # checkpointing's recompute per group ("recompute", group, start, end)

    @property
    def exposed_s(self) -> float:
        """What communication adds: the wall time the compute stream waits."""
        return self.wall_s - self.compute_busy_s


class _Builder:
    def __init__(self, blocking: bool):
        self.items: list = []
        self.ops: list[_Op] = []
        self.blocking = blocking
        self._marks = 0

    def mark(self) -> str:
        name = f"m{self._marks}"
        self._marks += 1
        self.items.append(Mark(name))
        return name

    def work(self, seconds: float, kind: str = "compute", part: str = "") -> None:
        if seconds > 0:
            self.items.append(Work(seconds, kind, part))

    def issue(self, op: _Op) -> int:
        """An op issued at this point of the compute stream's program. Blocking: it starts here
        and the thread waits for it. Otherwise only its gates and its channel's order hold it
        (the host runs ahead of the device, as CUDA lets it)."""
        self.ops.append(op)
        i = len(self.ops) - 1
        if self.blocking:
            op.gates.append(self.mark())
            self.items.append(Wait((i,)))
        return i

    def wait(self, *ops: int | None) -> None:
        wanted = tuple(i for i in ops if i is not None)
        if wanted:
            self.items.append(Wait(wanted))


def fsdp_micro_batch(plan: FsdpPlan, setting: FsdpSetting, coll: Collectives, mode: FsdpMode,
                     synced: bool) -> MicroBatch:
    """One micro-batch of `mode`: forward and backward with FSDP's collectives where and when it
    issues them (module docstring), reducing gradients if `synced`."""
    b = _Builder(setting.blocking)
    root = plan.root
    groups = plan.groups
    live = [g.numel > 0 for g in groups]
    over = setting.overhead
    resharded = [live[g] and mode.reshard_after_forward and g != root for g in range(len(groups))]
    hooks = hook_seconds(plan, resharded, synced, live, 0.0 if over is not None else setting.host_step_s,
                         setting.host_hidden_s)

    def copy_out_s(g: int) -> float:  # all-gather output split into the parameters (compute stream)
        return coll.copy_out_s[g] if coll.copy_out_s else 0.0

    def chunk_cat_s(g: int) -> float:  # gradients chunk-cat into the reduce-scatter input
        return coll.chunk_cat_s[g] if coll.chunk_cat_s else 0.0

    def ag_s(g: int) -> float:  # the all-gather, after its copy-in on the copy-in stream
        return coll.all_gather_s[g] + (coll.copy_in_s[g] if coll.copy_in_s else 0.0)

    def own(kind: str) -> float:
        if over is None:
            return 0.0
        return {"forward": over.forward_s, "backward": over.backward_s if synced else over.backward_no_sync_s}[kind]

    # forward
    order = plan.forward_order
    compute_start: dict[int, str] = {}
    ag: dict[int, int | None] = {}
    first_seg: dict[int, int] = {}
    for s, seg in enumerate(plan.segments):
        first_seg.setdefault(seg.group, s)

    def pre_forward(g: int, j: int) -> None:
        b.work(own("forward"), "fsdp", "measured")
        b.work(hooks[g]["forward"], "fsdp", "fsdp_hooks")  # its post-forward's reshard counted with it
        if live[g]:
            gates = [] if j < 2 or order[j - 2] not in compute_start else [compute_start[order[j - 2]]]
            ag[g] = b.issue(_Op("all_gather", g, "shard", ag_s(g), gates))
            b.wait(ag[g])
            b.work(copy_out_s(g), "fsdp", "all_gather_copy_out")
        compute_start[g] = b.mark()

    pre_forward(root, 0)
    for seg in plan.segments:
        g = seg.group
        if g not in compute_start:
            pre_forward(g, order.index(g))
        b.work(seg.forward_share * setting.forward_s)
    forward_end = b.mark()
    # backward: walk the segments in reverse
    post_order = plan.post_forward_order
    prefetched: dict[int, int] = {}
    last_copy_out = compute_start[order[-1]]  # the forward's last copy-out: the streams' last wait
    reductions: list[int] = []
    last_rs: int | None = None
    seen: set[int] = set()
    recomputes: dict = {}

    def prefetch(target: int, gate: str) -> None:
        if resharded[target] and target not in prefetched:
            prefetched[target] = b.issue(_Op("all_gather", target, "shard", ag_s(target), [gate]))

    def post_backward(g: int) -> None:
        nonlocal last_rs
        b.work(own("backward"), "fsdp", "measured")
        b.work(hooks[g]["backward"], "fsdp", "fsdp_hooks")
        if not synced or not live[g]:
            return
        b.wait(last_rs)  # the previous reduce-scatter's buffer released first
        b.work(chunk_cat_s(g), "fsdp", "reduce_scatter_copy_in")
        rs = b.issue(_Op("reduce_scatter", g, "shard", coll.reduce_scatter_s[g], [b.mark()]))
        reductions.append(rs)
        last_rs = rs
        if mode.hsdp and coll.all_reduce_s:
            reductions.append(b.issue(_Op("all_reduce", g, "replicate", coll.all_reduce_s[g], [], [rs])))

    # the root's pre-backward runs first: it prefetches the group whose forward ended last
    prefetch(post_order[-2], last_copy_out) if len(post_order) > 1 else None
    for s in range(len(plan.segments) - 1, -1, -1):
        seg = plan.segments[s]
        g = seg.group
        if g not in seen and g != root:  # this group's pre-backward
            seen.add(g)
            if resharded[g]:
                if g not in prefetched:
                    prefetched[g] = b.issue(_Op("all_gather", g, "shard", ag_s(g), [b.mark()]))
                b.wait(prefetched[g])
                b.work(copy_out_s(g), "fsdp", "all_gather_copy_out")
                b.work(over.unshard_s if over is not None else 0.0, "fsdp", "measured")
                b.work(hooks[g]["unshard"], "fsdp", "fsdp_hooks")
            gate = b.mark()
            i = post_order.index(g)
            if i > 0:
                prefetch(post_order[i - 1], gate)
            # checkpointing's recompute: the first thing the block's backward runs (its saved
            # tensors unpacked), after its pre-backward hook waited for its all-gather
            if g < len(setting.recompute_s) and setting.recompute_s[g] > 0:
                recomputes[g] = b.mark()
                b.work(setting.recompute_s[g])
                recomputes[g] = (recomputes[g], b.mark())
        b.work(seg.backward_share * setting.backward_s)
        if g != root and s == first_seg[g]:
            post_backward(g)
    post_backward(root)  # the final callback: the root's inputs need no gradient
    b.wait(*reductions)  # finalize_backward waits for every reduction
    return _simulate(b, setting, forward_end, recomputes)


def _simulate(b: _Builder, setting: FsdpSetting, forward_mark: str, recomputes: dict | None = None) -> MicroBatch:
    """Run the compute program beside the channels. While both run, compute progresses at
    1/compute_slowdown and collectives at 1/comm_slowdown of their speed alone."""
    items, ops = b.items, b.ops
    for op in ops:
        op.left = op.seconds
    reached: dict[str, float] = {}
    t, ci = 0.0, 0
    left = items[0].seconds if items and isinstance(items[0], Work) else 0.0
    busy = fsdp = 0.0
    parts: dict[str, float] = {}
    channels = sorted({op.channel for op in ops})
    eps = 1e-15

    def head(channel: str) -> _Op | None:
        for op in ops:
            if op.channel == channel and op.end is None:
                return op
        return None

    def ready(op: _Op) -> bool:
        return all(m in reached for m in op.gates) and all(ops[i].end is not None for i in op.after)

    for _ in range(100 * (len(items) + len(ops)) + 100):
        # instantaneous compute items: marks, satisfied waits
        while ci < len(items) and not isinstance(items[ci], Work):
            item = items[ci]
            if isinstance(item, Mark):
                reached[item.name] = t
            elif not all(ops[i].end is not None for i in item.ops):
                break
            ci += 1
            if ci < len(items) and isinstance(items[ci], Work):
                left = items[ci].seconds
        computing = ci < len(items) and isinstance(items[ci], Work)
        active = []
        for ch in channels:
            first = head(ch)
            if first is not None and ready(first):
                if first.start is None:
                    first.start = t
                active.append(first)
        if not computing and not active:
            if ci >= len(items) and all(op.end is not None for op in ops):
                break
            raise InputError("FSDP timeline: nothing can run (a wait on a collective that is never issued)")
        c_rate = 1 / setting.compute_slowdown if active else 1.0
        m_rate = 1 / setting.comm_slowdown if computing else 1.0
        steps = [op.left / m_rate for op in active]
        if computing:
            steps.append(left / c_rate)
        dt = min(steps)
        t += dt
        for op in active:
            op.left -= dt * m_rate
            if op.left <= eps:
                op.end = t
        if computing:
            busy += dt
            if items[ci].kind == "fsdp":
                fsdp += dt * c_rate
                parts[items[ci].part] = parts.get(items[ci].part, 0.0) + dt * c_rate
            left -= dt * c_rate
            if left <= eps:
                ci += 1
                if ci < len(items) and isinstance(items[ci], Work):
                    left = items[ci].seconds
    else:  # pragma: no cover - the loop ends when every item and op is done
        raise InputError("FSDP timeline did not finish")
    times = tuple(_op_time(op) for op in ops)
    spans = tuple(OpTime("recompute", g, reached[a], reached[z]) for g, (a, z) in sorted((recomputes or {}).items()))
    return MicroBatch(t, reached[forward_mark], busy, fsdp, times, parts, spans)


@dataclass(frozen=True)
class FsdpStep:
    """One optimizer step of k micro-batches, in the parts a timeline shows."""

    step_s: float
    compute_s: float        # the compute stream busy: the model's compute, FSDP's own work, slowdown
    exposed_comm_s: float   # the compute stream waiting for collectives
    optimizer_s: float
    micro_batches: tuple[MicroBatch, ...]


def fsdp_step(plan: FsdpPlan, setting: FsdpSetting, coll: Collectives, mode: FsdpMode, k: int,
              optimizer_s: float) -> FsdpStep:
    """k micro-batches (with no_sync, only the last reduces) then the optimizer on the shards.
    Micro-batches do not overlap each other (module docstring), so they add up."""
    synced = mode_synced(mode, k)
    sync = fsdp_micro_batch(plan, setting, coll, mode, True)
    quiet = fsdp_micro_batch(plan, setting, coll, mode, False) if synced < k else sync
    mbs = (quiet,) * (k - synced) + (sync,) * synced
    compute = sum(m.compute_busy_s for m in mbs)
    exposed = sum(m.exposed_s for m in mbs)
    return FsdpStep(compute + exposed + optimizer_s, compute, exposed, optimizer_s, mbs)


def mode_synced(mode: FsdpMode, k: int) -> int:
    """Micro-batches of a step that reduce gradients."""
    return 1 if mode.no_sync else k


def shard_degree(mode: FsdpMode, world_size: int, gpus_per_node: int) -> int:
    return gpus_per_node if mode.hsdp else world_size
