"""verifier_svc/status.py: library errors keep their message under their status code; any
other exception becomes INTERNAL with a generic message (the traceback goes to the log)."""

from __future__ import annotations

import grpc
import pytest

from ddtree.errors import CapacityError, SessionNotFoundError, TreeValidationError
from verifier_svc.scheduler import GenerationAborted
from verifier_svc.status import unary


class Aborted(Exception):
    pass


class RecordingContext:
    """The two things status.py uses of a grpc.ServicerContext: abort raises, like grpc's."""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise Aborted()


class Servicer:
    def __init__(self, error: Exception) -> None:
        self.error = error

    @unary
    def Verify(self, request: object, context: object) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "code", "details"),
    [
        (
            TreeValidationError("tree: parents[1] = 2"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tree: parents[1] = 2",
        ),
        (
            SessionNotFoundError("unknown session 'x'"),
            grpc.StatusCode.NOT_FOUND,
            "unknown session 'x'",
        ),
        (CapacityError("full"), grpc.StatusCode.RESOURCE_EXHAUSTED, "full"),
        (GenerationAborted("aborted"), grpc.StatusCode.CANCELLED, "generation aborted"),
        (
            RuntimeError("secret internals"),
            grpc.StatusCode.INTERNAL,
            "internal error in Verify (see the verifier's log)",
        ),
    ],
)
def test_exceptions_map_to_one_status_each(
    error: Exception, code: grpc.StatusCode, details: str
) -> None:
    context = RecordingContext()
    with pytest.raises(Aborted):
        Servicer(error).Verify(None, context)
    assert (context.code, context.details) == (code, details)
