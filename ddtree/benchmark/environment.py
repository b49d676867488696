"""Where a report was measured: Python, platform, library versions, this checkout's git
commit and the local GPU (against a URL the server's GPU may be elsewhere: the report
says which machine this describes)."""

from __future__ import annotations

import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("ddtree", "torch", "transformers", "triton", "aiohttp")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from (None for an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return result.stdout.strip() + ("-dirty" if dirty else "")


def gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))


def environment() -> dict[str, Any]:
    import torch

    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {p: _version(p) for p in PACKAGES},
        "torch_cuda": torch.version.cuda,
        "gpu": gpu_name(),
        "git_commit": git_commit(),
    }
