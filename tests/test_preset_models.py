"""The presets as torch modules: the same tensors, in the same order, as the layouts the model
predicts with (built on the meta device: no memory, no time), and a one-block CPU run that
trains every parameter."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probes.preset_models import PRESET_MODULES, build  # noqa: E402
from topoprof.model.workload.presets import get_preset


@pytest.mark.parametrize("preset", sorted(PRESET_MODULES))
def test_module_has_the_layouts_tensors_in_order(preset):
    with torch.device("meta"):
        module, _, _ = build(preset, micro_batch=1, seq_len=8)
    ours = [(name, tuple(p.shape)) for name, p in module.named_parameters()]
    layout = [(t.name, t.shape) for t in get_preset(preset).tensors]
    assert ours == layout


# llama-7b's 4096-wide embedding and head alone take half a minute on two cores: its blocks are
# checked by the meta-device test above and its training on a GPU (tests/test_gpu.py)
@pytest.mark.parametrize("preset", ["bert-base", "gpt2"])
def test_one_block_trains_on_cpu(preset):
    from topoprof.measure.user_model import measure_user_model

    record = measure_user_model("probes.preset_models:build", "cpu", 1,
                                kwargs={"preset": preset, "micro_batch": 1, "seq_len": 16, "n_layer": 1})
    assert record["passes"][0]["backward_s"] > 0
    trainable = [p for p in record["params"] if p["requires_grad"]]
    assert len({i for i, _ in record["ready"]}) == len(trainable)   # every parameter got its gradient
