"""shared/gpu-facts' measurements (one JSON line each, written by its opbench.py) as a device
profile (`topoprof.model.compute.profile`), so that they can be read and cited as measured data until a
profile measured by `topoprof profile` on that GPU is committed.

What opbench measured maps onto the profile's sections:
- host: "torch.add of 64 floats, no grad" is a plain op; "torch.mul recorded by autograd" an
  autograd-recorded forward op. Its tiny-Linear lines (a forward + sum + backward, a forward
  under autocast) are calls of several ops: they bound two kinds it did not measure, given as
  ranges with their derivation (`derived_host_ranges`), and stay as notes;
- gemm: every line (bf16 and fp32), FLOP/s = its tflops x 1e12 (2 m n k over the median time);
- memory: bytes moved = the op's passes over its input's bytes, as opbench counts them when it
  prints gbps (copy 2, add 3, gelu 2, layer_norm 2, rms_norm 2, softmax 2, fp32 upcast 3);
- attention: SDPA forward + backward, FLOPs counted as the profile counts them (3.5 x the
  forward's 4 b h t^2 d, halved when causal: opbench's own rule).
It has no optimizer: absent, with a note.
opbench timed every op back to back with CUDA events: where the host issues an op slower than the
GPU runs it (about 6-8 us per op there), a small shape's rate is the host's, which a note says.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Iterable

from topoprof.errors import InputError
from topoprof.jsonio import dumps
from topoprof.specs.profile_schema import PROFILE_KIND, PROFILE_SCHEMA_VERSION, SDPA_CONVENTION

# opbench.py's memory(): (op name there, passes over the input's bytes, the profile's kind)
_MEMORY_PASSES = {"copy": (2, "copy"), "add": (3, "add"), "gelu": (2, "gelu"), "layer_norm": (2, "layer_norm"),
                  "rms_norm": (2, "rms_norm"), "softmax": (2, "softmax"), "fp32 upcast": (3, "upcast")}
_HOST_KINDS = {"torch.add of 64 floats, no grad": "op", "torch.mul recorded by autograd": "autograd_forward"}
_LINEAR_CALL = "tiny Linear forward+sum+backward (about 8 kernels)"
_AUTOCAST_CALL = "tiny Linear under bf16 autocast forward"
# What opbench's two calls run, counted by tracing them (a TorchDispatchMode over the calls, the
# autograd graph walked from the loss; torch 2.13 on a CPU: the ops and nodes, not their time),
# in the steady state its timing loop reaches (the gradients exist, so AccumulateGrad adds):
# - lin(x.view(1, 64)).sum().backward(): forward addmm and sum (and the views view, t); the
#   backward 5 nodes (SumBackward0, AddmmBackward0, TBackward0, 2 x AccumulateGrad) running 5
#   kernels (ones_like, mm, sum, 2 x add_);
# - lin(x.view(1, 64)) under bf16 autocast: 2 kernels (x's cast, addmm; the weight's and the
#   bias's casts cached by autocast after the first call) and the views view, t.
LINEAR_FORWARD_KERNELS, LINEAR_BACKWARD_NODES, LINEAR_BACKWARD_KERNELS = 2, 5, 5
AUTOCAST_KERNELS = 2
_DTYPE = "bfloat16"   # opbench's training dtype (BF = torch.bfloat16)


def _rows(lines: Iterable[str], source: str) -> list[dict]:
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{source}:{number}: not JSON: {err.msg}") from None
        if not isinstance(row, dict) or "kind" not in row:
            raise InputError(f"{source}:{number}: not an opbench line (no 'kind')")
        rows.append(row)
    if not any(r["kind"] == "machine" for r in rows):
        raise InputError(f"{source}: no 'machine' line: not shared/gpu-facts opbench output")
    return rows


def derived_host_ranges(calls: dict[str, float], host: dict[str, float]) -> tuple[dict, dict]:
    """(kind -> [low, high] seconds, kind -> how) for the host kinds opbench did not measure but
    its calls of several ops bound (`calls`: its tiny-Linear lines, seconds per call; `host`: the
    kinds it measured). The model prices a backward at nodes x (node - op) + kernels x op
    (`topoprof.model.compute.host_costs`), so the call's backward B gives a node's cost as
    (B - kernels x op) / nodes + op:
    - autograd_backward_node: B is the call less its forward; the forward costs at least its two
      kernels as autograd-recorded ops, so B and the node's cost are at most that (high: the
      backward call's own fixed cost, its graph task and the hand-off to the GPU's autograd
      thread, counted as if per node). A node costs at least the op it issues (low: the rest of
      the call then that fixed cost). One call of 5 nodes cannot tell the two apart;
    - autocast_op (a matmul under autocast with its input's cast): the autocast call is that,
      within nn.Linear's call and two views (high); its two kernels cost at least two
      autograd-recorded ops (low: autocast's own dispatch left out)."""
    ranges, how = {}, {}
    op, recorded = host.get("op"), host.get("autograd_forward")
    linear = calls.get(_LINEAR_CALL)
    if linear is not None and op is not None and recorded is not None:
        backward = linear - LINEAR_FORWARD_KERNELS * recorded
        high = (backward - LINEAR_BACKWARD_KERNELS * op) / LINEAR_BACKWARD_NODES + op
        if high >= op:
            ranges["autograd_backward_node"] = [op, high]
            how["autograd_backward_node"] = (
                f"derived: opbench's tiny Linear forward + sum + backward, {linear * 1e6:.4g} us per call, less its "
                f"forward's {LINEAR_FORWARD_KERNELS} kernels as recorded ops ({recorded * 1e6:.3g} us each), leaves "
                f"{backward * 1e6:.4g} us for {LINEAR_BACKWARD_NODES} backward nodes running {LINEAR_BACKWARD_KERNELS} "
                f"kernels: at most {high * 1e6:.3g} us per node if none of it is the backward call's fixed cost, at "
                f"least a plain op's {op * 1e6:.3g} us if the rest of it is")
    autocast = calls.get(_AUTOCAST_CALL)
    if autocast is not None and recorded is not None and autocast >= AUTOCAST_KERNELS * recorded:
        # (a call cheaper than its kernels as recorded ops bounds nothing: left to host_costs' fallback)
        low, high = AUTOCAST_KERNELS * recorded, autocast
        ranges["autocast_op"] = [low, high]
        how["autocast_op"] = (
            f"derived: opbench's tiny Linear under bf16 autocast, {autocast * 1e6:.4g} us per call of "
            f"{AUTOCAST_KERNELS} kernels (x's cast, addmm) within nn.Linear's call and two views: at most that; at "
            f"least its kernels as {AUTOCAST_KERNELS} autograd-recorded ops ({recorded * 1e6:.3g} us each)")
    return ranges, how


def profile_from_gpu_facts(jsonl_lines: Iterable[str], source: str = "shared/gpu-facts/h200-2026-11-26.jsonl",
                           citation: str | None = None, machine: dict | None = None) -> dict:
    """The device profile document (load it with `topoprof.model.compute.profile.profile_from_dict`);
    `citation` and `machine` (facts about the GPU beyond the JSON lines, such as the folder's
    README states) replace what the lines alone give."""
    rows = _rows(jsonl_lines, source)
    facts = next(r for r in rows if r["kind"] == "machine")
    dated = re.search(r"\d{4}-\d{2}-\d{2}", source)
    day = dated.group(0) if dated else None
    notes: list[str] = []
    host: dict[str, float] = {}
    how: dict[str, str] = {}
    calls: dict = {}
    for r in rows:
        if r["kind"] == "host" and r.get("what") in _HOST_KINDS:
            host[_HOST_KINDS[r["what"]]] = r["us_per_op"] * 1e-6
            how[_HOST_KINDS[r["what"]]] = f"{r['what']}, back to back ({source})"
        elif r["kind"] == "host":
            calls[r.get("what")] = r.get("us_per_call", r.get("us_per_op", 0.0)) * 1e-6
            notes.append(f"host: {r.get('what')}: {r.get('us_per_call', r.get('us_per_op'))} us per call "
                         "(several ops; no per-op kind)")
        elif r["kind"] == "error":
            notes.append(f"opbench part {r.get('part')} failed there: {r.get('error')}")
    ranges, derived_how = derived_host_ranges(calls, host)
    how.update(derived_how)
    notes += [
        "no backward per autograd node or autocast op measured in gpu-facts: each bounded from its calls of several "
        "ops (host_costs.ranges, with how); no optimizer host cost or optimizer rate: absent",
        ("timed back to back with CUDA events: where the host issues an op slower than the GPU runs it (6-8 us per "
         "op there), a small shape's rate is the host's issue rate, not the device's (e.g. 128x768x768 bf16)"),
    ]
    device = facts.get("device", "unknown GPU")
    extra = dict(machine or {})
    return {
        "schema_version": PROFILE_SCHEMA_VERSION, "kind": PROFILE_KIND,
        "tool": {"name": "opbench.py", "version": None}, "host": None, "created_utc": day,
        "source": f"converted from {source} (shared/gpu-facts/opbench.py output)",
        "citation": citation or f"measured on an {device}, torch {facts.get('torch')}, {day or 'date unknown'} "
                                f"({source})",
        "quick": bool(facts.get("quick", False)), "seconds": None, "dtype": _DTYPE,
        "machine": {"kind": "cuda", "device": device, "cuda": facts.get("cuda"), "torch": facts.get("torch"),
                    "created_utc": day, **extra,
                    "missing": {f: "not in gpu-facts' lines" for f in
                                ("sm_count", "memory_bytes", "driver", "python", "cpu_model", "threads", "hostname")
                                if f not in extra}},
        "conventions": {"gemm": "2 m n k FLOPs of a @ b (a: m x k) over the median time of 3 rounds (opbench)",
                        "memory": "bytes read + written per call over its time; passes: "
                                  + ", ".join(f"{k} {p}" for k, (p, _) in _MEMORY_PASSES.items()),
                        "sdpa": SDPA_CONVENTION,
                        "timing": "CUDA-event medians of 3 rounds after warm-up, ops issued back to back (opbench)"},
        "host_costs": {"seconds_per_op": host, "how": how, **({"ranges": ranges} if ranges else {})},
        "gemm": [{"m": r["m"], "n": r["n"], "k": r["k"], "dtype": r["dtype"], "seconds": r["ms"] / 1e3,
                  "flops_per_s": r["tflops"] * 1e12} for r in rows if r["kind"] == "gemm"],
        "memory": [{"kind": _MEMORY_PASSES[r["op"]][1], "dtype": _DTYPE, "tensor_bytes": r["bytes"],
                    "bytes_moved": _MEMORY_PASSES[r["op"]][0] * r["bytes"], "seconds": r["ms"] / 1e3,
                    "bytes_per_s": r["gbps"] * 1e9}
                   for r in rows if r["kind"] == "memory" and r["op"] in _MEMORY_PASSES],
        "sdpa": [{"seq": r["t"], "head_dim": r["d"], "causal": r["causal"], "batch": r["b"], "heads": r["h"],
                  "dtype": _DTYPE, "seconds": r["ms"] / 1e3, "flops_per_s": r["tflops"] * 1e12}
                 for r in rows if r["kind"] == "attention"],
        "optimizer": None, "cpu": None, "skipped": [], "notes": notes,
    }


# The conversions shipped in topoprof/model/compute/profiles/ (`topoprof.model.compute.profile_choice`):
# by the gpu-facts file's name, its citation and what the folder's README says of the machine
# beyond the JSON lines ("one NVIDIA H200 SXM (141 GB, 132 SMs, driver 580.159.04)").
SHIPPED: dict[str, dict[str, Any]] = {
    "h200-2026-11-26.jsonl": {
        "out": "nvidia-h200-sxm-gpu-facts-20261126.json",
        "citation": "measured on an NVIDIA H200 SXM, torch 2.11, 2026-11-26 (shared/gpu-facts)",
        "machine": {"sm_count": 132, "driver": "580.159.04"},
    },
}


def main(argv: list[str] | None = None) -> int:
    """python -m topoprof.model.compute.profile_facts GPU_FACTS.jsonl OUT_DIR: write the shipped
    conversion of that gpu-facts file (SHIPPED) into OUT_DIR."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m topoprof.model.compute.profile_facts GPU_FACTS.jsonl OUT_DIR", file=sys.stderr)
        return 2
    path, out_dir = args
    shipped = SHIPPED.get(os.path.basename(path))
    if shipped is None:
        print(f"{path}: not one of the shipped gpu-facts files ({', '.join(SHIPPED)})", file=sys.stderr)
        return 2
    with open(path) as f:
        doc = profile_from_gpu_facts(f.read().splitlines(), f"shared/gpu-facts/{os.path.basename(path)}",
                                     shipped["citation"], shipped["machine"])
    out = os.path.join(out_dir, shipped["out"])
    with open(out, "w") as f:
        f.write(dumps(doc) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
