"""Hand-made device profiles (`topoprof.model.compute.profile`'s JSON format) for the tests: every
rate chosen, so that what a trace is priced at can be worked out by hand."""
from __future__ import annotations

from topoprof.model.compute.modelled import ModelledCompute, ModelledDetail
from topoprof.model.compute.profile import profile_from_dict
from topoprof.specs.profile_schema import PROFILE_SCHEMA_VERSION


def profile_doc(device="NVIDIA H100 80GB HBM3", kind="cuda", dtype="bfloat16", gemm=(), memory=(), sdpa=(),
                host=None, ranges=None, sm_count=None,
                source="measured by `topoprof profile` (probes/device_profile/profile_worker.py)",
                created="2026-11-20T00:00:00Z", quick=False, cpu=None) -> dict:
    """gemm: [((m, n, k), FLOP/s)]; memory: [((kind, bytes moved), B/s)]; sdpa: [((seq, head dim,
    causal), FLOP/s)]; host: {kind: seconds}; ranges: {kind: [low, high]}."""
    return {
        "schema_version": PROFILE_SCHEMA_VERSION, "kind": "device_profile", "source": source,
        "citation": f"hand-made {device}", "dtype": dtype, "quick": quick,
        "machine": {"kind": kind, "device": device, "sm_count": sm_count, "created_utc": created, "missing": {}},
        "conventions": {},
        "host_costs": {"seconds_per_op": host or {}, "how": {k: "given" for k in {**(host or {}), **(ranges or {})}},
                       **({"ranges": ranges} if ranges else {})},
        "gemm": [{"m": m, "n": n, "k": k, "dtype": dtype, "seconds": 2 * m * n * k / r, "flops_per_s": r}
                 for (m, n, k), r in gemm],
        "memory": [{"kind": kd, "dtype": dtype, "tensor_bytes": b, "bytes_moved": b, "seconds": b / r,
                    "bytes_per_s": r} for (kd, b), r in memory],
        "sdpa": [{"seq": t, "head_dim": d, "causal": c, "batch": 1, "heads": 8, "dtype": dtype, "seconds": 1.0,
                  "flops_per_s": r} for (t, d, c), r in sdpa],
        "optimizer": None, "cpu": cpu,
    }


def power(m, n, k):
    """A GEMM rate that is a power law of the shape (exact under log-space interpolation)."""
    return 1e14 * (m / 1024) ** 0.5 * (n / 768) ** 0.3 * (k / 768) ** 0.2


GRID = [((m, n, k), power(m, n, k)) for m in (1024, 4096, 16384) for n in (768, 3072) for k in (768, 3072)]
MEMORY = [(("add", 1 << 20), 4e11), (("add", 1 << 26), 3.2e12), (("gelu", 1 << 20), 3e11), (("gelu", 1 << 26), 2.5e12)]
SDPA = [((1024, 64, True), 1.5e14), ((1024, 64, False), 2.5e14), ((4096, 64, True), 4e14), ((4096, 64, False), 5e14)]
HOST = {"op": 5e-6, "autograd_forward": 8e-6, "autograd_backward_node": 20e-6, "autocast_op": 30e-6}


def h100_profile(**changes):
    """A full-grid bf16 profile of an H100 SXM (the datasheet's 132 SMs)."""
    return profile_from_dict(profile_doc(**{"gemm": GRID, "memory": MEMORY, "sdpa": SDPA, "host": HOST, **changes}),
                             "hand-made")


def modelled_detail(**known) -> ModelledDetail:
    """What pricing a model's ops found (`Compute.modelled_detail`), as much of it as a test
    states; placeholders for the rest, which no prediction reads."""
    return ModelledDetail(**{"seconds": (0.01, 0.02, 0.03), "device": "test", "shape": "test", "summary": "",
                             "basis": (), **known})


def modelled(seconds: tuple[float, float, float] = (0.01, 0.02, 0.03), backward_fraction: float | None = None,
             basis: str = "", **known) -> ModelledCompute:
    """A `Compute`'s modelled compute at `seconds`, with as much of its detail as a test states."""
    return ModelledCompute(seconds, basis, backward_fraction, modelled_detail(seconds=seconds, **known))
