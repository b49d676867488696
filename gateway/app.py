"""The FastAPI app: routes, the one error mapping, the middlewares (x-request-id, errors,
API key, body limits) and the verifier channel opened and closed with the app's lifespan."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth import APIKeyMiddleware
from gateway.config import GatewayConfig
from gateway.detokenize import byte_table
from gateway.errors import CatchAllMiddleware, install_handlers
from gateway.limits import BodyLimitMiddleware
from gateway.logprobs import TokenNames
from gateway.metrics import Metrics
from gateway.params import Defaults
from gateway.prompts import PromptEncoder, load_sampling_defaults
from gateway.routes import chat, completions, health, models
from gateway.state import GatewayState
from gateway.verifier_client import VerifierClient

log = structlog.get_logger("gateway")

# A client's printable id is echoed (and logged); anything else gets a fresh one.
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


class RequestIdMiddleware:
    """Takes `x-request-id` from the request (or makes one) and echoes it on every
    response, errors included. Inside ddtree every request gets its own unguessable id
    (`internal_id`, uuid4): a client's id never names a verifier generation, so no client
    can abort another's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        internal_id = uuid.uuid4().hex
        request_id = given if _REQUEST_ID.match(given) else internal_id
        scope.setdefault("state", {}).update(request_id=request_id, internal_id=internal_id,
                                             arrived_at=time.perf_counter())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                message["headers"] = [*headers, (b"x-request-id", request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


def build_state(
    config: GatewayConfig, client: VerifierClient, encoder: PromptEncoder | None = None
) -> GatewayState:
    encoder = encoder or PromptEncoder.load(config.tokenizer, config.reasoning)
    for skip in (True, False):  # built once here, not inside the first streamed request
        byte_table(encoder.tokenizer, skip)
    model = config.model_name or Path(config.tokenizer).resolve().name
    defaults = Defaults(model, load_sampling_defaults(config.tokenizer),
                        config.stream_granularity, config.max_n, config.merge_when_behind)
    metrics = Metrics(model)
    client.on_read = metrics.observe_read
    return GatewayState(config, client, encoder, TokenNames(encoder.tokenizer), metrics,
                        defaults, created=int(time.time()))


def create_app(
    config: GatewayConfig, verifier_client: VerifierClient, encoder: PromptEncoder | None = None
) -> FastAPI:
    """The app; `encoder` defaults to the tokenizer in `config.tokenizer`."""
    state = build_state(config, verifier_client, encoder)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await verifier_client.start()
        info = await state.fetch_model_info()
        log.info("gateway_serving", port=config.port, model=state.defaults.model,
                 verifier_addr=config.verifier_addr, verifier_up=info is not None,
                 reasoning=state.encoder.is_reasoning)
        yield
        await verifier_client.close()
        state.tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="ddtree gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = state
    for module in (chat, completions, models, health):
        app.include_router(module.router)
    install_handlers(app)
    # Outermost last: ids on every reply, then errors, the API key, the body limits.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_request_bytes,
                       timeout_s=config.body_timeout_s)
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(RequestIdMiddleware)
    return app
