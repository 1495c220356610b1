"""The host's time per op of an op trace, by its kind, from a device profile's host costs
(`topoprof.model.compute.profile.HOST_KINDS`), each a range (low, high) with its basis. No torch.

Eager PyTorch (each op from Python through the dispatcher, autograd and autocast):
- a forward op that launches a kernel: `autograd_forward` (one op recorded by autograd); a
  convolution `conv_forward` where the profile has it (a CPU's convolution library per call);
- under autocast (a 16-bit GPU trace), an op autocast runs in 16-bit (matmul, convolution,
  attention) and the cast of its input together cost `autocast_op`; the trace records the casts
  as ops (`_to_copy`), each an autograd-recorded op, so the wrapped op itself costs
  autocast_op - autograd_forward, and the casts beyond its one (a weight's first use in the
  step, autocast's cache being per region) cost theirs on top;
- the backward: the autograd engine runs every node of the graph (`autograd_nodes`, the trace
  counts them: views' backward and AccumulateGrad included, whether or not they launch a
  kernel) and each kernel its nodes launch is a plain op (`op`: the backward runs with grad
  mode off). Activation checkpointing's recompute, in the backward, is priced as the forward ops
  it repeats (`op_kinds.runs_as_forward`). The profile's `autograd_backward_node` is a node that launches one kernel, so
  a node's own cost is autograd_backward_node - op and the backward's host time is
  nodes x (node - op) + kernels x op, spread evenly over its kernels for the queue's timing;
  a convolution's backward `conv_backward` where the profile has it (a node with its kernels);
- views launch no kernel and cost nothing here (their dispatch is small beside a kernel's).
- selective op activation checkpointing (`op` mode, `topoprof/zoo/checkpoint_wrap.py`) runs every
  op of a checkpointed block's forward and of its recompute through its policy's Python modes
  (the trace marks them `selective`): each such op costs (ratio - 1) x a recorded op more, the
  ratio being the time per op under those modes over a plain autograd-recorded op's: from the
  profile where it measured both (`selective_checkpoint_op` over `autograd_forward`), else as
  measured on this machine beside the trace (`topoprof/trace/selective_cost.py`). An op the
  recompute takes from the forward's cache (a kept matmul) passes the mode without a kernel and
  is not in the trace: its lookup is not priced.
Under torch.compile (`topoprof.model.compute.fusion`): a launch per kernel of the compiled graphs
and per graph one call: forward one autograd-recorded call (the compiled graph runs as one
autograd.Function), backward one node, plus the AccumulateGrad node of each parameter
(`autograd_leaves`), a node's own cost each.
A kind the profile lacks falls back to the next of its family, and to the cited eager range
(`roofline.EAGER_HOST_COST_S`) where none is there, which the basis says.
"""
from __future__ import annotations

from dataclasses import dataclass

from topoprof.model.compute import op_kinds
from topoprof.model.compute.roofline_terms import COMPILED_HOST_COST_S, EAGER_HOST_COST_S, Span
from topoprof.specs.traced_pass import TracedOp, TracedPass

# the profile's host kind of an autograd-recorded op under selective op checkpointing's modes
SELECTIVE_KIND = "selective_checkpoint_op"

# for a kind the profile lacks, the kinds that stand in for it, in order
FALLBACK = {"op": ("autograd_forward",), "autograd_forward": ("op",), "autograd_backward_node": (),
            "autocast_op": (), "conv_forward": (), "conv_backward": ()}


@dataclass(frozen=True)
class HostCosts:
    """Seconds of host time per op by kind (Span: low, high, basis)."""

    kinds: dict[str, Span]
    compiled_kernel: Span = COMPILED_HOST_COST_S

    def get(self, kind: str) -> Span | None:
        return self.kinds.get(kind)

    def lines(self) -> list[str]:
        return [f"host {kind.replace('_', ' ')} {span.text(1e6, ' us')}: {span.basis}"
                for kind, span in self.kinds.items()]


def host_costs_from(profile) -> HostCosts:
    """The profile's host kinds as ranges (`DeviceProfile.host_range`), with the fallbacks (module
    docstring) where it lacks one."""
    kinds: dict[str, Span] = {}
    for kind in ("op", "autograd_forward", "autograd_backward_node", "autocast_op", "conv_forward", "conv_backward",
                 "optimizer_per_tensor", SELECTIVE_KIND):
        got = profile.host_range(kind)
        if got is not None:
            kinds[kind] = Span(got[0], got[1], got[2])
    for kind in ("op", "autograd_forward", "autograd_backward_node"):
        if kind in kinds:
            continue
        stand_in = next((k for k in FALLBACK[kind] if k in kinds), None)
        kinds[kind] = (Span(kinds[stand_in].low, kinds[stand_in].high, f"not in the profile: as its {stand_in}")
                       if stand_in else Span(EAGER_HOST_COST_S.low, EAGER_HOST_COST_S.high,
                                             f"not in the profile: the cited eager range, {EAGER_HOST_COST_S.basis}"))
    if "autocast_op" not in kinds:
        recorded = kinds["autograd_forward"]
        kinds["autocast_op"] = Span(2 * recorded.low, 2 * recorded.high,
                                    "not in the profile: its two kernels as two autograd-recorded ops")
    return HostCosts(kinds)


