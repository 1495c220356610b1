"""A parameter layout: which tensors a model has, in which order, and how much backward
compute each one's use costs. The layout decides DDP's buckets and when each becomes ready.

A layout has
- `tensors`: the parameters in registration order (`model.parameters()`, tied weights once);
- `uses`: the forward pass in order; each use names the tensors it reads and its backward
  FLOPs per token. A weight matrix used as a matmul costs 4 * numel per token in backward
  (2 * numel for the input gradient, 2 * numel for the weight gradient; forward is 2 * numel,
  Kaplan et al. 2020 "Scaling Laws for Neural Language Models" §2.1). Embedding lookups, norms
  and biases cost ~0. Attention score/value products (no parameters) are left out, as in
  Kaplan's C ~= 6N.

Backward runs the uses in reverse. A tensor's gradient is ready when the backward of its
last use in that reverse walk ends: a tied weight (GPT-2's wte, used by the input lookup and
the LM head) is ready only at the very end, although the LM head's backward is the heavy one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from topoprof.errors import InputError

MATMUL_BACKWARD_FLOPS_PER_PARAM = 4  # per token: dX and dW, 2 FLOPs each (Kaplan et al. 2020)

MATMUL_FORWARD_FLOPS_PER_PARAM = 2  # per token: one multiply-add (Kaplan et al. 2020 §2.1)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    @cached_property  # read for every tensor at every size the fits search counts
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Use:
    """One step of the forward pass: the tensors it reads and its backward cost per token; its
    forward cost when it is not a matmul's half of backward (None: it is)."""

    tensors: tuple[int, ...]
    backward_flops_per_token: float
    forward_flops_per_token: float | None = None


@dataclass(frozen=True)
class ReadyTensor:
    index: int  # into Layout.tensors
    ready_fraction: float  # share of backward compute done when its gradient is ready


@dataclass(frozen=True)
class Layout:
    name: str
    tensors: tuple[TensorSpec, ...]
    uses: tuple[Use, ...]
    source: str
    unit: str = "token"  # what the "per token" figures are per: "token", or "image" for a CNN

    def __post_init__(self) -> None:
        used = {i for use in self.uses for i in use.tensors}
        unused = [self.tensors[i].name for i in range(len(self.tensors)) if i not in used]
        if unused or not self.tensors:
            raise InputError(f"layout {self.name!r}: tensors without a use: {unused[:5]}")
        if self.backward_flops_per_token <= 0:
            raise InputError(f"layout {self.name!r} has no matmul compute to spread backward over")

    def __hash__(self) -> int:  # hashed at every lookup of its FSDP plan (`fsdp_plan`): computed once
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.name, self.tensors, self.uses, self.source, self.unit))

    @cached_property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @cached_property
    def backward_flops_per_token(self) -> float:
        return sum(u.backward_flops_per_token for u in self.uses)

    @cached_property
    def forward_flops_per_token(self) -> float:
        """Each use's own forward figure, or half its backward (a matmul: 2 of its 6)."""
        return sum(u.backward_flops_per_token * MATMUL_FORWARD_FLOPS_PER_PARAM / MATMUL_BACKWARD_FLOPS_PER_PARAM
                   if u.forward_flops_per_token is None else u.forward_flops_per_token for u in self.uses)

    @cached_property
    def train_flops_per_token(self) -> float:
        """Forward + backward: (2 + 4) FLOPs per matmul parameter use; ~6N per token. A use with
        its own forward figure adds what it differs from half its backward (a CNN's stem conv,
        whose input needs no gradient: backward 1x forward, not 2x)."""
        per_param = MATMUL_FORWARD_FLOPS_PER_PARAM + MATMUL_BACKWARD_FLOPS_PER_PARAM
        matmul = self.backward_flops_per_token * per_param / MATMUL_BACKWARD_FLOPS_PER_PARAM
        return matmul + sum(u.forward_flops_per_token - u.backward_flops_per_token * MATMUL_FORWARD_FLOPS_PER_PARAM
                            / MATMUL_BACKWARD_FLOPS_PER_PARAM for u in self.uses
                            if u.forward_flops_per_token is not None)

    def ready_schedule(self) -> tuple[ReadyTensor, ...]:
        """Tensors in gradient-ready order with the share of backward done at that moment.

        Within one use the tensors become ready in reverse of their listing (a Linear's bias
        before its weight, as autograd runs AccumulateGrad nodes: newest first)."""
        # Summed in the same order as `done` below, so the last use lands on exactly 1.0.
        total = sum(u.backward_flops_per_token for u in reversed(self.uses))
        done = 0.0
        ready: dict[int, tuple[float, int]] = {}
        position = 0
        for use in reversed(self.uses):
            done += use.backward_flops_per_token
            for index in reversed(use.tensors):
                ready[index] = (done / total, position)  # later overwrite = last use
                position += 1
        order = sorted(ready.items(), key=lambda item: (item[1][0], item[1][1]))
        return tuple(ReadyTensor(index, fraction) for index, (fraction, _) in order)


class LayoutBuilder:
    """Collects tensors in registration order and uses in forward order."""

    def __init__(self) -> None:
        self.tensors: list[TensorSpec] = []
        self.uses: list[Use] = []
        self._index: dict[str, int] = {}

    def param(self, name: str, *shape: int) -> str:
        self._index[name] = len(self.tensors)
        self.tensors.append(TensorSpec(name, tuple(shape)))
        return name

    def use(self, *names: str, flops_per_token: float = 0.0, forward_flops_per_token: float | None = None) -> None:
        """`flops_per_token` is the use's backward; its forward is half that unless given."""
        self.uses.append(Use(tuple(self._index[n] for n in names), flops_per_token, forward_flops_per_token))

    def matmul(self, weight: str, bias: str | None = None, tokens_share: float = 1.0) -> None:
        """A Linear/Conv1D: 4 * numel(weight) backward FLOPs per token it is applied to."""
        numel = self.tensors[self._index[weight]].numel
        names = (weight,) if bias is None else (weight, bias)
        self.use(*names, flops_per_token=MATMUL_BACKWARD_FLOPS_PER_PARAM * numel * tokens_share)

    def norm(self, prefix: str, dim: int, bias: bool = True) -> tuple[str, ...]:
        names: tuple[str, ...] = (self.param(f"{prefix}.weight", dim),)
        if bias:
            names += (self.param(f"{prefix}.bias", dim),)
        return names

    def linear(self, prefix: str, d_in: int, d_out: int, bias: bool = True) -> tuple[str, str | None]:
        """nn.Linear registers weight (d_out, d_in) then bias: (weight, bias or None), `matmul`'s arguments."""
        weight = self.param(f"{prefix}.weight", d_out, d_in)
        return weight, self.param(f"{prefix}.bias", d_out) if bias else None

    def build(self, name: str, source: str, unit: str = "token") -> Layout:
        return Layout(name, tuple(self.tensors), tuple(self.uses), source, unit)
