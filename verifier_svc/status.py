"""The ONE place where the verifier turns an exception into a gRPC status.

Library errors a caller can cause keep their message (INVALID_ARGUMENT, NOT_FOUND,
RESOURCE_EXHAUSTED; the table is `ddtree.codec.status_code_for`); anything else is a bug
on our side: INTERNAL with a generic message, the traceback in the log, never in the reply.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc
import structlog

from ddtree import codec
from verifier_svc.scheduler import GenerationAborted

log = structlog.get_logger("verifier_svc")

R = TypeVar("R")


def status_of(exc: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
    """The status an exception ends a call (or one GenerateMany generation) with; logs it."""
    code = codec.status_code_for(exc)
    # KeyError's str() quotes its message (SessionNotFoundError is a KeyError).
    message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if isinstance(exc, GenerationAborted):
        code, message = grpc.StatusCode.CANCELLED, f"generation {exc}"
    elif code == grpc.StatusCode.INTERNAL:
        log.error("rpc_internal_error", method=method, exc_info=exc)
        message = f"internal error in {method} (see the verifier's log)"
    else:
        log.info("rpc_rejected", method=method, code=code.name, reason=message)
    return code, message


def abort_with(context: grpc.ServicerContext, exc: BaseException, method: str) -> NoReturn:
    context.abort(*status_of(exc, method))
    raise AssertionError("context.abort returned")  # it always raises


def unary(fn: Callable[..., R]) -> Callable[..., R]:
    """Maps whatever a unary servicer method raises through `abort_with`."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> R:
        try:
            return fn(self, request, context)
        except Exception as exc:
            abort_with(context, exc, fn.__name__)

    return wrapper


def streaming(fn: Callable[..., Iterator[R]]) -> Callable[..., Iterator[R]]:
    """Same for a server-streaming method: an error mid-stream ends it with the status."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[R]:
        try:
            yield from fn(self, request, context)
        except Exception as exc:
            abort_with(context, exc, fn.__name__)

    return wrapper
