"""The ONE place where errors become HTTP replies: our own `APIError`s, request validation
failures, gRPC status codes from the verifier and anything unexpected, each as an OpenAI
error object `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import grpc
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = structlog.get_logger("gateway")

# The verifier's status codes (SERVING.md) -> HTTP status. Anything else is a 500.
_GRPC_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    # CANCELLED reaches a client only when the verifier itself ended the generation
    # (shutting down, or an Abort from elsewhere): the backend is going away.
    grpc.StatusCode.CANCELLED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

# Pydantic puts union branches and tagged types into `loc`; they are not parameter names.
_LOC_TAG = re.compile(r"^(str|int|float|bool|dict|list|none|[\w-]+\[.*\])$")


class APIError(Exception):
    """An error a client sees as an OpenAI error object with this HTTP status."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "internal_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}


def invalid_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def unsupported(param: str, why: str = "") -> APIError:
    detail = f": {why}" if why else ""
    return APIError(400, f"Unsupported parameter '{param}'{detail}", param, "unsupported_parameter")


def model_not_found(model: str) -> APIError:
    return APIError(
        404, f"The model '{model}' does not exist", param="model", code="model_not_found"
    )


class ClientDisconnected(Exception):
    """The HTTP client went away before the reply was ready (nobody reads the answer)."""


def from_grpc(exc: grpc.RpcError) -> APIError:
    """A failed verifier RPC -> the APIError the client sees (the verifier's message kept:
    it names what was wrong for client errors and is already generic for INTERNAL)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    status = _GRPC_TO_HTTP.get(code, 500)
    if code == grpc.StatusCode.UNAVAILABLE:
        details = f"the verifier is unavailable: {details}"
    return APIError(status, details or code.name, code=code.name.lower())


def as_api_error(exc: Exception) -> APIError:
    """Whatever a generation raised -> what the client sees (unexpected ones are logged)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, grpc.RpcError):
        return from_grpc(exc)
    log.error("generation_failed", exc_info=exc)
    return APIError(500, "internal error in the gateway (see its log)")


def _param(loc: Sequence[int | str]) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content'."""
    param = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not _LOC_TAG.match(part):
            param += f".{part}" if param else part
    return param or None


def from_validation(exc: RequestValidationError) -> APIError:
    first = exc.errors()[0]
    param, kind = _param(first.get("loc", ())), first.get("type", "")
    if kind == "json_invalid":
        return invalid_request("We could not parse the JSON body of your request.")
    if kind == "extra_forbidden":
        return invalid_request(f"Unrecognized request argument supplied: {param}", param)
    if kind == "missing":
        return invalid_request(f"Missing required parameter: '{param}'.", param)
    return invalid_request(f"Invalid value for '{param}': {first.get('msg', 'invalid')}", param)


def error_response(error: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def install_handlers(app: FastAPI) -> None:
    """Every error a route can raise ends as an OpenAI error object; none crashes the server."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(from_validation(exc))

    async def on_grpc(request: Request, exc: Exception) -> JSONResponse:
        return error_response(as_api_error(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return error_response(APIError(exc.status_code, str(exc.detail)))

    async def on_anything(request: Request, exc: Exception) -> JSONResponse:
        return error_response(as_api_error(exc))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(grpc.RpcError, on_grpc)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_anything)
