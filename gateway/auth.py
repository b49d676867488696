"""API keys, as vLLM checks them: with `--api-key` set, every `/v1` request must carry
`Authorization: Bearer KEY` (401 otherwise); /health and /metrics stay open for probes
and scrapers."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import APIError, count_rejection, error_response

PROTECTED_PREFIX = "/v1"


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIX):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                error = APIError(401, "Incorrect or missing API key: send "
                                      "'Authorization: Bearer <key>'.", code="invalid_api_key")
                headers = {"www-authenticate": "Bearer"}
                count_rejection(scope, error.status)
                await error_response(error, headers=headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)
