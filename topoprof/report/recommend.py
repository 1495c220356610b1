"""What to do, with the numbers behind it: pure functions over a scan report's data.

Every recommendation carries the figures that justify it and, where it helps, a code snippet.
They are ordered by the predicted gain; the report shows the first three as "the three things
to do" and the rest below.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from topoprof.measure.cluster import ClusterNode, ClusterReport
from topoprof.model.comm import tcp
from topoprof.model.strategies.model_report import ModelReport, Skipped, made
from topoprof.model.strategies.results import StrategyResult
from topoprof.model.strategies.steps import lower_bounds
from topoprof.report.units import duration
from topoprof.specs.host_facts import HostInfo
from topoprof.topology.build import PairLink, Topology

# A strategy change is worth recommending when it saves at least this share of step time;
# smaller differences are inside the run-to-run noise of real training loops.
MIN_GAIN = 0.05

NO_SYNC_SNIPPET = """\
from contextlib import nullcontext
for i, batch in enumerate(loader):
    last = (i + 1) % accum == 0
    # no_sync() must cover forward AND backward: DDP arms its all-reduce in forward
    with (nullcontext() if last else model.no_sync()):
        loss = model(batch).loss / accum
        loss.backward()
    if last:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)"""

ACCELERATE_SNIPPET = """\
# Hugging Face Accelerate: Accelerator(gradient_accumulation_steps=accum)
for batch in loader:
    with accelerator.accumulate(model):   # skips the all-reduce on non-final micro-batches
        loss = model(batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()"""

DDP_SNIPPET = """\
# torchrun --nproc-per-node {n} train.py
import torch, torch.distributed as dist
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)
model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[local_rank])"""

FP16_HOOK_SNIPPET = """\
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
model.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)"""


@dataclass(frozen=True)
class Recommendation:
    key: str
    title: str
    why: str
    gain_pct: float | None = None          # predicted step-time saving, when it is one
    snippet: str | None = None
    numbers: dict = field(default_factory=dict)


def _step(pred: ModelReport, name: str) -> float | None:
    """A strategy's step time, or None where it does not apply or does not fit in memory (a
    strategy that does not fit is never recommended, nor ranked against)."""
    s = pred.fitting(name)
    return None if s is None else s.step_time_s


def _memory(s: StrategyResult) -> str:
    mem = s.memory
    if mem is None:
        return ""
    unknown = ", activations unknown" if mem.parts_gb.get("activations") is None else ""
    return f"{mem.total_gb:.1f} GB per GPU{unknown}"


def fit_recommendation(pred: ModelReport, label: str) -> Recommendation | None:
    """When DDP does not fit on these GPUs: the fastest strategy that does, with its memory."""
    ddp = pred.result("ddp_synced")
    if ddp is None or ddp.memory is None or ddp.memory.fits is not False:
        return None
    fitting = {n: s for n in pred.strategies if n != "single" and (s := pred.fitting(n)) is not None}
    if not fitting:
        return Recommendation("nothing_fits", f"Nothing fits on these GPUs ({label})",
                              f"{ddp.memory.reason}; no strategy predicted here holds less: shard more "
                              "widely, recompute activations, or use GPUs with more memory.")
    # a lower bound (DataParallel's, unless its overhead was given) is not recommended over the others
    unranked = lower_bounds(pred.value("dp_thread_overhead_s"))
    ranked = {n: s for n, s in fitting.items() if n not in unranked}
    if not ranked:
        return None
    name = min(ranked, key=lambda n: ranked[n].step_time_s)
    best = ranked[name]
    return Recommendation(
        "fits", f"Train with {name}: DDP does not fit ({label})",
        f"DDP {ddp.memory.reason}. {name} holds {_memory(best)} and takes "
        f"{duration(best.step_time_s)} per step, the fastest of the strategies that fit.",
        None, None, {"strategy": name, "step_time_s": best.step_time_s, "memory": best.memory})


def _saving(before: float | None, after: float | None) -> float | None:
    if not before or not after:
        return None
    return 100.0 * (before - after) / before


def strategy_recommendations(pred: ModelReport, label: str) -> list[Recommendation]:
    """DDP over DP, no_sync() for accumulation, fp16 compression, from one model's prediction."""
    out = []
    k = pred.value("accumulation_steps")
    synced, no_sync = _step(pred, "ddp_synced"), _step(pred, "ddp_no_sync")
    gain = _saving(synced, no_sync)
    if k > 1 and gain is not None and gain >= 100 * MIN_GAIN:
        assert synced is not None and no_sync is not None  # a saving is between two step times
        out.append(Recommendation(
            "no_sync", f"Accumulate with no_sync() around forward and backward ({label}, K={k})",
            f"Syncing every micro-batch costs {duration(synced)} per step; no_sync() on the first "
            f"{k - 1} micro-batches gives {duration(no_sync)} ({gain:.0f}% less). Wrapping only "
            "backward() in no_sync() saves nothing: DDP arms its all-reduce in forward.",
            gain, NO_SYNC_SNIPPET + "\n\n" + ACCELERATE_SNIPPET,
            {"ddp_synced_s": synced, "ddp_no_sync_s": no_sync, "accum": k}))
    dp = _step(pred, "dp")
    gain = _saving(dp, synced)
    if dp and gain is not None and gain > 0:
        assert synced is not None
        n = pred.value("world_size")
        out.append(Recommendation(
            "ddp_over_dp", f"Use DistributedDataParallel, not DataParallel ({label})",
            f"DataParallel re-broadcasts every parameter each forward and reduces all gradients onto "
            f"GPU 0 after backward: {duration(dp)} per step vs {duration(synced)} with DDP "
            f"({gain:.0f}% less), before DP's Python-thread (GIL) overhead, which is not in this figure.",
            gain, DDP_SNIPPET.format(n=n), {"dp_s": dp, "ddp_synced_s": synced}))
    fp16 = _step(pred, "ddp_fp16_compress")
    gain = _saving(synced, fp16)
    ddp = pred.result("ddp_synced")
    if gain is not None and gain >= 100 * MIN_GAIN and ddp is not None:
        assert fp16 is not None
        out.append(Recommendation(
            "fp16_compress", f"Compress gradients to fp16 for the all-reduce ({label})",
            f"Communication is exposed: {duration(ddp.comm_exposed_s)} "
            f"per step with DDP; halving the bytes gives {duration(fp16)} ({gain:.0f}% less).",
            gain, FP16_HOOK_SNIPPET, {"ddp_synced_s": synced, "ddp_fp16_compress_s": fp16}))
    out += knob_recommendations(pred, label)
    return out


