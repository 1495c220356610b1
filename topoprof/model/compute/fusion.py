"""An op trace as torch.compile runs it: chains of memory-bound ops fused into one kernel each,
one memory pass over what enters and leaves the chain. No torch here.

How Inductor fuses (torch/_inductor/scheduler.py, `Scheduler._can_fuse`, and
torch/_inductor/codegen/simd.py, `SIMDScheduling.can_fuse`, read in torch 2.13):
- an extern kernel (cuBLAS's mm/addmm/bmm, a convolution, a fused attention: `ExternKernelSchedulerNode`)
  fuses with nothing ("node1 is extern but not a triton kernel", "node2 is extern or nop"); the
  matmuls stay cuBLAS calls unless max-autotune picks a Triton template, which this does not assume;
- two pointwise nodes fuse when their iteration sizes agree (`numel1 == numel2 and rnumel1 ==
  rnumel2`), a reduction with pointwise nodes around it where its sizes allow, two reductions
  of the same sizes; a producer and its consumer fuse vertically, nodes that share reads
  horizontally;
- the fused kernel reads its inputs and writes the buffers used outside it; what one node hands
  to the next inside it stays in registers.
So a run of memory-bound ops between two extern kernels (of one phase: the forward and the
backward are two graphs) is one chain. Its pass reads each storage the chain reads but did not
write first, once, and writes each storage it writes that is read after the chain, or never
read again in the step (a parameter's gradient, the optimizer's), or that existed before it
(an in-place update): from the trace's storage keys (`reads`, `writes`). A trace without them
counts the chain's first op's reads and its last op's writes.

The range: at the fast end every chain is one kernel (Inductor's loop reindexing lets a
reduction and the pointwise ops around it share one loop, config.loop_reindexing_after_fusion);
at the middle and the slow end a chain is cut after each reducing op (a norm, a softmax, a sum,
the loss), where the iteration sizes change. The partitioner's choice to recompute rather than
save a forward value (AOTAutograd's min-cut) is not modelled: the forward writes what the
backward reads.
"""
from __future__ import annotations

from dataclasses import replace

from topoprof.model.compute import op_kinds
from topoprof.specs.traced_pass import TracedOp, TracedPass


def fusible(op: TracedOp) -> bool:
    """A memory-bound op (no GEMM, convolution, attention or any other op with FLOPs: those are
    extern kernels)."""
    return not op.view and not op.flops and op_kinds.gemm_products(op) is None \
        and op_kinds.attention(op) is None


def _chains(ops: list[TracedOp]) -> list[tuple[str, list[int]]]:
    """The kernel-launching ops in order, as ("extern", [i]) or ("chain", [i, j, ...])."""
    out: list[tuple[str, list[int]]] = []
    for i, op in enumerate(ops):
        if op.view:
            continue
        if fusible(op):
            last = out[-1] if out else None
            if last is not None and last[0] == "chain" and ops[last[1][-1]].phase == op.phase:
                last[1].append(i)
                continue
            out.append(("chain", [i]))
        else:
            out.append(("extern", [i]))
    return out


def _cut(ops: list[TracedOp], chain: list[int]) -> list[list[int]]:
    """The chain cut after each reducing op."""
    parts, current = [], []
    for i in chain:
        current.append(i)
        if op_kinds.reduces(ops[i]):
            parts.append(current)
            current = []
    return parts + ([current] if current else [])


def _uses(ops: list[TracedOp]) -> tuple[dict[int, int], dict[int, int]]:
    """Per storage key: the index of the op that made it (its first touch a write; storages that
    existed before the step, read first, have none), and of its last read."""
    seen, born, last_read = set(), {}, {}
    for i, op in enumerate(ops):
        for key, _ in op.reads or ():
            seen.add(key)
            last_read[key] = i
        for key, _ in op.writes or ():
            if key not in seen:
                seen.add(key)
                born[key] = i
    return born, last_read


def _pass(ops: list[TracedOp], part: list[int], born: dict[int, int], last_read: dict[int, int]) -> TracedOp:
    """One fused kernel for the ops `part` (consecutive in the trace)."""
    members = [ops[i] for i in part]
    lo, hi = part[0], part[-1]
    if not all(op.reads is not None and op.writes is not None for op in members):
        read, written = members[0].bytes_read, members[-1].bytes_written
        outputs = list(members[-1].outputs if members[-1].outputs is not None else [written])
    else:
        reads: dict[int, int] = {}
        writes: dict[int, int] = {}
        made_here = {key for op in members for key, _ in op.writes or () if lo <= born.get(key, -1) <= hi}
        for op in members:
            for key, nbytes in op.reads or ():
                if key not in made_here:
                    reads[key] = max(reads.get(key, 0), nbytes)
            for key, nbytes in op.writes or ():
                writes[key] = max(writes.get(key, 0), nbytes)
        # written out: what existed before (updated in place), what is read after the chain, and
        # what nothing in the step reads again (a gradient, for the optimizer)
        kept = {key: b for key, b in writes.items()
                if key not in made_here or key not in last_read or last_read[key] > hi}
        read, written, outputs = sum(reads.values()), sum(kept.values()), list(kept.values())
    return TracedOp("fused(" + ", ".join(op_kinds.base_name(op) for op in members) + ")", members[0].phase,
                    flops=0, view=False, bytes_read=read, bytes_written=written, outputs=outputs,
                    fused_kinds=sorted({op_kinds.memory_kind(op) for op in members}), fused_ops=len(members))


def fuse(trace: TracedPass, end: str) -> TracedPass:
    """The trace with every chain of memory-bound ops replaced by its fused kernel(s) (module
    docstring: one per chain at the fast end, cut after reductions at the middle and slow end).
    The rest of the trace is kept."""
    ops = trace.ops
    born, last_read = _uses(ops)
    out = []
    for what, idx in _chains(ops):
        if what == "extern":
            out.append(ops[idx[0]])
            continue
        for part in ([idx] if end == "fast" else _cut(ops, idx)):
            out.append(_pass(ops, part, born, last_read))
    return replace(trace, ops=out)
