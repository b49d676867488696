"""The gateway's one gRPC channel to the verifier: generations, Abort, GetModelInfo,
GetStats and the grpc.health.v1 check; TLS and the token as the gateway's config says.

Generations go over ONE shared GenerateMany stream per gateway process (`shared_stream`,
the default): the verifier then sends one message per engine round for all of them
instead of one per generation, and its sends stop contending with the engine thread
(verifier_svc/generate_many.py). The stream is read on a thread of its own (`StreamThread`)
that hands the gateway's loop every message that came since its last turn at once.
Without it each generation is its own Generate call.

Every generation has a deadline (`request_timeout_s`). One that fails with UNAVAILABLE
before its first message arrived is retried (tenacity, with backoff, for up to
`retry_timeout_s`: long enough for `ddtree serve` to restart a dead verifier); once tokens
have reached the client it never is, since a half-streamed generation cannot be replayed.
A generation whose consumer stops early (stop string, client gone, error) is aborted on the
verifier, which frees its KV.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from contextlib import aclosing
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from ddtree import draft_socket
from ddtree.service import GrpcSecurity, open_aio_channel
from ddtree.v1 import verifier_pb2, verifier_pb2_grpc
from gateway.config import GatewayConfig

log = structlog.get_logger("gateway.verifier")


def _is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """A generation's end on the shared stream as the error its own call would raise."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


Update: TypeAlias = "verifier_pb2.GenerationUpdate | grpc.aio.AioRpcError"
T = TypeVar("T")


class StreamThread:
    """An event loop on a thread of its own, with its own channel to the verifier: where the
    shared stream is read. On the gateway's loop each read of a gRPC stream costs that loop
    two turns, and at 8 ar streams (~8,000 events a second) a turn is all the streams'
    events: the reads fell behind and the backlog sat in gRPC's buffers, out of reach of
    the merging that lets a busy gateway catch up (lease 41, ar c8 through `ddtree serve`:
    messages reached the loop 26-83 ms, on average, after the verifier built them). Here
    the reads keep pace on a loop that does nothing else and hand the gateway's loop
    everything that arrived since its last turn at once, so that each generation takes
    the waiting rounds as one event."""

    def __init__(self, address: str, security: GrpcSecurity) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="verifier-stream")
        self._thread.start()
        self.stub: verifier_pb2_grpc.VerifierStub | None = None
        self._channel = self.run(self._open(address, security)).result()

    async def _open(self, address: str, security: GrpcSecurity) -> grpc.aio.Channel:
        channel = open_aio_channel(address, security)  # bound to this thread's loop
        self.stub = verifier_pb2_grpc.VerifierStub(channel)
        return channel

    def run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def close(self) -> None:
        await asyncio.wrap_future(self.run(self._channel.close(grace=None)))
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join)
        self.loop.close()


class _SharedBase(ABC):
    """The queues (on the gateway's loop) of the generations started on one shared stream,
    filled from the thread that reads the stream (`_arrive`); `on_read` is told each
    message's `sent_unix_s` as the gateway's loop takes it up. A transport fills in how
    messages are written (`start`, `send`) and how the stream closes."""

    transport = ""

    def __init__(self, on_read: Callable[[float], None] | None) -> None:
        self.on_read = on_read
        self.queues: dict[str, asyncio.Queue[Update]] = {}
        self.error: grpc.aio.AioRpcError | None = None  # set once the stream has ended
        self._loop = asyncio.get_running_loop()  # the gateway's
        self._lock = threading.Lock()  # guards `_arrived` and `_is_handing`
        self._arrived: list[verifier_pb2.GenerateManyResponse] = []
        self._is_handing = False  # a hand-over is scheduled on the gateway's loop

    @abstractmethod
    def start(self, message: verifier_pb2.GenerateManyRequest,
              queue: asyncio.Queue[Update]) -> None:
        """Writes a generation's start; its messages (or its error) reach `queue`."""

    @abstractmethod
    async def send(self, message: verifier_pb2.GenerateManyRequest) -> None:
        """Writes a message (an abort) on the stream."""

    @abstractmethod
    async def close(self) -> None:
        """Ends the stream; returns once its end has reached the queues."""

    # ------------------------------------------------------------ on the reading thread

    def _arrive(self, responses: list[verifier_pb2.GenerateManyResponse]) -> None:
        with self._lock:
            self._arrived.extend(responses)
            if self._is_handing:
                return
            self._is_handing = True
        with contextlib.suppress(RuntimeError):  # the gateway's loop is gone
            self._loop.call_soon_threadsafe(self._hand_over)

    def _ended(self, error: grpc.aio.AioRpcError) -> None:
        with contextlib.suppress(RuntimeError):  # the gateway's loop is gone
            self._loop.call_soon_threadsafe(self._end, error)

    # ------------------------------------------------------------ on the gateway's loop

    def _hand_over(self) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
            self._is_handing = False
        for response in arrived:
            if self.on_read is not None and response.updates:
                self.on_read(response.updates[0].response.sent_unix_s)
            for update in response.updates:
                queue = self.queues.get(update.request_id)
                if queue is not None:  # else a generation that stopped listening
                    queue.put_nowait(update)

    def _end(self, error: grpc.aio.AioRpcError) -> None:
        self._hand_over()  # what came before the end first
        self.error = error
        for queue in self.queues.values():
            queue.put_nowait(error)


