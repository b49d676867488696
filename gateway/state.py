"""What every route needs, built once per app: config, the verifier client, the prompt
encoder (run on its own thread, off the event loop, unless the request is small and that
thread idle), metrics and the request defaults; plus the verifier's ModelInfo once known."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from fastapi import Request

from ddtree.v1 import verifier_pb2
from gateway.config import GatewayConfig
from gateway.logprobs import TokenNames
from gateway.metrics import Metrics
from gateway.params import Defaults
from gateway.prompts import PromptEncoder
from gateway.verifier_client import VerifierClient

T = TypeVar("T")

# A request body up to this many bytes is planned (chat template, tokenization) on the event
# loop itself when the tokenizer thread is idle: a HumanEval prompt takes 0.2-0.3 ms of
# work there, where the hop to the thread and back cost ~2 ms (median) beside 8 busy streams
# on the CPU sandbox, the thread waiting for the GIL (~8 KB is ~2,000 tokens, ~1 ms).
INLINE_PLAN_BYTES = 8192


@dataclass
class GatewayState:
    config: GatewayConfig
    client: VerifierClient
    encoder: PromptEncoder
    names: TokenNames
    metrics: Metrics
    defaults: Defaults
    created: int  # unix time the model "was created" (/v1/models)
    model_info: verifier_pb2.ModelInfo | None = field(default=None)
    # ONE thread: a long prompt never stalls the event loop (/health, other streams), and
    # the Rust tokenizer is never entered by two threads at once.
    tokenizer_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="tokenizer"))
    off_loop_jobs: int = 0  # submitted to the tokenizer thread and not yet taken back

    async def plan(self, request: Request, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` (a request's plan) on the event loop when the request's body is
        small and the tokenizer thread idle (so the tokenizer is never entered twice at
        once), else on the tokenizer thread."""
        size = request.headers.get("content-length", "")
        if self.off_loop_jobs == 0 and size.isdigit() and int(size) <= INLINE_PLAN_BYTES:
            return fn(*args)
        return await self.off_loop(fn, *args)

    async def fetch_model_info(self) -> verifier_pb2.ModelInfo | None:
        """The verifier's ModelInfo, asked again until it once answers (it is static)."""
        if self.model_info is None:
            try:
                self.model_info = await self.client.model_info()
            except grpc.aio.AioRpcError:
                return None
        return self.model_info

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the tokenizer thread (tokenizing, chat templates)."""
        loop = asyncio.get_running_loop()
        self.off_loop_jobs += 1
        try:
            return await loop.run_in_executor(self.tokenizer_pool, functools.partial(fn, *args))
        finally:
            self.off_loop_jobs -= 1


def gateway_state(request: Request) -> GatewayState:
    state = request.app.state.gateway
    assert isinstance(state, GatewayState)
    return state


def request_id(request: Request) -> str:
    """The id of this request inside ddtree (verifier generations, response ids): always
    made here (uuid4), never the client's, so nobody can guess or reuse one."""
    return str(request.state.internal_id)
