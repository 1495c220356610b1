"""The pass on the meta device (`probes/op_trace.py`): FLOPs as FlopCounterMode counts them, bytes
per op, and the backward FLOPs done before each gradient is ready, indexed as DDP's parameter
list is; a model that cannot run on meta gives a reason, never an exception."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from probes.op_trace import shape_kwargs, trace_pass, trace_user_model  # noqa: E402
from probes.user_model import call_user_callable, parameter_list  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "user_models")
TIED = os.path.join(FIXTURES, "tied.py")
META = os.path.join(FIXTURES, "meta.py")

BATCH, WIDTHS = 5, (8, 16, 12, 4)  # an MLP 8 -> 16 -> 12 -> 4 on 5 samples


def _mlp_trace():
    with torch.device("meta"):
        layers = [torch.nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:])]
        mlp = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
        x = torch.randn(BATCH, WIDTHS[0])
    return trace_pass(mlp, x, None, list(mlp.parameters()))


def test_ready_fractions_are_the_backward_matmul_flops_done():
    # Each Linear's backward is two matmuls of 2 x in x out x batch FLOPs (weight and input
    # gradients), but the first layer's input needs no gradient; the loss (a mean) and the
    # biases' sums count none. Layers finish in reverse; weight and bias (indices 2k, 2k + 1)
    # become ready together.
    mm = [2 * BATCH * a * b for a, b in zip(WIDTHS, WIDTHS[1:])]
    done_3 = 2 * mm[2]
    done_2 = done_3 + 2 * mm[1]
    done_1 = done_2 + mm[0]
    traced = _mlp_trace()
    assert dict(traced["ready_flops"]) == {4: done_3, 5: done_3, 2: done_2, 3: done_2, 0: done_1, 1: done_1}
    assert dict(traced["ready"]) == pytest.approx({4: done_3 / done_1, 5: done_3 / done_1, 2: done_2 / done_1,
                                                   3: done_2 / done_1, 0: 1.0, 1: 1.0})
    fractions = [f for _, f in traced["ready"]]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert traced["totals"]["backward"]["flops"] == done_1
    assert traced["totals"]["forward"]["flops"] == sum(mm)


def test_one_ops_bytes_and_views_moving_none():
    first = next(op for op in _mlp_trace()["ops"] if op["name"] == "aten.addmm.default")
    # addmm(bias, x, weight.t()): reads the bias, the input and the (transposed) weight in fp32
    assert first["phase"] == "forward" and first["flops"] == 2 * BATCH * WIDTHS[0] * WIDTHS[1]
    assert first["bytes_read"] == 4 * (WIDTHS[1] + BATCH * WIDTHS[0] + WIDTHS[0] * WIDTHS[1])
    assert first["bytes_written"] == 4 * BATCH * WIDTHS[1]
    views = [op for op in _mlp_trace()["ops"] if op["name"] == "aten.t.default"]
    assert views and all(op["view"] and op["bytes_read"] == op["bytes_written"] == 0 for op in views)


def test_the_ops_add_up_to_the_totals_and_the_aggregate():
    traced = _mlp_trace()
    for phase in ("forward", "backward"):
        ops = [op for op in traced["ops"] if op["phase"] == phase]
        rows = [r for r in traced["by_name"] if r["phase"] == phase]
        for key in ("flops", "bytes_read", "bytes_written"):
            assert sum(op[key] for op in ops) == traced["totals"][phase][key] == sum(r[key] for r in rows)
        assert len(ops) == traced["totals"][phase]["ops"] == sum(r["count"] for r in rows)


def test_flops_equal_flop_counter_modes_own_count():
    from torch.utils.flop_counter import FlopCounterMode

    from probes.user_model import user_loss

    kwargs = {"preset": "gpt2", "n_layer": 1}
    traced = trace_user_model("probes.preset_models:build", {"micro_batch": 2, "seq_len": 16}, kwargs)
    with torch.device("meta"):
        module, batch, loss_fn = call_user_callable("probes.preset_models:build",
                                                    {**kwargs, "micro_batch": 2, "seq_len": 16})
        with FlopCounterMode(display=False) as counter:
            user_loss(module, batch, loss_fn).backward()
    assert traced["totals"]["forward"]["flops"] + traced["totals"]["backward"]["flops"] == counter.get_total_flops()
    assert traced["shape"] == "2x16 (micro_batch=2, seq_len=16)"


def test_tied_and_frozen_parameters_are_indexed_as_ddp_lists_them():
    traced = trace_user_model(f"{TIED}:build")
    assert "failure" not in traced
    assert traced["params"] == parameter_list(call_user_callable(f"{TIED}:build")[0])
    trainable = {i for i, p in enumerate(traced["params"]) if p["requires_grad"]}
    assert sorted(i for i, _ in traced["ready"]) == sorted(trainable)  # each once, no frozen one
    head = [p["name"] for p in traced["params"]].index("head.weight")
    assert traced["ready"][-1] == [head, 1.0]  # the tied weight's last use is the embedding, first in forward


def test_the_stated_shape_reaches_a_callable_that_takes_it():
    assert trace_user_model(f"{META}:sized", {"micro_batch": 3, "seq_len": 7})["shape"] == "3x7 (micro_batch=3, seq_len=7)"
    assert trace_user_model(f"{TIED}:build", {"micro_batch": 3, "seq_len": 7})["shape"] == "4x32"  # as it is
    stated = {"micro_batch": 3, "seq_len": None, "other": 1}
    assert shape_kwargs(lambda micro_batch=1, seq_len=2: None, stated) == {"micro_batch": 3}
    assert shape_kwargs(lambda **anything: None, stated) == {}  # only parameters named so


@pytest.mark.parametrize("name, says", [
    ("reads_a_value", "on meta, RuntimeError: Tensor.item() cannot be called on meta tensors"),
    ("no_matmul", "count no backward FLOPs"),
    ("raises", "on meta, UserModelError"),
])
def test_what_cannot_be_traced_gives_a_reason(name, says):
    spec = f"{TIED if name == 'raises' else META}:{name}"
    traced = trace_user_model(spec)
    assert set(traced) == {"failure"} and says in traced["failure"]
