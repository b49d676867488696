"""The gateway's one error mapping: gRPC status codes from the verifier -> HTTP status and
the OpenAI error object."""

from __future__ import annotations

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from gateway.errors import APIError, as_api_error, from_grpc, model_not_found, unsupported


def rpc_error(code: grpc.StatusCode, details: str) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details)


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, "invalid_request_error"),
        (grpc.StatusCode.NOT_FOUND, 404, "invalid_request_error"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "rate_limit_error"),
        (grpc.StatusCode.UNAVAILABLE, 503, "service_unavailable_error"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "timeout_error"),
        (grpc.StatusCode.INTERNAL, 500, "internal_error"),
        (grpc.StatusCode.UNKNOWN, 500, "internal_error"),
    ],
)
def test_grpc_status_codes_map_to_http(code: grpc.StatusCode, status: int, kind: str) -> None:
    error = from_grpc(rpc_error(code, "what went wrong"))
    assert error.status == status
    body = error.body()["error"]
    assert body["type"] == kind
    # The verifier's message reaches the client only for what the client caused.
    is_clients = status in (400, 404, 429)
    assert ("what went wrong" in body["message"]) == is_clients
    assert body["code"] == code.name.lower()


def test_a_down_verifier_is_503_without_its_address() -> None:
    details = "failed to connect to all addresses; last error: ipv4:10.1.2.3:50051: refused"
    body = from_grpc(rpc_error(grpc.StatusCode.UNAVAILABLE, details)).body()["error"]
    assert "10.1.2.3" not in body["message"] and "50051" not in body["message"]
    assert "unavailable" in body["message"]


def test_the_verifiers_message_names_the_bad_argument() -> None:
    error = as_api_error(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "budget must be in [1, 64]"))
    assert (error.status, error.message) == (400, "budget must be in [1, 64]")


def test_unexpected_exceptions_become_a_generic_500() -> None:
    error = as_api_error(RuntimeError("secret internals"))
    assert error.status == 500 and "secret" not in error.message


def test_our_errors_pass_through_unchanged() -> None:
    mine = APIError(418, "teapot")
    assert as_api_error(mine) is mine


def test_helpers_fill_param_and_code() -> None:
    assert model_not_found("x").body()["error"] == {
        "message": "The model 'x' does not exist", "type": "invalid_request_error",
        "param": "model", "code": "model_not_found"}
    error = unsupported("tools", "tool calling is not supported").body()["error"]
    assert error["param"] == "tools" and "tool calling" in error["message"]
