"""Activation checkpointing (AC) as a job applies it to its repeated blocks, in torchtitan's terms
(torchtitan `parallelize_llama.py` `apply_ac`; `config_manager.py` `activation_checkpoint.mode` and
`selective_ac_option`):

- `none`: every block keeps what its backward reads;
- `full`: every block wrapped in `checkpoint_wrapper`: it keeps its input only, and its backward
  runs its forward again first;
- `layer:N`: every N-th block wrapped so (torchtitan's integer `selective_ac_option`, "2 =
  checkpoint every other layer"), the others keep everything;
- `op`: every block under `create_selective_checkpoint_contexts` with torchtitan's policy: the
  outputs of `aten.mm` are saved except every second one, and those of SDPA and reduce-scatter;
  every other op is recomputed in backward.

What each mode keeps and recomputes is counted from the model's own ops (`topoprof/zoo/checkpoint_wrap.py`
applies the same modes to a traced or trained module). Nothing here imports torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from topoprof.errors import InputError

MODES = ("none", "full", "layer", "op")
LAYER_EVERY = 2  # torchtitan's selective layer default, "2 = checkpoint every other layer" (config_manager.py)
_LAYER = re.compile(r"^layer:(\d+)$")


@dataclass(frozen=True)
class Checkpointing:
    mode: str = "none"       # one of MODES
    every: int = 1           # layer:N checkpoints every N-th block (1 for full)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"activation checkpointing {self.mode!r}: valid: none, full, layer:N, op")
        if self.every < 1:
            raise InputError(f"activation checkpointing layer:{self.every}: N must be >= 1 (every N-th block)")

    @property
    def text(self) -> str:
        """As the option spells it: none, full, layer:N or op."""
        return f"layer:{self.every}" if self.mode == "layer" else self.mode

    def wraps(self, block: int) -> bool:
        """Whether block number `block` (0-based) is checkpointed as a whole (full, layer:N)."""
        if self.mode == "full":
            return True
        return self.mode == "layer" and block % self.every == self.every - 1

    @property
    def searched_modes(self) -> tuple[str, ...]:
        """The modes a search for what fits compares (and a user's model is traced under): none,
        full, layer:N (this N, else torchtitan's 2) and op."""
        every = self.every if self.mode == "layer" else LAYER_EVERY
        return ("none", "full", f"layer:{every}", "op")


def parse_checkpointing(text: str | None) -> Checkpointing:
    """'none', 'full', 'layer:2', 'op' (None: none); layer:1 is full."""
    if text is None:
        return Checkpointing()
    value = text.strip().lower()
    match = _LAYER.match(value)
    if match:
        every = int(match.group(1))
        if every < 1:
            raise InputError(f"--activation-checkpointing {text}: N must be >= 1 (every N-th block)")
        return Checkpointing("full") if every == 1 else Checkpointing("layer", every)
    if value not in ("none", "full", "op"):
        raise InputError(f"--activation-checkpointing {text!r}: valid: none, full, layer:N (every N-th block), "
                         "op (torchtitan's selective op policy)")
    return Checkpointing(value)
