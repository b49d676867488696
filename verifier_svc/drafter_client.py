"""The verifier's side of the drafter link: ONE channel and ONE long-lived bidirectional
Draft stream; each round sends one DraftRequest carrying the DraftBatch of every active
generation and waits (with a deadline) for the reply of the same round_id. The stream
travels over the drafter's Unix socket when the drafter advertises one this host can
open (ddtree/draft_socket.py: same messages, no gRPC threads), over gRPC otherwise.

Any failure (stream error, reply timeout) closes the stream and raises
`DrafterUnavailable`; the caller falls back to ar for the generations of that round while
a background thread reconnects with exponential backoff (tenacity). Only UNAVAILABLE and
DEADLINE_EXCEEDED are retried, and only for GetInfo, which carries no generation.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import structlog
from google.protobuf.message import DecodeError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_exponential,
)

from ddtree import draft_socket
from ddtree.draft_codec import DRAFT_WIRE_VERSION
from ddtree.models.target_config import TargetConfig
from ddtree.service import GrpcSecurity, open_channel
from ddtree.v1 import drafter_pb2, drafter_pb2_grpc

log = structlog.get_logger("verifier_svc.drafter_client")

_RETRIED_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class DrafterUnavailable(Exception):
    """The drafter cannot answer this round (down, stream broken, or too slow)."""


class _Stream(abc.ABC):
    """One Draft stream as the engine uses it: `send` queues a request, `receive` claims
    the reply of one round. Several draft rounds may be outstanding at once (the
    engine's two alternating groups, a round asked for ahead): the drafter answers in
    order, and a reply that arrives while another round is awaited is kept for its own
    `receive` when its round is still outstanding (other replies - release-only
    requests, abandoned rounds - are dropped). Read from one thread only; `send` from
    any. Once the stream failed, every receive fails."""

    transport = ""

    def __init__(self) -> None:
        self._outstanding: set[int] = set()  # draft rounds sent, not yet received
        self._early: dict[int, drafter_pb2.DraftResponse] = {}  # their replies, arrived
        self._failure: Exception | None = None

    def send(self, request: drafter_pb2.DraftRequest, awaited: bool = False) -> None:
        """Sends `request`; `awaited`: its reply will be claimed by `receive`."""
        if awaited:
            self._outstanding.add(request.round_id)
        self._send(request)

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
            reply = self._next_reply(deadline, timeout_s)
            # A wait can return after its timeout with a reply that landed late (a busy
            # host schedules the waiter late): late is late, whenever it is noticed.
            if time.monotonic() > deadline:
                raise DrafterUnavailable(f"no draft reply within {timeout_s:.1f} s")
            if reply.round_id == round_id:
                return reply
            if reply.round_id in self._outstanding:
                self._early[reply.round_id] = reply

    def _fail(self, exc: DrafterUnavailable) -> DrafterUnavailable:
        self._failure = exc
        return exc

    def forget(self, round_id: int) -> None:
        """A round whose reply will not be claimed (dropped on arrival)."""
        self._outstanding.discard(round_id)
        self._early.pop(round_id, None)

    @abc.abstractmethod
    def _send(self, request: drafter_pb2.DraftRequest) -> None:
        """Hands `request` to the transport; a failure is kept for the next receive."""

    @abc.abstractmethod
    def _next_reply(self, deadline: float, timeout_s: float) -> drafter_pb2.DraftResponse:
        """The next reply on the stream, before `deadline`; DrafterUnavailable otherwise."""

    @abc.abstractmethod
    def close(self) -> None:
        """Ends the stream (the drafter frees its sessions)."""


class _DraftStream(_Stream):
    """The Draft call over gRPC: requests go through a queue, a reader thread queues the
    replies. SimpleQueue: a put / get is one lock hand-off in C (queue.Queue's is a
    Python Condition); measured against the engine thread reading the call itself (no
    reader thread, a watchdog for the deadline) on loopback, no hand-off was faster:
    gRPC's own threads dominate the round trip."""

    transport = "grpc"

    def __init__(self, stub: drafter_pb2_grpc.DrafterStub) -> None:
        super().__init__()
        self._requests: queue.SimpleQueue[drafter_pb2.DraftRequest | None] = queue.SimpleQueue()
        self._replies: queue.SimpleQueue[drafter_pb2.DraftResponse | Exception] = (
            queue.SimpleQueue())
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

    def _send(self, request: drafter_pb2.DraftRequest) -> None:
        self._requests.put(request)

    def _next_reply(self, deadline: float, timeout_s: float) -> drafter_pb2.DraftResponse:
        try:
            reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise DrafterUnavailable(f"no draft reply within {timeout_s:.1f} s") from None
        if isinstance(reply, Exception):
            self._failure = reply
            raise reply
        return reply

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


class _SocketDraftStream(_Stream):
    """The Draft stream over the drafter's Unix socket (ddtree/draft_socket.py): the
    engine thread writes its request and reads the replies itself, no thread between
    (Python gRPC's threads cost ~0.3-0.9 ms a round trip; the socket's ~0.02). Sends
    from other threads (releases) take a lock; a send that fails or stalls past
    `send_timeout_s` fails the stream, which the next receive reports."""

    transport = "unix"

    def __init__(self, path: str, hello: bytes, connect_timeout_s: float,
                 send_timeout_s: float) -> None:
        """Connects and says hello; OSError when the socket is missing, refuses, or
        answers the hello with anything but ok (another drafter, a wrong token)."""
        super().__init__()
        sock = draft_socket.connect(path, hello, connect_timeout_s)
        self._sock = sock
        self._sender = sock.dup()  # its own timeout; the reader's changes per read
        self._sender.settimeout(send_timeout_s)
        self._send_lock = threading.Lock()

    def _send(self, request: drafter_pb2.DraftRequest) -> None:
        frame = request.SerializeToString()
        try:
            with self._send_lock:
                draft_socket.send_frame(self._sender, frame)
        except OSError as exc:
            self._fail(DrafterUnavailable(f"Draft socket failed: {exc}"))
            self._shutdown()

    def _next_reply(self, deadline: float, timeout_s: float) -> drafter_pb2.DraftResponse:
        try:
            frame = draft_socket.recv_frame(self._sock, deadline)
        except TimeoutError:
            # A partly read frame leaves the stream out of step: it cannot go on.
            raise self._fail(DrafterUnavailable(
                f"no draft reply within {timeout_s:.1f} s")) from None
        except (OSError, draft_socket.FrameError) as exc:
            raise self._fail(DrafterUnavailable(f"Draft socket failed: {exc}")) from None
        try:
            return drafter_pb2.DraftResponse.FromString(frame)
        except DecodeError:
            raise self._fail(DrafterUnavailable("malformed reply on the Draft socket")) from None

    def _shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._shutdown()
        self._sender.close()
        self._sock.close()


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

    stream: _Stream
    round_id: int


class DrafterClient:
    """Owns the drafter channel; `draft` is called from the verifier's engine thread only."""

    def __init__(self, address: str, round_timeout_s: float, connect_timeout_s: float,
                 target: TargetConfig | None = None,
                 security: GrpcSecurity | None = None, use_socket: bool = True) -> None:
        """use_socket: take the drafter's Unix socket when it advertises one this host can
        open (the same Draft stream without gRPC's threads); the gRPC stream otherwise."""
        self.address = address
        self.use_socket = use_socket
        self._token = security.token if security is not None else ""
        self.target = target  # the drafter's info is checked against it on every connect
        self.round_timeout_s = round_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._channel = open_channel(address, security)  # token and TLS as configured
        self._stub = drafter_pb2_grpc.DrafterStub(self._channel)
        self._round_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._info: drafter_pb2.DrafterInfo | None = None
        self._closed = threading.Event()
        self._reconnecting = False
        # Called (on the reconnecting thread) with the drafter's info once connected.
        self._on_connect: list[Callable[[drafter_pb2.DrafterInfo], None]] = []

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
        stream = self._open_stream(info)
        with self._lock:
            self._stream, self._info, self._reconnecting = stream, info, False
        log.info(
            "drafter_connected",
            address=self.address,
            drafter=info.drafter_id,
            block_size=info.block_size,
            transport=stream.transport,
        )
        for listener in list(self._on_connect):
            listener(info)

    def add_connect_listener(self, listener: Callable[[drafter_pb2.DrafterInfo], None]) -> None:
        """`listener(info)` after every (re)connect, on the reconnecting thread."""
        self._on_connect.append(listener)

    def remove_connect_listener(self, listener: Callable[[drafter_pb2.DrafterInfo], None]
                                ) -> None:
        if listener in self._on_connect:
            self._on_connect.remove(listener)

    def _open_stream(self, info: drafter_pb2.DrafterInfo) -> _Stream:
        """The drafter's Unix socket where it has one this process can open, else the
        gRPC stream (a drafter on another host, another container without the shared
        socket volume, or `use_socket` off)."""
        if self.use_socket and info.local_socket:
            try:
                return _SocketDraftStream(
                    info.local_socket, draft_socket.hello(info.instance_id, self._token),
                    self.connect_timeout_s, self.round_timeout_s)
            except OSError as exc:
                log.info("drafter_socket_unavailable", address=self.address,
                         reason=str(exc))
        return _DraftStream(self._stub)

    @property
    def transport(self) -> str | None:
        """"unix" or "grpc": how the Draft stream travels; None while disconnected."""
        with self._lock:
            return self._stream.transport if self._stream is not None else None

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

    @property
    def token(self) -> str:
        """The token the drafter requires (sent in socket hellos)."""
        return self._token

    def reset(self, reason: str) -> None:
        """Something else on the link to this drafter failed (the shared draft link): the
        stream is closed and the drafter looked up again (it may have restarted)."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            self._on_failure(stream, reason)

    def _on_failure(self, stream: _Stream, reason: str) -> None:
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
