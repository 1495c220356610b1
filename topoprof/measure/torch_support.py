"""The oldest torch topoprof runs on, and the features that need a newer one.

TORCH_FLOOR is pyproject.toml's `torch>=`: the oldest release the whole test suite passes on
(docs/testing.md, "torch versions checked"). Older releases lack what the op trace needs (the meta
kernels of CUDA's fused attention came in 2.5; on 2.5 non-reentrant `torch.utils.checkpoint` looks
for a device module of meta tensors and fails, pytorch/pytorch#133550) and much of the GPU path
(`init_process_group(device_id=...)`, `torch.amp.GradScaler("cuda")`, `torch.OutOfMemoryError`). A feature that needs
more than the floor is listed here, once: the command that would use it stops before any rank starts, with one
line and exit 1 (nothing could be measured), and its tests skip with the same words.

torch is not imported here: its version comes from the package's metadata.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

TORCH_FLOOR = (2, 6)


@dataclass(frozen=True)
class Feature:
    what: str                   # what the user asked for, as a sentence's subject
    min_version: tuple[int, int]
    why: str                    # the torch API it needs, and the release that added it


FSDP2_VALIDATE = Feature(
    "validate's FSDP2 modes", (2, 9),
    "they time FSDP's collectives through FSDPModule.set_custom_all_gather/set_custom_reduce_scatter, "
    "added in torch 2.9")


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string: "2.5.1+cu121" -> (2, 5); a nightly
    "2.9.0.dev20250601" counts as 2.9."""
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def torch_version_text() -> str | None:
    """The installed torch's version string, without importing torch: its package metadata (the
    same in every process, torch imported or not; a PyPI wheel's may lack the "+cu124" of
    `torch.__version__`), else the torch already imported; None when there is none."""
    try:
        return version("torch")
    except PackageNotFoundError:
        torch = sys.modules.get("torch")
        return str(torch.__version__) if torch is not None and hasattr(torch, "__version__") else None


def missing(feature: Feature, installed: str | None = None) -> str | None:
    """Why `feature` cannot run with the installed torch (or `installed`, a version string), in
    one line; None when it can."""
    text = installed if installed is not None else torch_version_text()
    found = parse_version(text) if text else None
    need = ".".join(map(str, feature.min_version))
    if found is not None and found >= feature.min_version:
        return None
    have = f"this is torch {text}" if text else "no torch was found"
    return f"{feature.what} need torch >= {need} ({feature.why}); {have}"
