"""FSDP2 (`torch.distributed.fsdp.fully_shard`) in `validate`'s rank worker: the modes the model
predicts (topoprof.model.fsdp), each step with its timeline, what the model needs measured, and
the numerics.

Wrapping: `fully_shard` on each block of the model, then on the root (`_fully_shard.py`: "called
bottom-up"), the root with torch's default `reshard_after_forward` (not resharded after forward).
`fsdp_full_shard*` wraps the blocks with `reshard_after_forward=True`, `fsdp_shard_grad_op*`
with False; the `_no_sync` modes call `set_requires_gradient_sync(False)` for all micro-batches but
the last. One FSDP copy of the model per wrapping, each with its own optimizer, built once per
run from the same seed as the model the calibration trains.

Every collective FSDP issues goes through this module's `AllGather` / `ReduceScatter`
(`FSDPModule.set_custom_all_gather` / `set_custom_reduce_scatter`): the same call torch's default
makes (`_fsdp_collectives.py` DefaultAllGather, DefaultReduceScatter), timed at launch and return
(on gloo the call blocks until the collective is done). With the clock's `local` set they
communicate nothing: the all-gather fills every rank's slot with this rank's shard, the
reduce-scatter keeps this rank's chunk. Through them the calibration measures what FSDP itself
costs on the compute path (its hooks, copies, views and allocations), nothing communicated, as
DDP's is measured through a comm hook that communicates nothing.
"""
from __future__ import annotations

import dataclasses
import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from topoprof.probes.ranks import training
from topoprof.specs.fsdp_modes import FSDP_ONE_NODE, MODES

# torch 2.13 renamed all_gather_into_tensor and reduce_scatter_tensor to all_gather_single and
# reduce_scatter_single, keeping the old names as aliases (distributed_c10d.py); FSDP's modes run
# from torch 2.9 (topoprof.measure.torch_support), and 2.9 to 2.12 have only the old names
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)

# The wrappings the modes need: reshard_after_forward of the blocks.
WRAPPINGS = {"full_shard": True, "shard_grad_op": False}


def wrapping_of(mode: str) -> str:
    return "full_shard" if MODES[mode].reshard_after_forward else "shard_grad_op"


@dataclasses.dataclass
class CommClock:
    """Each collective FSDP issued: (kind, elements of the whole buffer, launched, returned).
    With `local` set FSDP's buffers are not communicated: each collective is replaced by one of a
    single element (`token`), so that the ranks still block, wait for each other and wake at the
    same points as in a step, but no buffer moves."""

    rank: int
    world_size: int
    events: list = dataclasses.field(default_factory=list)
    local: bool = False
    token: torch.Tensor | None = None

    def stand_in(self) -> None:
        if self.token is None:
            # on the device the process group reduces (NCCL takes no CPU tensor)
            self.token = torch.zeros(1, device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(self.token)


class TimedAllGather(AllGather):
    def __init__(self, clock: CommClock):
        self.clock = clock

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        start = time.perf_counter()
        work = None
        if self.clock.local:
            # the buffer not communicated: every slot holds this rank's shard (real values, not garbage)
            slots = output_tensor.view(self.clock.world_size, -1)
            for i in range(self.clock.world_size):
                if i != self.clock.rank:
                    slots[i].copy_(slots[self.clock.rank])
            self.clock.stand_in()
        else:
            work = _all_gather(output_tensor, input_tensor, group=group, async_op=async_op)
        self.clock.events.append(("all_gather", output_tensor.numel(), start, time.perf_counter()))
        return work


class TimedReduceScatter(ReduceScatter):
    def __init__(self, clock: CommClock):
        self.clock = clock

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        start = time.perf_counter()
        work = None
        if self.clock.local:
            output_tensor.copy_(input_tensor.view(self.clock.world_size, -1)[self.clock.rank])
            self.clock.stand_in()
        else:
            work = _reduce_scatter(output=output_tensor, input=input_tensor, group=group, op=op,
                                   async_op=async_op)
        self.clock.events.append(("reduce_scatter", input_tensor.numel(), start, time.perf_counter()))
        return work


def mesh_for(device: str, world_size: int):
    return init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world_size,))


