"""The gateway's one gRPC channel to the verifier: Generate (streamed), Abort, GetModelInfo,
GetStats and the grpc.health.v1 check; TLS and the token as the gateway's config says.

Every call has a deadline. A Generate that fails with UNAVAILABLE before its first message
arrived is retried (tenacity, with backoff, for up to `retry_timeout_s`: long enough for
`ddtree serve` to restart a dead verifier); once tokens have reached the client it never
is, since a half-streamed generation cannot be replayed. A generation whose consumer stops
early (stop string, client gone, error) is aborted on the verifier, which frees its KV.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from ddtree.service import GrpcSecurity, open_aio_channel
from ddtree.v1 import verifier_pb2, verifier_pb2_grpc
from gateway.config import GatewayConfig

log = structlog.get_logger("gateway.verifier")


def _is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


class VerifierClient:
    """Create it anywhere; `start` it inside the event loop that will use it."""

    def __init__(
        self,
        address: str,
        request_timeout_s: float = 600.0,
        rpc_timeout_s: float = 5.0,
        retry_attempts: int = 30,
        retry_timeout_s: float = 60.0,
        stats_timeout_s: float = 1.0,
        security: GrpcSecurity | None = None,
    ) -> None:
        self.address = address
        self.request_timeout_s = request_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.retry_attempts = retry_attempts
        self.retry_timeout_s = retry_timeout_s
        self.stats_timeout_s = stats_timeout_s
        self.security = security or GrpcSecurity()
        self._metadata = self.security.metadata
        self._channel: grpc.aio.Channel | None = None
        self._stub: verifier_pb2_grpc.VerifierStub | None = None
        self._health: health_pb2_grpc.HealthStub | None = None
        self._background: set[asyncio.Task[None]] = set()  # aborts in flight

    @classmethod
    def from_config(cls, config: GatewayConfig) -> VerifierClient:
        return cls(config.verifier_addr, config.request_timeout_s, config.rpc_timeout_s,
                   config.retry_attempts, config.retry_timeout_s, config.stats_timeout_s,
                   config.security)

    async def start(self) -> None:
        """Opens the channel (grpc.aio binds it to the running loop)."""
        self._channel = open_aio_channel(self.address, self.security)
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=self.rpc_timeout_s)
        if self._channel is not None:
            await self._channel.close(grace=None)

    @property
    def stub(self) -> verifier_pb2_grpc.VerifierStub:
        assert self._stub is not None, "VerifierClient.start() was not awaited"
        return self._stub

    async def generate(
        self, request: verifier_pb2.GenerateRequest
    ) -> AsyncGenerator[verifier_pb2.GenerateResponse, None]:
        """The generation's messages; closing the iterator early aborts it."""
        call, message = await self._open(request)
        is_done = False
        try:
            while message is not grpc.aio.EOF:
                assert isinstance(message, verifier_pb2.GenerateResponse)
                is_done = bool(message.finish_reason)
                yield message
                message = await call.read()
            is_done = True
        except grpc.aio.AioRpcError:
            is_done = True  # the RPC itself failed: nothing left to abort
            raise
        finally:
            if not is_done:
                self._abort_in_background(request.request_id, call)

    async def _open(
        self, request: verifier_pb2.GenerateRequest
    ) -> tuple[grpc.aio.UnaryStreamCall, object]:
        """Starts Generate and reads its first message, retrying only UNAVAILABLE."""
        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_unavailable),
            stop=stop_after_attempt(self.retry_attempts) | stop_after_delay(self.retry_timeout_s),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                call = self.stub.Generate(request, timeout=self.request_timeout_s,
                                          metadata=self._metadata)
                try:
                    first = await call.read()
                except BaseException:
                    call.cancel()
                    raise
                if attempt.retry_state.attempt_number > 1:
                    log.info("generate_retried", request_id=request.request_id,
                             attempts=attempt.retry_state.attempt_number)
                return call, first
        raise AssertionError("tenacity returned without a result")  # reraise=True

    def _abort_in_background(self, request_id: str, call: grpc.aio.UnaryStreamCall) -> None:
        """Abort first (it names the generation), then drop the stream. A task of its own:
        this runs where the caller is being cancelled and cannot await."""
        task = asyncio.get_running_loop().create_task(self._abort_then_cancel(request_id, call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_then_cancel(self, request_id: str, call: grpc.aio.UnaryStreamCall) -> None:
        try:
            found = await self.abort(request_id)
            log.info("generation_aborted", request_id=request_id, found=found)
        except grpc.aio.AioRpcError as exc:
            log.warning("abort_failed", request_id=request_id, code=exc.code().name)
        finally:
            call.cancel()

    async def abort(self, request_id: str) -> bool:
        reply = await self.stub.Abort(
            verifier_pb2.AbortRequest(request_id=request_id), timeout=self.rpc_timeout_s,
            metadata=self._metadata,
        )
        return bool(reply.found)

    async def model_info(self) -> verifier_pb2.ModelInfo:
        reply = await self.stub.GetModelInfo(
            verifier_pb2.ModelInfoRequest(), timeout=self.rpc_timeout_s, metadata=self._metadata
        )
        assert isinstance(reply, verifier_pb2.ModelInfo)
        return reply

    async def engine_stats(self) -> verifier_pb2.EngineStats:
        """The engine's load now (a short deadline: /health and /metrics wait on it)."""
        reply = await self.stub.GetStats(
            verifier_pb2.StatsRequest(), timeout=self.stats_timeout_s, metadata=self._metadata
        )
        assert isinstance(reply, verifier_pb2.EngineStats)
        return reply

    async def is_serving(self) -> bool:
        """grpc.health.v1 on the verifier; any RPC error counts as not serving."""
        assert self._health is not None, "VerifierClient.start() was not awaited"
        try:
            reply = await self._health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=self.stats_timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