def knob_recommendations(pred: ModelReport, label: str) -> list[Recommendation]:
    """DDP constructor options whose predicted gain, from the part of DDP's cost they act on,
    is worth a change (the fp16 hook has its own recommendation above)."""
    synced = _step(pred, "ddp_synced")
    out = []
    for o in pred.ddp_knobs:
        if o.knob.startswith("register_comm_hook") or o.gain_pct < 100 * MIN_GAIN:
            continue
        assert synced is not None  # DDP's options are priced on its synced step
        out.append(Recommendation(
            f"ddp_{o.knob.split('=')[0]}", f"DistributedDataParallel(..., {o.knob}) ({label})",
            f"It acts on {o.part} of what DDP adds to a synced micro-batch: {duration(synced)} per step "
            f"becomes {duration(o.step_time_s)} ({o.gain_pct:.0f}% less).",
            o.gain_pct, f"model = DistributedDataParallel(model, device_ids=[local_rank], {o.knob})",
            {"ddp_synced_s": synced, "after_s": o.step_time_s}))
    return out


def fewer_gpus_recommendation(pred: ModelReport, label: str) -> Recommendation | None:
    """For a fixed global batch: does using fewer GPUs with more accumulation lose little?"""
    fixed = pred.fixed_global_batch
    options = [o for o in (fixed.options if fixed is not None else ()) if o.samples_per_s_per_gpu]
    if fixed is None or len(options) < 2:
        return None
    full = max(options, key=lambda o: o.world_size)
    best = max(options, key=lambda o: o.samples_per_s_per_gpu or 0.0)
    if best.world_size == full.world_size or not (best.samples_per_s_per_gpu and full.samples_per_s_per_gpu):
        return None
    gain = 100.0 * (best.samples_per_s_per_gpu / full.samples_per_s_per_gpu - 1)
    if gain < 100 * MIN_GAIN:
        return None
    return Recommendation(
        "fewer_gpus", f"Per GPU, {best.world_size} GPU(s) with K={best.accumulation_steps} beat "
                      f"{full.world_size} ({label})",
        f"For the same global batch of {fixed.global_batch_samples} samples, {best.world_size} GPU(s) "
        f"reach {best.samples_per_s_per_gpu:.1f} samples/s per GPU vs {full.samples_per_s_per_gpu:.1f} "
        f"with {full.world_size}: the extra GPUs mostly wait on communication. Give them other work.",
        gain, None, {"options": options})


# `nvidia-smi topo -m` path kinds, best first: ties in bandwidth (e.g. two host-staged ranges)
# are broken by the better path.
PATH_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")


