"""The ONE place where errors become HTTP replies: our own `APIError`s, request validation
failures, gRPC status codes from the verifier and anything unexpected, each as an OpenAI
error object `{"error": {"message", "type", "param", "code"}}`.

Messages never carry internal addresses or paths (a down verifier is "unavailable", not
"failed to connect to 10.0.0.5:50051"), and an error never costs the client its
keep-alive connection: unexpected exceptions are answered here, not re-raised to the server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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

# Only these codes are the client's doing; their messages say what was wrong and are kept.
_CLIENT_CODES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED,
})
# What the client reads for the others (the details stay in our log).
_GENERIC = {
    503: "The model backend is unavailable; retry later.",
    504: "The model backend did not answer in time.",
    501: "The model backend does not implement this.",
    500: "Internal error in the model backend (see the server log).",
}

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
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
    """A failed verifier RPC -> the APIError the client sees: the verifier's message for
    what the client caused (it names what was wrong), a generic one otherwise."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    status = _GRPC_TO_HTTP.get(code, 500)
    if code not in _CLIENT_CODES:
        log.warning("verifier_rpc_failed", code=code.name, details=details)
        details = _GENERIC.get(status, _GENERIC[500])
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
    if param is None:  # the body itself: absent, or not a JSON object
        return invalid_request("The request body must be a JSON object.")
    if kind == "extra_forbidden":
        return invalid_request(f"Unrecognized request argument supplied: {param}", param)
    if kind == "missing":
        return invalid_request(f"Missing required parameter: '{param}'.", param)
    return invalid_request(f"Invalid value for '{param}': {first.get('msg', 'invalid')}", param)


class ErrorJSONResponse(JSONResponse):
    """ASCII-escaped JSON: an error may quote client input that is not valid UTF-8 text
    (a lone surrogate), which must not turn the error itself into a crash."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(error: APIError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return ErrorJSONResponse(error.body(), status_code=error.status, headers=headers)


class CatchAllMiddleware:
    """Whatever escapes the routes' handlers becomes a 500 OpenAI error object HERE, so
    the server never sees the exception (it would drop the keep-alive connection)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = {"started": False, "complete": False}

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                state["complete"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if state["started"] and not state["complete"]:
                raise  # half a response: only closing the connection can end it
            if not state["started"]:
                error = as_api_error(exc)
                count_rejection(scope, error.status)
                await error_response(error)(scope, receive, send)
            else:
                log.error("error_after_response", exc_info=exc)


def count_rejection(scope: Scope, status: int) -> None:
    """A request of the API answered with an error before any token: counted apart from
    the finished ones (`ddtree:request_rejected_total{status}`)."""
    app = scope.get("app")
    gateway = getattr(getattr(app, "state", None), "gateway", None)
    if gateway is not None and str(scope.get("path", "")).startswith("/v1/"):
        gateway.metrics.observe_rejected(status)


def _reply(request: Request, error: APIError, headers: Mapping[str, str] | None = None
           ) -> JSONResponse:
    count_rejection(request.scope, error.status)
    return error_response(error, headers)


def install_handlers(app: FastAPI) -> None:
    """Every error a route can raise ends as an OpenAI error object; none crashes the server."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return _reply(request, exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _reply(request, from_validation(exc))

    async def on_grpc(request: Request, exc: Exception) -> JSONResponse:
        return _reply(request, as_api_error(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"Unknown path: {request.url.path}"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        return _reply(request, APIError(exc.status_code, message), headers=exc.headers)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(grpc.RpcError, on_grpc)
    app.add_exception_handler(HTTPException, on_http)
    # Anything else: CatchAllMiddleware (a handler for Exception would run in Starlette's
    # outermost middleware, which re-raises to the server and so closes the connection).
