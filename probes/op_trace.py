"""One forward and backward of a model on the meta device, op by op: what each aten op computes
and moves, and the backward FLOPs done before each trainable gradient is ready.

Meta tensors carry shapes and dtypes but no data, so the pass costs no compute and no memory,
whatever the model's size and wherever it runs: its result does not depend on the machine. The
same pass gives

- every aten op the dispatcher runs, in order, with its phase ("forward": the forward and the
  loss; "backward"), its FLOPs by the rules of `torch.utils.flop_counter` and the bytes it reads
  (its input tensors' sizes) and writes (its outputs' sizes): the op trace a roofline compute
  model reads;
- the gradient-ready order by FLOPs: a post-accumulate-grad hook per trainable parameter (where
  DDP's reducer hook fires, see `probes/user_model.py`) records the backward FLOPs counted so
  far; that over the backward's total is the share of backward done when the gradient is ready,
  in the format of the timed record's "ready".

FLOPs are counted as `FlopCounterMode` counts them (torch/utils/flop_counter.py,
`_FlopCounterMode.__torch_dispatch__`): an op first tries `func.decompose` (a CompositeImplicit
op becomes the ops it is made of, each counted), else it runs and its overload packet's formula
in `flop_registry` gives its FLOPs (matmuls, convolutions, attention); ops without a formula
count 0, as there.

Bytes: views and aliases (`OpOverload.is_view`: the schema returns an alias of an input and
writes none, torch/_ops.py; and `_unsafe_view`, a view the schema does not mark) stay in the
trace with 0 bytes, since they move no data; `empty*` allocations write nothing. Read bytes
count each tensor argument's numel x element size: an expanded (stride-0) input counts at its
expanded size, an upper bound on what the kernel fetches. The trace runs in each tensor's own
dtype: autocast has no meta backend, so a bf16 run's bytes are not what this counts.

The user's model is built under `torch.device("meta")` at the stated micro-batch and sequence
length when its callable takes `micro_batch` / `seq_len` (as `probes/preset_models.py:build`
does), else with its example batch as it is. Anything that cannot run on meta (an op without a
meta kernel, `.item()` or a data-dependent shape) gives a `failure` reason instead of raising:
the caller then keeps the measured order and says why.
"""
from __future__ import annotations

import inspect

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

# What a user's callable may take to build its model and batch at the stated shape.
SHAPE_KWARGS = ("micro_batch", "seq_len")

# A view the schema does not annotate as one (native_functions.yaml: `_unsafe_view(Tensor self,
# SymInt[] size) -> Tensor`); matmul reshapes its result with it, without a copy.
_UNMARKED_VIEWS = frozenset({aten._unsafe_view.default})
# Allocations whose contents are left undefined: nothing is written.
_UNINITIALIZED = frozenset({aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                            aten.new_empty.default, aten.new_empty_strided.default})


def _nbytes(values) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(values) if isinstance(t, torch.Tensor))