def _pair_score(pairs: dict[tuple[int, int], PairLink], group: tuple[int, ...]) -> tuple[float, int]:
    """(slowest link in GB/s, minus the worst path's rank): larger is better."""
    worst_bw, worst_path = float("inf"), 0
    for a, b in combinations(group, 2):
        p = pairs[(min(a, b), max(a, b))]
        bw = p.bandwidth_gbps or (p.bandwidth_range_gbps or (0.0,))[0]
        worst_bw = min(worst_bw, bw)
        rank = PATH_ORDER.index(p.path) if p.path in PATH_ORDER else len(PATH_ORDER)
        worst_path = max(worst_path, rank)
    return worst_bw, -worst_path


def gpu_choice_recommendations(topology: Topology) -> list[Recommendation]:
    """Which GPUs to give 2- and 4-GPU jobs: the fastest slowest-link, then one NUMA node."""
    gpus = [g for g in topology.gpus if not g.lost]
    pairs = {(p.gpu_a, p.gpu_b): p for p in topology.pairs}
    numa = {g.index: g.numa_node for g in gpus}
    out = []
    for size in (2, 4):
        if len(gpus) <= size:
            continue
        groups = list(combinations([g.index for g in gpus], size))
        scored = sorted(groups, key=lambda grp: (_pair_score(pairs, grp), -len({numa[i] for i in grp})),
                        reverse=True)
        best, worst = scored[0], scored[-1]
        if _pair_score(pairs, best) == _pair_score(pairs, worst):
            continue  # every choice is wired alike (e.g. all GPUs on one NVSwitch); NUMA is its own advice
        (best_bw, _), (worst_bw, _) = _pair_score(pairs, best), _pair_score(pairs, worst)
        kinds = sorted({pairs[(min(a, b), max(a, b))].path or "?" for a, b in combinations(best, 2)})
        worst_kinds = sorted({pairs[(min(a, b), max(a, b))].path or "?" for a, b in combinations(worst, 2)})
        nodes = sorted({str(numa[i]) for i in best})
        out.append(Recommendation(
            f"gpus_{size}", f"For {size}-GPU jobs use GPUs {','.join(map(str, best))}",
            f"Their slowest link is {best_bw:g} GB/s ({'/'.join(kinds)}), NUMA node(s) {', '.join(nodes)}; "
            f"the worst choice, {','.join(map(str, worst))} ({'/'.join(worst_kinds)}), would be held to "
            f"{worst_bw:g} GB/s{' (host-staged, uncertain until measured)' if worst_bw < 6.01 else ''}.",
            None, f"CUDA_VISIBLE_DEVICES={','.join(map(str, best))} torchrun --nproc-per-node {size} train.py",
            {"best": list(best), "best_gbps": best_bw, "worst": list(worst), "worst_gbps": worst_bw}))
    return out


def numa_recommendation(topology: Topology) -> Recommendation | None:
    nodes = {g.numa_node for g in topology.gpus if g.numa_node is not None}
    if len(nodes) < 2:
        return None
    lines = [f"GPU{g.index}: NUMA {g.numa_node}, CPUs {g.cpu_affinity[0]}-{g.cpu_affinity[-1]}"
             for g in topology.gpus if g.cpu_affinity]
    return Recommendation(
        "numa", "Bind each rank to its GPU's NUMA node",
        "GPUs hang off different CPU sockets/NUMA nodes; a rank that runs or allocates on the far node "
        "crosses the CPU interconnect for every host copy and data-loader batch. " + "; ".join(lines),
        None, "torchrun --nproc-per-node 8 --numa-binding node train.py   # torch >= 2.7\n"
              "# or per rank: numactl --cpunodebind=<node> --membind=<node> python train.py",
        {"numa_nodes": sorted(nodes)})


