"""The synthetic model as a torch module: what `topoprof.workload.synthetic.SyntheticSpec` describes
(MLP blocks, no attention), as `validate`'s ranks train it and the trace counts it."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from topoprof.workload.synthetic import SyntheticSpec
from topoprof.zoo.checkpoint_wrap import apply_activation_checkpointing, children_of


class _Block(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class SyntheticLM(nn.Module):
    """The module `topoprof.workload.synthetic.SyntheticSpec` describes; forward returns the mean loss."""

    BLOCKS = ("blocks",)  # its repeated blocks, what activation checkpointing wraps

    def __init__(self, spec: SyntheticSpec, autocast_dtype=None):
        super().__init__()
        self.embed = nn.Embedding(spec.vocab, spec.d_model)
        self.blocks = nn.ModuleList(_Block(spec.d_model, spec.d_ff) for _ in range(spec.n_layers))
        self.norm = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab, bias=False)
        self.autocast_dtype = autocast_dtype

    def forward(self, tokens):  # tokens: (samples, seq_len + 1)
        # Autocast is entered here, not around the call: DataParallel's replica threads re-enter
        # autocast with the default dtype (float16), torch/nn/parallel/parallel_apply.py _worker.
        # (Without autocast no context at all: torch.autocast has no dtype for the meta device.)
        enabled = self.autocast_dtype is not None
        with torch.autocast(tokens.device.type, dtype=self.autocast_dtype) if enabled else contextlib.nullcontext():
            x = self.embed(tokens[:, :-1])
            for block in self.blocks:
                x = block(x)
            loss = F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), tokens[:, 1:].flatten())
        return loss.unsqueeze(0)  # shape (1,): DataParallel gathers one loss per GPU as a vector


def build_model(spec: SyntheticSpec, seed: int, dtype=torch.float32, autocast_dtype=None, ac: str = "none"):
    """The synthetic model, its blocks checkpointed as `ac` says (`topoprof/zoo/checkpoint_wrap.py`; the
    weights drawn before, so a checkpointed model starts from the same ones)."""
    torch.manual_seed(seed)  # every rank draws the same initial weights
    model = SyntheticLM(spec, autocast_dtype).to(dtype)
    return apply_activation_checkpointing(model, ac, children_of(model, "blocks"))