@dataclass(frozen=True)
class SelectiveCost:
    """Selective op checkpointing's host cost per op it sees, as a multiple of a recorded op's."""

    ratio: float
    basis: str

    def line(self) -> str:
        return f"selective op AC: x{self.ratio:.3g} host cost per op its modes see, {self.basis}"

    def extra_s(self, recorded_op_s: float) -> float:
        """What the modes add to one op, over a recorded op of `recorded_op_s` seconds."""
        return (self.ratio - 1) * recorded_op_s


def selective_cost(trace: TracedPass, costs: HostCosts | None) -> SelectiveCost | None:
    """The ratio for the trace's `selective` ops (module docstring); None where it has none, or
    where neither the profile nor the trace's worker measured it."""
    if not any(op.selective for op in trace.ops):
        return None
    sac, recorded = (costs.get(SELECTIVE_KIND), costs.get("autograd_forward")) if costs else (None, None)
    if sac is not None and recorded is not None:
        return SelectiveCost(sac.at("middle", False) / recorded.at("middle", False),
                             f"the profile's: {sac.basis}, over its recorded op")
    here = trace.selective_checkpoint
    if here is None:
        return None
    return SelectiveCost(here.ratio, here.how)


def _at(span: Span, end: str) -> float:
    return span.at(end, fast_is_high=False)


def _node_overhead(costs: HostCosts, end: str) -> float:
    """A backward node's own cost beyond the kernel it launches, at `end`: node - op, each at the
    same end (both low, both high, or both middles)."""
    return max(0.0, _at(costs.kinds["autograd_backward_node"], end) - _at(costs.kinds["op"], end))


def eager_host_seconds(trace: TracedPass, costs: HostCosts, end: str) -> list[float]:
    """The host's seconds for each op of the trace, eager (module docstring)."""
    ops = trace.ops
    backward_kernels = sum(1 for op in ops if not op.view and not op_kinds.runs_as_forward(op))
    nodes = trace.autograd_nodes if trace.autograd_nodes is not None else backward_kernels
    overhead = _node_overhead(costs, end)
    spread = nodes * overhead / backward_kernels if backward_kernels else 0.0
    k = costs.kinds
    selective = selective_cost(trace, costs)
    extra = selective.extra_s(_at(k["autograd_forward"], end)) if selective is not None else 0.0
    out = []
    for op in ops:
        if op.view:
            out.append(0.0)
            continue
        out.append(_eager_op(op, trace, k, end, overhead, spread) + (extra if op.selective else 0.0))
    return out


def _eager_op(op: TracedOp, trace: TracedPass, k: dict, end: str, overhead: float, spread: float) -> float:
    """One non-view op's host seconds, eager (module docstring)."""
    conv = op_kinds.is_conv(op)
    if op_kinds.runs_as_forward(op):
        if conv and "conv_forward" in k:
            h = _at(k["conv_forward"], end)
        elif op_kinds.autocast_wrapped(op, trace):
            h = max(0.0, _at(k["autocast_op"], end) - _at(k["autograd_forward"], end))
        else:
            h = _at(k["autograd_forward"], end)
    elif conv and "conv_backward" in k:
        h = max(_at(k["op"], end), _at(k["conv_backward"], end) - overhead) + spread
    else:
        h = _at(k["op"], end) + spread
    return h


def compiled_host_seconds(trace: TracedPass, costs: HostCosts, end: str) -> list[float]:
    """The host's seconds for each kernel of a fused trace (`fusion.fuse`): a launch each, and the
    graph's call on the first kernel of each phase (module docstring)."""
    out, started = [], set()
    leaves = trace.autograd_leaves or 0
    k = costs.kinds
    for op in trace.ops:
        if op.view:
            out.append(0.0)
            continue
        h = _at(costs.compiled_kernel, end)
        if op.phase not in started:
            started.add(op.phase)
            h += (_at(k["autograd_forward"], end) if op.phase == "forward" else
                  _at(k["autograd_backward_node"], end) + leaves * _node_overhead(costs, end))
        out.append(h)
    return out


def datasheet_host_costs(per_op: Span) -> HostCosts:
    """The datasheet path's one cited range for every kind (`roofline.gpu_device`): a node's own
    cost then none beyond its kernel's."""
    return HostCosts({"op": per_op, "autograd_forward": per_op, "autograd_backward_node": per_op,
                      "autocast_op": Span(2 * per_op.low, 2 * per_op.high, per_op.basis)})

