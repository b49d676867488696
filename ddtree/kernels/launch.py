"""Programmatic dependent launch (PDL) for the project's Triton kernels.

A decoding step is ~270 small kernels back to back (a 135M-parameter forward at batch 1
is latency-bound: the weights read in ~0.06 ms, the step takes ~1.2 ms). Without PDL each
kernel is scheduled only after the one before it has fully drained, so every boundary
costs the launch and the grid's ramp-up. On Hopper (sm_90) and later a kernel launched
with the PDL attribute may become resident while the previous one is still finishing; it
waits in `wait_for_inputs` (griddepcontrol.wait: the previous grid complete and its
memory visible) before it reads or writes anything, and then lets the next kernel launch
early in turn. The arithmetic is untouched, so results are bitwise those without PDL.

Every kernel launched with `launch_kwargs(...)` must call `wait_for_inputs` first thing
(before any load or store): the wait is what keeps a dependent launch race-free, and it
is transitive only if no kernel in the chain skips it. Kernels of other libraries (the
PyTorch ops of a round) launch as before and wait for full completion.

`DDTREE_PDL=0` in the environment, or `set_pdl(False)`, launches without it (A/B
measurements); the CPU interpreter and GPUs before sm_90 never use it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl

_enabled = os.environ.get("DDTREE_PDL", "1").strip() not in ("0", "false", "off", "")


def set_pdl(enabled: bool) -> bool:
    """Turns dependent launches on or off for launches from now on; returns the old
    setting. CUDA graphs keep what they were captured with."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


def pdl_enabled() -> bool:
    return _enabled


@functools.lru_cache(maxsize=16)
def _supports_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def use_pdl(tensor: torch.Tensor) -> bool:
    """Whether a kernel over `tensor`'s device launches dependently: a CUDA device of
    sm_90 or later, not the interpreter, and PDL not switched off."""
    if not _enabled or tensor.device.type != "cuda":
        return False
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    index = tensor.device.index
    return _supports_pdl(torch.cuda.current_device() if index is None else index)


def launch_kwargs(pdl: bool) -> dict[str, Any]:
    """The launch options of a kernel whose USE_PDL constexpr is `pdl`."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def wait_for_inputs(USE_PDL: tl.constexpr):
    """First statement of every kernel launched with `launch_kwargs`: wait until the
    previous kernel in the stream has completed and its writes are visible, then allow
    the next kernel to be launched (it waits here in turn)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
