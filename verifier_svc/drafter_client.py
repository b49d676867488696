"""The verifier's side of the drafter link: ONE channel and ONE long-lived bidirectional
Draft stream; each round sends one DraftRequest carrying the DraftBatch of every active
generation and waits (with a deadline) for the reply of the same round_id.

Any failure (stream error, reply timeout) closes the stream and raises
`DrafterUnavailable`; the caller falls back to ar for the generations of that round while
a background thread reconnects with exponential backoff (tenacity). Only UNAVAILABLE and
DEADLINE_EXCEEDED are retried, and only for GetInfo, which carries no generation.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass

import grpc
import structlog
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_exponential,
)

from ddtree.draft_codec import DRAFT_WIRE_VERSION
from ddtree.models.target_config import TargetConfig
from ddtree.service import GrpcSecurity, open_channel
from ddtree.v1 import drafter_pb2, drafter_pb2_grpc

log = structlog.get_logger("verifier_svc.drafter_client")

_RETRIED_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class DrafterUnavailable(Exception):
    """The drafter cannot answer this round (down, stream broken, or too slow)."""


class _DraftStream:
    """One Draft call: requests go through a queue, a reader thread queues the replies.
    SimpleQueue: a put / get is one lock hand-off in C (queue.Queue's is a Python
    Condition); measured against the engine thread reading the call itself (no reader
    thread, a watchdog for the deadline) on loopback, no hand-off was faster: gRPC's own
    threads dominate the round trip.

    Several draft rounds may be outstanding at once (the engine's two alternating groups):
    the drafter answers in order, and a reply that arrives while another round is awaited
    is kept for its own `receive` when its round is still outstanding (other replies -
    release-only requests, abandoned rounds - are dropped). Read from one thread only."""

    def __init__(self, stub: drafter_pb2_grpc.DrafterStub) -> None:
        self._requests: queue.SimpleQueue[drafter_pb2.DraftRequest | None] = queue.SimpleQueue()
        self._replies: queue.SimpleQueue[drafter_pb2.DraftResponse | Exception] = (
            queue.SimpleQueue())
        self._outstanding: set[int] = set()  # draft rounds sent, not yet received
        self._early: dict[int, drafter_pb2.DraftResponse] = {}  # their replies, arrived
        self._failure: Exception | None = None  # once the stream failed, every receive fails
        # No deadline on the call itself (it lives as long as the connection); every
        # round has its own deadline in `receive`.
        self._call = stub.Draft(iter(self._requests.get, None))
        threading.Thread(target=self._read, name="draft-stream-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._replies.put(reply)
            self._replies.put(DrafterUnavailable("the drafter closed the Draft stream"))
        except grpc.RpcError as exc:
            self._replies.put(DrafterUnavailable(f"Draft stream failed: {exc.code().name}"))

    def send(self, request: drafter_pb2.DraftRequest, awaited: bool = False) -> None:
        """Queues `request`; `awaited`: its reply will be claimed by `receive`."""
        if awaited:
            self._outstanding.add(request.round_id)
        self._requests.put(request)

    def receive(self, round_id: int, timeout_s: float) -> drafter_pb2.DraftResponse:
        """The reply of draft round `round_id` (sent with awaited=True), within timeout_s."""
        try:
            return self._receive(round_id, timeout_s)
        finally:
            self._outstanding.discard(round_id)

    def _receive(self, round_id: int, timeout_s: float) -> drafter_pb2.DraftResponse:
        early = self._early.pop(round_id, None)
        if early is not None:
            return early
        if self._failure is not None:
            raise self._failure
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise DrafterUnavailable(f"no draft reply within {timeout_s:.1f} s") from None
            if isinstance(reply, Exception):
                self._failure = reply
                raise reply
            # A wait can return after its timeout with a reply that landed late (a busy
            # host schedules the waiter late): late is late, whenever it is noticed.
            if time.monotonic() > deadline:
                raise DrafterUnavailable(f"no draft reply within {timeout_s:.1f} s")
            if reply.round_id == round_id:
                return reply
            if reply.round_id in self._outstanding:
                self._early[reply.round_id] = reply

    def forget(self, round_id: int) -> None:
        """A round whose reply will not be claimed (dropped on arrival)."""
        self._outstanding.discard(round_id)
        self._early.pop(round_id, None)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


def incompatibility(info: drafter_pb2.DrafterInfo, target: TargetConfig) -> str | None:
    """Why this drafter cannot serve this target, or None when the pair fits."""
    if info.hidden_size != target.hidden_size:
        return f"drafter hidden size {info.hidden_size} != target's {target.hidden_size}"
    if info.vocab_size != target.vocab_size:
        return f"drafter vocab size {info.vocab_size} != target's {target.vocab_size}"
    if info.num_target_layers and info.num_target_layers != target.num_layers:
        return (f"drafter was trained on a {info.num_target_layers}-layer target; this one has "
                f"{target.num_layers}")
    bad = [i for i in info.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        return f"drafter reads target layers {bad} outside [0, {target.num_layers})"
    return None


def wire_problem(info: drafter_pb2.DrafterInfo) -> str | None:
    """Why this drafter cannot speak to this verifier, or None (it needs the batched
    rounds of Draft wire version 2; see drafter.proto)."""
    version = info.wire_version or 1
    if version < DRAFT_WIRE_VERSION:
        return (f"drafter speaks Draft wire version {version}; this verifier needs "
                f"{DRAFT_WIRE_VERSION} (upgrade the drafter)")
    return None


@dataclass(frozen=True)
class DraftTicket:
    """A draft round sent and not yet received: its stream and round_id."""

    stream: _DraftStream
    round_id: int


class DrafterClient:
    """Owns the drafter channel; `draft` is called from the verifier's engine thread only."""

    def __init__(self, address: str, round_timeout_s: float, connect_timeout_s: float,
                 target: TargetConfig | None = None,
                 security: GrpcSecurity | None = None) -> None:
        self.address = address
        self.target = target  # the drafter's info is checked against it on every connect
        self.round_timeout_s = round_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._channel = open_channel(address, security)  # token and TLS as configured
        self._stub = drafter_pb2_grpc.DrafterStub(self._channel)
        self._round_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stream: _DraftStream | None = None
        self._info: drafter_pb2.DrafterInfo | None = None
        self._closed = threading.Event()
        self._reconnecting = False

    @property
    def info(self) -> drafter_pb2.DrafterInfo | None:
        """The connected drafter's info; None while disconnected."""
        with self._lock:
            return self._info if self._stream is not None else None

    def connect(self, wait: bool) -> None:
        """Connects now (`wait`: block until connected or the first backoff window ends)."""
        with self._lock:
            if self._stream is not None or self._reconnecting:
                return
            self._reconnecting = True
        thread = threading.Thread(target=self._reconnect, name="drafter-reconnect", daemon=True)
        thread.start()
        if wait:
            thread.join(timeout=self.connect_timeout_s)

    def _reconnect(self) -> None:
        retrying = Retrying(
            retry=retry_if_exception(
                lambda exc: isinstance(exc, grpc.RpcError) and exc.code() in _RETRIED_CODES
            ),
            wait=wait_exponential(multiplier=0.2, max=5.0),
            stop=lambda _state: self._closed.is_set(),
            sleep=self._sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            info = retrying(
                self._stub.GetInfo,
                drafter_pb2.DrafterInfoRequest(),
                timeout=self.connect_timeout_s,
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            log.error("drafter_connect_failed", address=self.address, code=exc.code().name)
            with self._lock:
                self._reconnecting = False
            return
        problem = incompatibility(info, self.target) if self.target is not None else None
        problem = problem or wire_problem(info)
        if problem is not None:
            # Misconfiguration would otherwise run silently at acceptance ~1: refuse it.
            log.error("drafter_incompatible", address=self.address, problem=problem)
            with self._lock:
                self._reconnecting = False
            return
        stream = _DraftStream(self._stub)
        with self._lock:
            self._stream, self._info, self._reconnecting = stream, info, False
        log.info(
            "drafter_connected",
            address=self.address,
            drafter=info.drafter_id,
            block_size=info.block_size,
        )

    def _sleep(self, seconds: float) -> None:
        """Backoff that `close` cuts short."""
        self._closed.wait(seconds)

    def release(self, session_ids: list[str]) -> None:
        """Frees the sessions' draft KV; the stream is ordered, so this lands before the
        next round. Without a stream there is nothing to free: the drafter drops a stream's
        sessions when the stream ends."""
        with self._lock:
            stream = self._stream
        if stream is not None and session_ids:
            stream.send(
                drafter_pb2.DraftRequest(
                    round_id=next(self._round_ids), release_sessions=session_ids
                )
            )

    def exchange(self, request: drafter_pb2.DraftRequest,
                 timeout_s: float) -> drafter_pb2.DraftTrees:
        """One round: `request`, its batch of all the round's rows built by the caller
        (in place: no copy of the features), gets its round_id here -> their trees."""
        return self.receive(self.send(request), timeout_s)

    def send(self, request: drafter_pb2.DraftRequest) -> DraftTicket:
        """Sends a draft round now (its round_id is set here) and returns at once; its
        trees come from `receive(ticket, ...)`. Raises DrafterUnavailable when there is no
        stream."""
        with self._lock:
            stream = self._stream
        if stream is None:
            raise DrafterUnavailable("not connected to the drafter")
        request.round_id = next(self._round_ids)
        stream.send(request, awaited=True)
        return DraftTicket(stream, request.round_id)

    def post(self, request: drafter_pb2.DraftRequest) -> None:
        """Sends a request whose reply nobody waits for (it is dropped on arrival): a new
        row's session opened ahead of its first drafted round. Raises DrafterUnavailable
        when there is no stream."""
        with self._lock:
            stream = self._stream
        if stream is None:
            raise DrafterUnavailable("not connected to the drafter")
        request.round_id = next(self._round_ids)
        stream.send(request)

    def receive(self, ticket: DraftTicket, timeout_s: float) -> drafter_pb2.DraftTrees:
        """The trees of a round sent by `send` (rounds are received in the order sent)."""
        try:
            reply = ticket.stream.receive(ticket.round_id, timeout_s)
        except DrafterUnavailable as exc:
            self._on_failure(ticket.stream, str(exc))
            raise
        return reply.trees

    def _on_failure(self, stream: _DraftStream, reason: str) -> None:
        log.warning("drafter_lost", address=self.address, reason=reason)
        stream.close()
        with self._lock:
            if self._stream is stream:
                self._stream, self._info = None, None
        if not self._closed.is_set():
            self.connect(wait=False)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        self._channel.close()


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    code = exc.code().name if isinstance(exc, grpc.RpcError) else repr(exc)
    log.info("drafter_connect_retry", attempt=state.attempt_number, code=code)