class SharedStream(_SharedBase):
    """One GenerateMany call, read on the `StreamThread`."""

    transport = "grpc"

    def __init__(self, thread: StreamThread, metadata: Sequence[tuple[str, str]] | None,
                 on_read: Callable[[float], None] | None = None) -> None:
        super().__init__(on_read)
        self.thread = thread
        # Both made on the thread's loop, by `_read`'s first step: it runs before any write
        # or cancel sent after it (one loop runs callbacks in the order they were sent).
        self.call: grpc.aio.StreamStreamCall | None = None
        self._writing: asyncio.Lock | None = None
        self._reader = thread.run(self._read(metadata))

    # ------------------------------------------------------------ on the stream's thread

    async def _read(self, metadata: Sequence[tuple[str, str]] | None) -> None:
        assert self.thread.stub is not None
        self.call = self.thread.stub.GenerateMany(metadata=metadata)
        self._writing = asyncio.Lock()  # one write at a time on a gRPC stream
        error = status_error(grpc.StatusCode.UNAVAILABLE, "the verifier ended the stream")
        try:
            async for response in self.call:
                self._arrive([response])
        except grpc.aio.AioRpcError as exc:
            error = exc
        except asyncio.CancelledError:
            error = status_error(grpc.StatusCode.CANCELLED, "the gateway closed the stream")
        finally:
            self._ended(error)

    async def _write(self, message: verifier_pb2.GenerateManyRequest) -> None:
        assert self.call is not None and self._writing is not None
        async with self._writing:
            await self.call.write(message)

    def _cancel(self) -> None:
        assert self.call is not None
        self.call.cancel()

    # ------------------------------------------------------------ on the gateway's loop

    async def send(self, message: verifier_pb2.GenerateManyRequest) -> None:
        if self.error is not None:
            raise self.error
        try:
            await asyncio.wrap_future(self.thread.run(self._write(message)))
        except grpc.aio.AioRpcError:
            raise
        except Exception as exc:  # written after the end (InvalidStateError, UsageError)
            raise self.error or status_error(grpc.StatusCode.UNAVAILABLE,
                                             "the verifier stream has ended") from exc

    def start(self, message: verifier_pb2.GenerateManyRequest,
              queue: asyncio.Queue[Update]) -> None:
        """Writes a generation's start without waiting for the write: its first message
        may come back before gRPC confirms the write (on the CPU harness the confirmation
        took 2.3 ms on average, the first message ~1.4). A failed write reaches `queue` as
        the error it raised. Writes go out in the order they were made (one loop, one lock),
        so an abort made after the start follows it."""
        if self.error is not None:
            raise self.error
        written = self.thread.run(self._write(message))

        def on_written(future: concurrent.futures.Future[None]) -> None:  # stream's thread
            if future.cancelled():
                return
            exc = future.exception()
            if exc is None:
                return
            error = exc if isinstance(exc, grpc.aio.AioRpcError) else (
                self.error or status_error(grpc.StatusCode.UNAVAILABLE,
                                           "the verifier stream has ended"))
            with contextlib.suppress(RuntimeError):  # the gateway's loop is gone
                self._loop.call_soon_threadsafe(queue.put_nowait, error)

        written.add_done_callback(on_written)

    async def close(self) -> None:
        self.thread.loop.call_soon_threadsafe(self._cancel)
        await asyncio.wrap_future(self._reader)  # `_end` ran: it was sent first


