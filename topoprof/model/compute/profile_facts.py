"""shared/gpu-facts' measurements (one JSON line each, written by its opbench.py) as a device
profile (`topoprof.model.compute.profile`), so that they can be read and cited as measured data until a
profile measured by `topoprof profile` on that GPU is committed.

What opbench measured maps onto the profile's sections:
- host: "torch.add of 64 floats, no grad" is a plain op; "torch.mul recorded by autograd" an
  autograd-recorded forward op. Its tiny-Linear lines (a forward + backward of about 8 kernels,
  a forward under autocast) are calls of several ops, no per-op kind: kept as notes;
- gemm: every line (bf16 and fp32), FLOP/s = its tflops x 1e12 (2 m n k over the median time);
- memory: bytes moved = the op's passes over its input's bytes, as opbench counts them when it
  prints gbps (copy 2, add 3, gelu 2, layer_norm 2, rms_norm 2, softmax 2, fp32 upcast 3);
- attention: SDPA forward + backward, FLOPs counted as the profile counts them (3.5 x the
  forward's 4 b h t^2 d, halved when causal: opbench's own rule).
It has no backward per autograd node, no autocast op, no optimizer: those are absent, with a note.
opbench timed every op back to back with CUDA events: where the host issues an op slower than the
GPU runs it (about 6-8 us per op there), a small shape's rate is the host's, which a note says.
"""
from __future__ import annotations

import json
import re
from typing import Iterable

from topoprof.errors import InputError
from topoprof.model.compute.profile import PROFILE_KIND, PROFILE_SCHEMA_VERSION

# opbench.py's memory(): (op name there, passes over the input's bytes, the profile's kind)
_MEMORY_PASSES = {"copy": (2, "copy"), "add": (3, "add"), "gelu": (2, "gelu"), "layer_norm": (2, "layer_norm"),
                  "rms_norm": (2, "rms_norm"), "softmax": (2, "softmax"), "fp32 upcast": (3, "upcast")}
_HOST_KINDS = {"torch.add of 64 floats, no grad": "op", "torch.mul recorded by autograd": "autograd_forward"}
_DTYPE = "bfloat16"   # opbench's training dtype (BF = torch.bfloat16)
SDPA_CONVENTION = ("forward + backward FLOPs = 3.5 x the forward's 4 b h t^2 d (two matmuls forward, five backward), "
                   "halved when causal; over the time of one forward + backward (shared/gpu-facts/opbench.py)")


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


def profile_from_gpu_facts(jsonl_lines: Iterable[str], source: str = "shared/gpu-facts/h200-2026-11-26.jsonl") -> dict:
    """The device profile document (load it with `topoprof.model.compute.profile.profile_from_dict`)."""
    rows = _rows(jsonl_lines, source)
    machine = next(r for r in rows if r["kind"] == "machine")
    dated = re.search(r"\d{4}-\d{2}-\d{2}", source)
    day = dated.group(0) if dated else None
    notes, host, how = [], {}, {}
    for r in rows:
        if r["kind"] == "host" and r.get("what") in _HOST_KINDS:
            host[_HOST_KINDS[r["what"]]] = r["us_per_op"] * 1e-6
            how[_HOST_KINDS[r["what"]]] = f"{r['what']}, back to back ({source})"
        elif r["kind"] == "host":
            notes.append(f"host: {r.get('what')}: {r.get('us_per_call', r.get('us_per_op'))} us per call "
                         "(several ops; no per-op kind)")
        elif r["kind"] == "error":
            notes.append(f"opbench part {r.get('part')} failed there: {r.get('error')}")
    notes += [
        "no backward per autograd node, autocast op, optimizer host cost or optimizer rate in gpu-facts: absent",
        ("timed back to back with CUDA events: where the host issues an op slower than the GPU runs it (6-8 us per "
         "op there), a small shape's rate is the host's issue rate, not the device's (e.g. 128x768x768 bf16)"),
    ]
    device = machine.get("device", "unknown GPU")
    return {
        "schema_version": PROFILE_SCHEMA_VERSION, "kind": PROFILE_KIND,
        "tool": {"name": "opbench.py", "version": None}, "host": None, "created_utc": day,
        "source": f"converted from {source} (shared/gpu-facts/opbench.py output)",
        "citation": f"measured on an {device}, torch {machine.get('torch')}, {day or 'date unknown'} ({source})",
        "quick": bool(machine.get("quick", False)), "seconds": None, "dtype": _DTYPE,
        "machine": {"kind": "cuda", "device": device, "cuda": machine.get("cuda"), "torch": machine.get("torch"),
                    "created_utc": day,
                    "missing": {f: "not in gpu-facts' lines" for f in
                                ("sm_count", "memory_bytes", "driver", "python", "cpu_model", "threads", "hostname")}},
        "conventions": {"gemm": "2 m n k FLOPs of a @ b (a: m x k) over the median time of 3 rounds (opbench)",
                        "memory": "bytes read + written per call over its time; passes: "
                                  + ", ".join(f"{k} {p}" for k, (p, _) in _MEMORY_PASSES.items()),
                        "sdpa": SDPA_CONVENTION,
                        "timing": "CUDA-event medians of 3 rounds after warm-up, ops issued back to back (opbench)"},
        "host_costs": {"seconds_per_op": host, "how": how},
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
