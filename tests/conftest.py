"""Session-wide test settings. Without a GPU, Triton kernels run in its interpreter: the
variable must be set before any module that defines a kernel is imported."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