class SocketStream(_SharedBase):
    """The shared stream over the verifier's Unix socket (verifier_svc/local_socket.py), for
    a verifier on this host: the same messages, framed, read by a thread of its own that
    hands them over as the gRPC stream's reader does; writes go out from the gateway's loop
    at once (a small frame into a socket the verifier reads continuously; a send that
    stalls past `send_timeout_s` ends the stream). Python gRPC costs ~100-150 us of CPU a
    message on each side; a frame ~10-20."""

    transport = "unix"

    def __init__(self, sock: socket.socket, send_timeout_s: float,
                 on_read: Callable[[float], None] | None = None) -> None:
        super().__init__(on_read)
        self._sock = sock
        self._sender = sock.dup()  # its own timeout; the reader's changes per read
        self._sender.settimeout(send_timeout_s)
        self._send_lock = threading.Lock()
        self._closing = threading.Event()
        self._done = threading.Event()  # `_end` was sent to the gateway's loop
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="verifier-socket")
        self._reader.start()

    @classmethod
    async def open(cls, path: str, hello: bytes, timeout_s: float,
                   on_read: Callable[[float], None] | None = None) -> SocketStream:
        """Connects and says hello; OSError when the socket is missing, refuses or
        answers with anything but ok."""
        sock = await asyncio.to_thread(draft_socket.connect, path, hello, timeout_s)
        return cls(sock, timeout_s, on_read)

    def _read(self) -> None:  # the reader thread
        error = status_error(grpc.StatusCode.UNAVAILABLE, "the verifier ended the stream")
        frames = draft_socket.FrameReader(self._sock, self._closing)
        try:
            while True:
                self._arrive([verifier_pb2.GenerateManyResponse.FromString(frame)
                              for frame in frames.next_frames()])
        except (OSError, draft_socket.FrameError, DecodeError) as exc:
            error = (status_error(grpc.StatusCode.CANCELLED, "the gateway closed the stream")
                     if self._closing.is_set() else
                     status_error(grpc.StatusCode.UNAVAILABLE, f"the verifier socket ended: {exc}"))
        finally:
            self._sock.close()
            self._sender.close()
            self._ended(error)
            self._done.set()

    def _write(self, message: verifier_pb2.GenerateManyRequest) -> None:
        if self.error is not None:
            raise self.error
        frame = message.SerializeToString()
        try:
            with self._send_lock:
                draft_socket.send_frame(self._sender, frame)
        except OSError as exc:
            self.error = status_error(grpc.StatusCode.UNAVAILABLE,
                                      f"the verifier socket failed: {exc}")
            with contextlib.suppress(OSError):  # the reader ends the stream
                self._sock.shutdown(socket.SHUT_RDWR)
            raise self.error from exc

    def start(self, message: verifier_pb2.GenerateManyRequest,
              queue: asyncio.Queue[Update]) -> None:
        self._write(message)

    async def send(self, message: verifier_pb2.GenerateManyRequest) -> None:
        self._write(message)

    async def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        await asyncio.to_thread(self._done.wait)


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
        shared_stream: bool = True,
        verifier_socket: bool = True,
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
        self.shared_stream = shared_stream
        # The shared stream over the verifier's Unix socket where it advertises one this
        # process can open (a verifier on this host), else over gRPC.
        self.verifier_socket = verifier_socket
        self._shared: _SharedBase | None = None
        self._opening: asyncio.Lock | None = None  # one stream opened at a time
        self._stream_thread: StreamThread | None = None  # where the shared stream is read
        self._background: set[asyncio.Task[None]] = set()  # aborts in flight
        # Told each shared-stream message's `sent_unix_s` as it is read (the app's metrics).
        self.on_read: Callable[[float], None] | None = None

    @classmethod
    def from_config(cls, config: GatewayConfig) -> VerifierClient:
        return cls(config.verifier_addr, config.request_timeout_s, config.rpc_timeout_s,
                   config.retry_attempts, config.retry_timeout_s, config.stats_timeout_s,
                   config.security, config.shared_stream, config.verifier_socket)

    async def start(self) -> None:
        """Opens the channel (grpc.aio binds it to the running loop)."""
        self._channel = open_aio_channel(self.address, self.security)
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._opening = asyncio.Lock()
        if self.shared_stream:
            self._stream_thread = await asyncio.to_thread(StreamThread, self.address,
                                                          self.security)

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=self.rpc_timeout_s)
        if self._shared is not None:
            await self._shared.close()
        if self._stream_thread is not None:
            await self._stream_thread.close()
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
        async with aclosing(self.generate_batches(request)) as batches:
            async for batch in batches:
                for message in batch:
                    yield message

    def generate_batches(
        self, request: verifier_pb2.GenerateRequest
    ) -> AsyncGenerator[list[verifier_pb2.GenerateResponse], None]:
        """The generation's messages in lists: the next message and every one that arrived
        while the caller handled the list before (a busy gateway handles several rounds at
        once instead of falling behind); closing the iterator early aborts it. Over the
        shared stream the messages wait in the generation's queue already; a call of its
        own gets a reader task (`as_available`). The generator itself, not a wrapper: every
        layer is a coroutine step per message on the gateway's loop."""
        return (self._generate_shared(request) if self.shared_stream
                else as_available(self._generate_alone(request)))

    # ------------------------------------------------------------ over the shared stream

    @property
    def transport(self) -> str:
        """How the shared stream travels now: "unix", "grpc", "" (none open)."""
        shared = self._shared
        return shared.transport if shared is not None and shared.error is None else ""

    async def _stream(self) -> _SharedBase:
        """The live shared stream, opened anew after the last one ended."""
        assert self._opening is not None, "VerifierClient.start() was not awaited"
        async with self._opening:
            if self._shared is None or self._shared.error is not None:
                self._shared = await self._open_shared()
            return self._shared

    async def _open_shared(self) -> _SharedBase:
        """Over the verifier's Unix socket when it advertises one that opens from here
        (GetModelInfo names it and the verifier process), else over gRPC."""
        if self.verifier_socket:
            try:
                info = await self.model_info()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    raise  # restarting: the caller retries (and then opens its socket)
                info = None  # the gRPC stream says what is wrong
            if info is not None and info.local_socket:
                hello = draft_socket.hello(info.instance_id, self.security.token,
                                           draft_socket.MANY_PREFIX)
                try:
                    stream = await SocketStream.open(info.local_socket, hello,
                                                     self.rpc_timeout_s, self.on_read)
                except OSError as exc:
                    log.info("verifier_socket_unavailable", path=info.local_socket,
                             reason=str(exc))
                else:
                    log.info("verifier_stream_open", transport="unix",
                             path=info.local_socket)
                    return stream
        assert self._stream_thread is not None, "VerifierClient.start() was not awaited"
        log.info("verifier_stream_open", transport="grpc", address=self.address)
        return SharedStream(self._stream_thread, self._metadata, self.on_read)

    async def _generate_shared(
        self, request: verifier_pb2.GenerateRequest
    ) -> AsyncGenerator[list[verifier_pb2.GenerateResponse], None]:
        if not request.request_id:
            raise ValueError("a generation on the shared stream needs a request_id")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        stream, queue, message = await self._start_shared(request, deadline)
        # Past the deadline the error queues behind what came before it: one timer for the
        # generation, not a timeout scope around every message's wait (~5% of the
        # gateway's loop at ar c8 on the CPU harness).
        expiry = loop.call_at(deadline, queue.put_nowait, status_error(
            grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
        is_done = False
        try:
            while True:
                batch, failure = [message], None
                is_done = bool(message.finish_reason)
                while not is_done and not queue.empty():  # those that queued meanwhile
                    try:
                        message = self._unwrap(queue.get_nowait())
                    except grpc.aio.AioRpcError as exc:
                        failure = exc  # after the messages before it
                        break
                    batch.append(message)
                    is_done = bool(message.finish_reason)
                yield batch
                if failure is not None:
                    raise failure
                if is_done:
                    return
                message = self._unwrap(await queue.get())
        except grpc.aio.AioRpcError as exc:
            # Ended by the verifier (or the stream broke): nothing left to abort; past its
            # deadline it still runs there.
            is_done = exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED
            raise
        finally:
            expiry.cancel()
            stream.queues.pop(request.request_id, None)
            if not is_done:
                self._abort_shared(stream, request.request_id)

    async def _start_shared(
        self, request: verifier_pb2.GenerateRequest, deadline: float
    ) -> tuple[_SharedBase, asyncio.Queue[Update], verifier_pb2.GenerateResponse]:
        """Starts the generation and reads its first message, retrying only UNAVAILABLE
        (a verifier that is restarting: the next try opens a new stream)."""
        async for attempt in self._retrying():
            with attempt:
                stream, queue = await self._stream(), asyncio.Queue[Update]()
                stream.queues[request.request_id] = queue
                try:
                    stream.start(verifier_pb2.GenerateManyRequest(start=request), queue)
                    first = await self._next(queue, deadline)
                except grpc.aio.AioRpcError as exc:
                    stream.queues.pop(request.request_id, None)
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        self._abort_shared(stream, request.request_id)
                    raise
                except BaseException:  # cancelled while waiting: it may be running
                    stream.queues.pop(request.request_id, None)
                    self._abort_shared(stream, request.request_id)
                    raise
                if attempt.retry_state.attempt_number > 1:
                    log.info("generate_retried", request_id=request.request_id,
                             attempts=attempt.retry_state.attempt_number)
                return stream, queue, first
        raise AssertionError("tenacity returned without a result")  # reraise=True

    @staticmethod
    async def _next(queue: asyncio.Queue[Update], deadline: float
                    ) -> verifier_pb2.GenerateResponse:
        if queue.empty():
            try:
                async with asyncio.timeout_at(deadline):
                    update = await queue.get()
            except TimeoutError:
                raise status_error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "Deadline Exceeded") from None
        else:
            update = queue.get_nowait()
        return VerifierClient._unwrap(update)

    @staticmethod
    def _unwrap(update: Update) -> verifier_pb2.GenerateResponse:
        if isinstance(update, grpc.aio.AioRpcError):
            raise update
        if update.error_code:
            raise status_error(_CODES.get(update.error_code, grpc.StatusCode.UNKNOWN),
                               update.error_message)
        return update.response

    def _abort_shared(self, stream: _SharedBase, request_id: str) -> None:
        """Aborts on the stream (a task: this runs where the caller is being cancelled);
        a stream that has ended needs none: the verifier cancelled its generations."""
        async def abort() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stream.send(verifier_pb2.GenerateManyRequest(abort=request_id))
                log.info("generation_aborted", request_id=request_id)

        if stream.error is None:
            task = asyncio.get_running_loop().create_task(abort())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------ one Generate call each

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception(_is_unavailable),
            stop=stop_after_attempt(self.retry_attempts) | stop_after_delay(self.retry_timeout_s),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )

    async def _generate_alone(
        self, request: verifier_pb2.GenerateRequest
    ) -> AsyncGenerator[verifier_pb2.GenerateResponse, None]:
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
        async for attempt in self._retrying():
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


_END = object()  # the end of the messages, in `as_available`'s queue


async def as_available(messages: AsyncGenerator[verifier_pb2.GenerateResponse, None],
                       ) -> AsyncGenerator[list[verifier_pb2.GenerateResponse], None]:
    """The messages in lists: each list holds the next message and every message that
    arrived while the caller handled the list before. A reader task keeps reading; closing
    this generator cancels it and closes `messages` (aborting an unfinished generation)."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def read() -> None:
        try:
            async for message in messages:
                queue.put_nowait(message)
            queue.put_nowait(_END)
        except Exception as exc:  # handed over in order, raised where the caller reads
            queue.put_nowait(exc)

    reader = asyncio.get_running_loop().create_task(read())
    try:
        while True:
            batch: list[verifier_pb2.GenerateResponse] = []
            item = await queue.get()
            while True:
                if item is _END:
                    if batch:
                        yield batch
                    return
                if isinstance(item, Exception):
                    if batch:
                        yield batch
                    raise item
                batch.append(item)
                if queue.empty():
                    break
                item = queue.get_nowait()
            yield batch
    finally:
        if not reader.done():
            reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await messages.aclose()