def environment_recommendations(topology: Topology, env: dict, nccl_overrides: dict) -> list[Recommendation]:
    out = []
    seen = {**{k: v for k, v in env.items() if k.startswith("NCCL_")}, **nccl_overrides}
    for var, meaning in (("NCCL_P2P_DISABLE", "GPU peer-to-peer is off: traffic goes through host memory"),
                         ("NCCL_IB_DISABLE", "InfiniBand/RoCE is off: inter-node traffic uses TCP sockets"),
                         ("NCCL_SHM_DISABLE", "shared memory transport is off")):
        if str(seen.get(var, "0")) not in ("0", ""):
            out.append(Recommendation(f"env_{var}", f"Unset {var} unless you need it",
                                      f"{var}={seen[var]}: {meaning}.", None, f"unset {var}", {var: seen[var]}))
    no_p2p = [p for p in topology.pairs if p.path in ("NV", "PIX", "PXB") and p.p2p == "no"]
    if no_p2p:
        names = ", ".join(f"{p.gpu_a}-{p.gpu_b}" for p in no_p2p[:6])
        out.append(Recommendation(
            "p2p_off", "GPU peer-to-peer is unavailable on pairs that should have it",
            f"Pairs {names} are wired for P2P ({no_p2p[0].path}) but P2P is off "
            f"({no_p2p[0].p2p_basis}): NCCL stages their traffic through host memory. Check the "
            "IOMMU/ACS settings in the BIOS and kernel (ACS redirects P2P through the root complex), "
            "and whether the GPUs are consumer parts with P2P disabled by the driver.",
            None, "nvidia-smi topo -p2p r", {"pairs": [[p.gpu_a, p.gpu_b] for p in no_p2p]}))
    for note in topology.notes:
        if "PCIe link runs x" in note:
            out.append(Recommendation("pcie_width", "A GPU's PCIe link is narrower than it can be", note,
                                      None, "nvidia-smi -q -d PCIE", {}))
    return out


def _host_of(node: ClusterNode) -> HostInfo | None:
    return node.topology.host if node.topology is not None else None


def _tcp_transport(backend: str, nodes: list[ClusterNode], env: dict) -> bool:
    """gloo always rides TCP; NCCL does when no node has an active RDMA port or IB is disabled."""
    if backend == "gloo":
        return True
    if str(env.get("NCCL_IB_DISABLE", "0")) not in ("0", ""):
        return True
    hosts = [h for h in map(_host_of, nodes) if h is not None]
    return not any(p.state == "ACTIVE" for h in hosts for p in h.ib_ports)


def slow_start_recommendation(cluster: ClusterReport | None, predictions: list[ModelReport | Skipped],
                              backend: str, env: dict) -> Recommendation | None:
    """A multi-node job (`cluster`) over TCP on nodes that restart slow start after idle, when the
    restarts the first of `predictions` would see cost at least MIN_GAIN of its step."""
    if cluster is None:
        return None
    inter = next(iter((cluster.levels.get("inter") or {}).values()), None)
    on = [n.host for n in cluster.nodes if (h := _host_of(n)) is not None and h.tcp_slow_start_after_idle == 1]
    if inter is None or not on or not predictions:
        return None
    if not _tcp_transport(backend, cluster.nodes, env):
        return None
    # The network's all-reduce latency bounds one round trip; its peak busbw is the link's rate.
    rtt_s = inter.fit.latency_us * 1e-6
    cost = tcp.restart_cost_s(inter.peak_busbw_gbps * 1e9, rtt_s)
    first = made(predictions[:1])
    if not first:
        return None
    c, k = first[0].value("micro_batch_time_s"), first[0].value("accumulation_steps")
    worst = None
    for mode, between, syncs in (("ddp_no_sync", k, 1), ("ddp_synced", 1, k)):
        step = _step(first[0], mode)
        if step:
            lost = tcp.restarts_per_step(c, between, syncs) * cost
            if worst is None or lost / step > worst[1] / worst[2]:
                worst = (mode, lost, step)
    if worst is None or worst[1] / worst[2] < MIN_GAIN:
        return None
    mode, lost, step = worst
    return Recommendation(
        "tcp_slow_start", "Keep TCP's congestion window across accumulation gaps",
        f"Inter-node traffic rides TCP and net.ipv4.tcp_slow_start_after_idle is 1 on {', '.join(on[:4])}: "
        f"after every gap longer than {tcp.MIN_RTO_S * 1e3:.0f} ms without traffic ({mode} waits "
        f"{duration(c * (k if mode == 'ddp_no_sync' else 1), 0)} of compute between all-reduces) TCP restarts "
        f"from {tcp.INITIAL_WINDOW_BYTES // 1024} KiB; at {inter.peak_busbw_gbps:.2f} GB/s and a round trip "
        f"of at most {rtt_s * 1e3:.2f} ms, regrowing the window costs up to {duration(lost)} per step "
        f"({100 * lost / step:.0f} % of {duration(step, 0)}).",
        100 * lost / step, "sysctl -w net.ipv4.tcp_slow_start_after_idle=0   # on every node, as root",
        {"nodes": on, "mode": mode, "lost_s": lost, "step_s": step, "rtt_bound_s": rtt_s})


def rank(recs: list[Recommendation]) -> list[Recommendation]:
    """What fits in memory first (nothing else matters until it does), then the largest predicted
    gain; problems and placement advice (no gain figure) after them."""
    return sorted(recs, key=lambda r: (r.key not in ("fits", "nothing_fits"), r.gain_pct is None,
                                       -(r.gain_pct or 0.0)))