def wrap(model, mesh, reshard_after_forward: bool, clock: CommClock | None = None):
    """`fully_shard` on each block, then the root (torch's default for it), and the timed comms."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)
    if clock is not None:
        ag, rs = TimedAllGather(clock), TimedReduceScatter(clock)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_all_gather(ag)
                module.set_custom_reduce_scatter(rs)
    return model


def quiet() -> None:
    """The synthetic model returns its loss as a view (shape (1,), for DataParallel), which FSDP
    warns about for in-place use; nothing here modifies it in place."""
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


def step(model, optimizer, batches, no_sync: bool, clock: CommClock, sync, loss_of) -> dict:
    """One optimizer step of an FSDP mode with its timeline (seconds from the step's start `t0`):
    zero_grad; per micro-batch forward, backward and every collective, launched and returned;
    the optimizer."""
    accum = len(batches)

    def micro_batch(j: int, tokens, t0: float) -> dict:
        model.set_requires_gradient_sync(not no_sync or j == accum - 1)
        clock.events.clear()
        spans = training.forward_backward(lambda: loss_of(model, tokens) / accum, sync, t0)
        return {**spans, "collectives": [[kind, n, a - t0, b - t0] for kind, n, a, b in clock.events]}

    try:
        return training.timed_step(optimizer, batches, sync, micro_batch)
    finally:
        model.set_requires_gradient_sync(True)


def _timed_pass(model, tokens, sync, loss_of, accum: int, clock: CommClock) -> list[float]:
    """[forward, backward, of which in the stand-in collectives in forward, in backward, how many
    collectives in forward, in backward]."""
    clock.events.clear()
    sync()
    t0 = time.perf_counter()
    spans = training.forward_backward(lambda: loss_of(model, tokens) / accum, sync, t0)
    (start, mid), (_, stop) = spans["forward"], spans["backward"]
    forward = [end - begin for _, _, begin, end in clock.events if end <= t0 + mid]
    backward = [end - begin for _, _, begin, end in clock.events if end > t0 + mid]
    return [mid - start, stop - mid, sum(forward), sum(backward), len(forward), len(backward)]


def calibration(copies: dict, tokens, accum: int, clock: CommClock, sync, loss_of) -> dict:
    """Each wrapping with its buffers not communicated (`CommClock.local`): one micro-batch under
    no_sync, then one synced (reducing what the first accumulated, as a no_sync step's last
    micro-batch does), then the optimizer on the shards. Per wrapping: [forward, backward, time
    inside the stand-in collectives in forward, in backward] of each pass, and the optimizer."""
    out = {}
    clock.local = True
    try:
        for name, (model, optimizer) in copies.items():
            optimizer.zero_grad(set_to_none=True)
            model.set_requires_gradient_sync(False)
            no_sync = _timed_pass(model, tokens, sync, loss_of, accum, clock)
            model.set_requires_gradient_sync(True)
            synced = _timed_pass(model, tokens, sync, loss_of, accum, clock)
            t0 = time.perf_counter()
            optimizer.step()
            sync()
            out[name] = {"no_sync": no_sync, "sync": synced, "optimizer_s": time.perf_counter() - t0}
            optimizer.zero_grad(set_to_none=True)
    finally:
        clock.local = False
        clock.events.clear()
    return out


def padded_numel(module, world_size: int) -> int:
    """What FSDP's collectives move for `module`'s own group, in elements: each parameter's dim 0
    padded to a multiple of the shard count (`_fsdp_common.py` `_get_dim0_padded_size`)."""
    return sum(-(-p.shape[0] // world_size) * world_size * (p.numel() // max(1, p.shape[0]))
               for p in module.parameters())


def _hold(seconds: float, source, target) -> None:
    """This rank's core busy for `seconds` the way FSDP's own work keeps it: copying a group's
    buffer (its all-gather copy-in and copy-out, its reduce-scatter copy-in), over and over."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        target.copy_(source)


def shadow_pass(model, tokens, accum: int, loss_of, reshard: bool, world_size: int, device: str,
                synchronize, hold: tuple[float, float] = (0.0, 0.0)) -> dict:
    """The plain model's forward and backward of one synced micro-batch with FSDP's collectives
    issued where FSDP issues them, of the sizes FSDP gives them, but nothing of FSDP itself: an
    all-gather before the root's forward and each block's, again before each block's backward
    (`reshard`), a reduce-scatter after each block's backward and the root's after all of it.
    Before each, this rank holds its core for `hold` (forward, backward) seconds, FSDP's own work
    per collective as this rank's calibration just measured it, copying a buffer of the group's
    size as that work mostly does: the stretches between the collectives are as long as a
    step's, and leave the caches as a step's do. What the collectives cost there, on a blocking
    backend, is what a step pays: the transfer, the wait for the other ranks' compute, the
    wake-ups; measured just before each step, in the state the step meets. Returns the compute
    (the pass less its collectives) and each collective's time:
    {"compute_s": s, "events": [[kind, numel, seconds], ...]}."""
    blocks = list(model.blocks)
    root_numel = padded_numel(model, world_size) - sum(padded_numel(b, world_size) for b in blocks)
    events: list = []
    phase = {"backward": False}

    scratch: dict[int, tuple] = {}

    def collective(kind: str, numel: int) -> None:
        if numel not in scratch:
            scratch[numel] = (torch.zeros(numel, device=device), torch.zeros(numel, device=device))
        _hold(hold[1] if phase["backward"] else hold[0], *scratch[numel])
        whole = torch.empty(numel, dtype=torch.float32, device=device)  # fresh, as FSDP allocates
        part = torch.empty(numel // world_size, dtype=torch.float32, device=device)
        t0 = time.perf_counter()
        if kind == "all_gather":
            _all_gather(whole, part.fill_(0.0))
        else:
            _reduce_scatter(output=part, input=whole.fill_(0.0), op=dist.ReduceOp.AVG)
        synchronize(device)
        events.append([kind, numel, time.perf_counter() - t0])

    handles = [model.register_forward_pre_hook(lambda m, a: collective("all_gather", root_numel))]
    for block in blocks:
        numel = padded_numel(block, world_size)
        handles.append(block.register_forward_pre_hook(lambda m, a, n=numel: collective("all_gather", n)))
        if reshard:
            handles.append(block.register_full_backward_pre_hook(lambda m, g, n=numel: collective("all_gather", n)))
        handles.append(block.register_full_backward_hook(lambda m, gi, go, n=numel: collective("reduce_scatter", n)))
    try:
        model.zero_grad(set_to_none=True)
        synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        loss = loss_of(model, tokens) / accum
        phase["backward"] = True
        loss.backward()
        collective("reduce_scatter", root_numel)
        synchronize(device)
        wall = time.perf_counter() - t0
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return {"compute_s": wall - sum(e[2] for e in events), "events": events}


def own_work(plain_forward: float, plain_backward: float, passes: dict, wrapping: str) -> tuple[float, float]:
    """FSDP's own work per collective on this rank, (forward, backward), from its calibration: the
    wrapping's synced stand-in pass less the time in its collectives, less the plain pass of the
    same micro-batch, over the collectives of each half of the pass."""
    forward, backward, inside_forward, inside_backward, n_forward, n_backward = passes[wrapping]["sync"]
    return (max(0.0, forward - inside_forward - plain_forward) / max(1, n_forward),
            max(0.0, backward - inside_backward - plain_backward) / max(1, n_backward))


def build_copies(build, modes, mesh, clock: CommClock, make_optimizer) -> dict:
    """One FSDP copy (and optimizer) per wrapping. Both are built whatever the modes: their
    calibration passes differ only by the all-gathers of backward, which is how FSDP's own work
    there is told apart from the rest of its backward."""
    copies = {}
    for name in WRAPPINGS:
        model = wrap(build(), mesh, WRAPPINGS[name], clock)
        copies[name] = (model, make_optimizer(model))
    return copies


def numerics(build, modes, batches, accum: int, mesh, make_optimizer, flat_params) -> dict:
    """One optimizer step of each mode on `batches` (this rank's), loss / accum per micro-batch:
    the full parameters afterwards (every rank gathers them; FSDP averages over ranks)."""
    out = {}
    for mode in modes:
        model = wrap(build(), mesh, MODES[mode].reshard_after_forward)
        optimizer = make_optimizer(model)
        optimizer.zero_grad(set_to_none=True)
        for j, tokens in enumerate(batches):
            model.set_requires_gradient_sync(not MODES[mode].no_sync or j == len(batches) - 1)
            (model(tokens).mean() / accum).backward()
        optimizer.step()
        out[mode] = flat_params(model)
    return out


def full_params(model) -> torch.Tensor:
    """Every parameter in full, flattened in registration order (a collective: all ranks call it)."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1).cpu()
                      for p in model.parameters()])


SUPPORTED = FSDP_ONE_NODE
