"""Session-wide test settings. Without a GPU, Triton kernels run in its interpreter: the
variable must be set before any module that defines a kernel is imported."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_language_once_per_launch() -> None:
    """The interpreter re-patches triton.language at every call of a @triton.jit helper
    inside a kernel (`_patch_lang`: `inspect.getmembers` over the language modules, ~1 ms
    a call, never restored) although the launch around it patched the same modules and
    keeps them patched until it returns: ~40% of an engine test's time. Here a helper's
    call inside a launch whose patch already covers its language modules skips the
    redundant pass; every other call, and every kernel's float op, is the interpreter's
    own. Where the interpreter's internals differ (another triton), nothing changes."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    patch: Callable[[Any], Any] | None = getattr(interpreter, "_patch_lang", None)
    if patch is None or getattr(patch, "once_per_launch", False) or not hasattr(
            interpreter, "_LangPatchScope"):
        return
    import functools
    import inspect

    import triton.language as tl

    patched: list[frozenset[int]] = []  # the language modules of each launch in progress

    @functools.cache
    def languages(fn: Any) -> frozenset[int]:
        return frozenset(id(value) for value in fn.__globals__.values()
                         if inspect.ismodule(value) and value in (tl, tl.core))

    def patch_lang(fn: Any) -> Any:
        mine = languages(fn)
        if patched:  # a helper called inside a launch (its scope is never restored)
            if mine <= patched[-1]:
                return interpreter._LangPatchScope()
            patched[-1] |= mine  # patched now until the launch returns, as ever
            return patch(fn)
        scope = patch(fn)  # a launch: restored when its grid has run
        restore = scope.restore
        patched.append(mine)

        def restore_once() -> None:
            patched.pop()
            restore()

        scope.restore = restore_once
        return scope

    patch_lang.once_per_launch = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_lang
    try:  # a launch with nested helpers (ours and triton.language's own) must still work
        ok = _nested_helpers_work()
    except Exception:  # noqa: BLE001 - any failure: the interpreter's own code instead
        ok = False
    if not ok:
        interpreter._patch_lang = patch


def _nested_helpers_work() -> bool:
    from tests import interpreter_check

    return interpreter_check.nested_helpers_work()


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_language_once_per_launch()
