"""Device / dtype resolution and model-pair loading shared by the CLI and the services."""

from __future__ import annotations

from pathlib import Path

import torch

from ddtree.errors import InvalidArgumentError
from ddtree.models.drafter import DFlashDrafter, load_drafter
from ddtree.models.target import TargetModel, load_target

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> the first GPU when one is present, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgumentError(f"device {name!r} requested but no CUDA GPU is visible")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on a GPU, float32 on the CPU (exact comparisons in tests)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {sorted(DTYPES)} or 'auto', got {name!r}")
    return DTYPES[name]


def load_pair(
    target_dir: str | Path, drafter_dir: str | Path | None, device: torch.device,
    dtype: torch.dtype,
) -> tuple[TargetModel, DFlashDrafter | None]:
    """Loads the target and (optionally) a drafter checked against it, in eval mode."""
    target = load_target(Path(target_dir), device, dtype).eval()
    drafter = None
    if drafter_dir is not None:
        drafter = load_drafter(Path(drafter_dir), target.config, device, dtype).eval()
    return target, drafter