class OpTracer(TorchDispatchMode):
    """Records each aten op with its phase, FLOPs and bytes; `phase` is set by the caller."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "forward"
        self.ops: list[dict] = []
        self.flops = {"forward": 0, "backward": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # As FlopCounterMode does: decompose what can be, so that its parts are what is counted.
        if func is not torch.ops.prim.device.default:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        view = func.is_view or func in _UNMARKED_VIEWS
        self.ops.append({"name": str(func), "phase": self.phase, "flops": flops, "view": view,
                         "bytes_read": 0 if view else _nbytes((args, kwargs)),
                         "bytes_written": 0 if view or func in _UNINITIALIZED else _nbytes(out)})
        self.flops[self.phase] += flops
        return out


def trace_pass(module, batch, loss_fn, params: list) -> dict:
    """One forward and backward of `module` under the tracer; `params` is the parameter list
    whose indices "ready" uses (`list(module.parameters())`, DDP's order)."""
    from probes.user_model import user_loss

    tracer = OpTracer()
    ready: list[tuple[int, int]] = []
    handles = [p.register_post_accumulate_grad_hook(
        lambda _p, i=i: ready.append((i, tracer.flops["backward"]))) for i, p in enumerate(params)
        if p.requires_grad]
    try:
        with tracer:
            loss = user_loss(module, batch, loss_fn)
            tracer.phase = "backward"
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    total = tracer.flops["backward"]
    return {"ops": tracer.ops, "by_name": aggregate(tracer.ops), "totals": totals(tracer.ops),
            "ready_flops": [[i, f] for i, f in ready],
            "ready": [[i, f / total] for i, f in ready] if total > 0 else []}


def aggregate(ops: list[dict]) -> list[dict]:
    """The ops summed by name and phase, the most FLOPs first (then the most bytes)."""
    rows: dict[tuple[str, str], dict] = {}
    for op in ops:
        row = rows.setdefault((op["name"], op["phase"]), {"name": op["name"], "phase": op["phase"], "count": 0,
                                                          "flops": 0, "bytes_read": 0, "bytes_written": 0})
        row["count"] += 1
        for key in ("flops", "bytes_read", "bytes_written"):
            row[key] += op[key]
    return sorted(rows.values(), key=lambda r: (-r["flops"], -(r["bytes_read"] + r["bytes_written"]), r["name"]))


def totals(ops: list[dict]) -> dict:
    out = {phase: {"ops": 0, "flops": 0, "bytes_read": 0, "bytes_written": 0} for phase in ("forward", "backward")}
    for op in ops:
        row = out[op["phase"]]
        row["ops"] += 1
        for key in ("flops", "bytes_read", "bytes_written"):
            row[key] += op[key]
    return out


def shape_kwargs(build, stated: dict | None) -> dict:
    """The stated shape (`micro_batch`, `seq_len`) that the user's callable takes by name."""
    try:
        accepted = inspect.signature(build).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return {}
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: v for k, v in (stated or {}).items()
            if k in SHAPE_KWARGS and v is not None and k in accepted and accepted[k].kind in named}


def describe_batch(batch) -> str:
    """'4x32' for a tensor; '(4x3x224x224, 4)' for a tuple; 'input_ids 4x128, labels 4x128' for a dict."""
    if isinstance(batch, torch.Tensor):
        return "x".join(str(n) for n in batch.shape) or "scalar"
    if isinstance(batch, dict):
        return ", ".join(f"{k} {describe_batch(v)}" for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return "(" + ", ".join(describe_batch(v) for v in batch) + ")"
    return type(batch).__name__


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def trace_user_model(spec: str, stated: dict | None = None, kwargs: dict | None = None) -> dict:
    """The op trace of the user's `--model` callable on meta, or {"failure": reason}. `stated`:
    the shape the prediction is for, given to the callable where it takes it; `kwargs`: passed
    as they are (a preset's name, as `measure` takes them)."""
    from probes.user_model import call_user_callable, load_callable, parameter_list, to_device

    try:
        shape = shape_kwargs(load_callable(spec), stated)
        with torch.device("meta"):
            module, batch, loss_fn = call_user_callable(spec, {**(kwargs or {}), **shape})
            module, batch = module.to("meta"), to_device(batch, "meta")
            params = list(module.parameters())
            traced = trace_pass(module, batch, loss_fn, params)
    except Exception as err:  # noqa: BLE001 - the measured order stands in, with this reason
        return {"failure": f"on meta, {_first_line(err)}"}
    if not traced["ready"]:
        return {"failure": "FlopCounterMode's rules count no backward FLOPs here (no matmul, convolution "
                           "or attention to weigh the gradients by)"}
    described = describe_batch(batch) + (f" ({', '.join(f'{k}={v}' for k, v in shape.items())})" if shape else "")
    return {"device": "meta", "spec": spec, "shape": described, "kwargs": shape,
            "params": parameter_list(module), **traced}
