"""Programmatic dependent launch (PDL) for the project's Triton kernels.

A decoding step is ~270 small kernels back to back (a 135M-parameter forward at batch 1
is latency-bound: the weights read in ~0.06 ms, the step took ~1.2 ms). Without PDL each
kernel is scheduled only after the one before it has fully drained, so every boundary
costs the launch and the grid's ramp-up. On Hopper (sm_90) and later a kernel launched
with the PDL attribute may become resident while the previous one is still finishing; it
waits in `wait_for_inputs` (griddepcontrol.wait: the previous grid complete and its
memory visible) before it reads its inputs or writes anything, and then lets the next
kernel launch early in turn. The arithmetic is untouched, so results are bitwise those
without PDL (on the H200 the demo pair's ar step went from 1.19 to 0.93 ms).

Every kernel launched with `launch_kwargs(...)` must call `wait_for_inputs` before any
load its result depends on and before any store: the wait is what keeps a dependent
launch race-free, and it is transitive only if no kernel in the chain skips it. Kernels
of other libraries (the PyTorch ops of a round) launch as before and wait for full
completion.

Before the wait a kernel may only ask for lines in L2 (`prefetch_l2`): a GEMM its weight
rows (never written by a kernel), tree attention its prefix K/V (addressed from two
metadata loads clamped into the pool, so a prefetch can never touch memory outside it nor
change a result). The HBM latency of those first tiles then overlaps the previous kernel
instead of following it. `DDTREE_PDL_PREFETCH=0` / `set_prefetch` turn that part off.
tests/kernels/test_launch.py compiles every kernel for sm_90 and checks the order.

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

# At most this many bytes of a launch's operands are asked for ahead (the H200's L2 holds
# 50 MB): the demo's weights and contexts fit whole; an 8B GEMM prefetches only its first
# K blocks (prefetching a 200 MB weight whole evicted it before use: 8B ar 8.0 vs 7.0 ms).
PREFETCH_BUDGET_BYTES = 8 << 20


def prefetch_blocks(bytes_per_block: int, num_blocks: int) -> int:
    """How many of a launch's `num_blocks` blocks (each `bytes_per_block` over the whole
    grid) fit the prefetch budget: at least one."""
    return max(1, min(num_blocks, PREFETCH_BUDGET_BYTES // max(1, bytes_per_block)))


_enabled = os.environ.get("DDTREE_PDL", "1") != "0"  # the services' `!= "0"` convention
_prefetch = os.environ.get("DDTREE_PDL_PREFETCH", "1") != "0"
# Read once, as triton does when it decorates the kernels (interpreted for the process).
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def set_pdl(enabled: bool) -> bool:
    """Turns dependent launches on or off for launches from now on; returns the old
    setting. CUDA graphs keep what they were captured with."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


def pdl_enabled() -> bool:
    return _enabled


def set_prefetch(enabled: bool) -> bool:
    """Turns the L2 prefetches of dependent launches (GEMM weights, attention prefix K/V)
    on or off; returns the old setting."""
    global _prefetch
    previous, _prefetch = _prefetch, bool(enabled)
    return previous


def prefetch_enabled() -> bool:
    return _prefetch


@functools.lru_cache(maxsize=16)
def _supports_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def use_pdl(tensor: torch.Tensor) -> bool:
    """Whether a kernel over `tensor`'s device launches dependently: a CUDA device of
    sm_90 or later, not the interpreter, and PDL not switched off."""
    if not _enabled or _INTERPRETED or tensor.device.type != "cuda":
        return False
    index = tensor.device.index
    return _supports_pdl(torch.cuda.current_device() if index is None else index)


def launch_kwargs(pdl: bool) -> dict[str, Any]:
    """The launch options of a kernel whose USE_PDL constexpr is `pdl`."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def wait_for_inputs(USE_PDL: tl.constexpr):
    """Called by every kernel launched with `launch_kwargs` before any load its result
    depends on and any store (after its L2 prefetches, if any): wait until the previous
    kernel in the stream has completed and its writes are visible, then allow the next
    kernel to be launched (it waits here in turn)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """Asks L2 for the lines holding ptrs (any shape of valid global addresses): no result,
    no wait; the loads that follow hit L2 instead of HBM. CUDA only (inline PTX)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)
