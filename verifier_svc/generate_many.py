"""GenerateMany: many generations over one bidirectional stream (the gateway's path).

Starts and aborts come in on the stream, read by a thread of the stream's own; every
generation's results go to the stream's `Outbox`, which the engine thread flushes once per
step, so the writer (the RPC's thread) sends ONE message per round for all of them, where
Generate sends one per generation, each from its own thread (at concurrency 8 through the
gateway that was eight sends and eight threads contending for the engine thread's GIL
every round). When the stream ends or breaks, every generation it started is cancelled.
The same stream runs over the verifier's Unix socket for a gateway on this host
(verifier_svc/local_socket.py): only the transport's reads and writes differ.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

import structlog

from ddtree.engine import GenerationRequest, RoundResult
from ddtree.errors import InvalidArgumentError
from ddtree.stats import GenerationStats
from ddtree.v1 import verifier_pb2
from verifier_svc.scheduler import Generation, Item, Outbox, Scheduler
from verifier_svc.status import status_of

log = structlog.get_logger("verifier_svc")

Respond = Callable[[list[RoundResult], GenerationStats | None, verifier_pb2.GenerateResponse,
                   float], verifier_pb2.GenerateResponse]
Convert = Callable[[verifier_pb2.GenerateRequest], GenerationRequest]


class _Refused(Exception):
    """A start refused before it became a generation of the stream (its error update must
    not end a live generation that has the same request_id)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ManyStream:
    """One GenerateMany stream: `run` is its response iterator; its transport calls
    `cancel_all` when the client is gone."""

    def __init__(self, scheduler: Scheduler, convert: Convert, respond: Respond,
                 peer: str) -> None:
        self.scheduler, self.convert, self.respond = scheduler, convert, respond
        self.peer = peer
        self.outbox = Outbox()
        self._lock = threading.Lock()  # guards `_live` (reader thread vs writer)
        self._live: dict[str, Generation] = {}
        self._reading = True  # the client may still start generations

    def run(self, requests: Iterable[verifier_pb2.GenerateManyRequest],
            is_active: Callable[[], bool]) -> Iterator[verifier_pb2.GenerateManyResponse]:
        """The messages to send, until the client half-closed and every generation ended,
        or `is_active()` is false (the client is gone)."""
        reader = threading.Thread(target=self._read, args=(requests,), daemon=True,
                                  name="generate-many-reader")
        reader.start()
        while is_active():
            items = self.outbox.take(timeout_s=1.0)
            if items:
                yield self._message(items)
                continue
            with self._lock:
                if not self._reading and not self._live:
                    return  # the client half-closed and every generation ended

    # ------------------------------------------------------------ reader thread

    def _read(self, requests: Iterable[verifier_pb2.GenerateManyRequest]) -> None:
        try:
            for message in requests:
                kind = message.WhichOneof("kind")
                if kind == "start":
                    self._start(message.start)
                elif kind == "abort":
                    with self._lock:
                        generation = self._live.get(message.abort)
                    if generation is not None:
                        self.scheduler.cancel(generation)
        except Exception:  # noqa: BLE001 - the stream broke or was cancelled: the callback
            pass           # cancels what it started
        finally:
            with self._lock:
                self._reading = False
            self.outbox.wake()  # a half-closed stream with nothing running ends now

    def _start(self, message: verifier_pb2.GenerateRequest) -> None:
        request_id = message.request_id
        try:
            if not request_id:
                raise InvalidArgumentError("GenerateMany: every start needs a request_id")
            with self._lock:
                if request_id in self._live:
                    raise InvalidArgumentError(
                        f"request_id {request_id!r} is already running on this stream")
            generation = Generation(request_id, self.convert(message), self.peer,
                                    outbox=self.outbox)
        except Exception as exc:  # noqa: BLE001 - the one generation fails, the stream lives
            self.outbox.put(request_id, _Refused(exc))
            self.outbox.flush()
            return
        with self._lock:
            self._live[request_id] = generation
        # Not waiting for the engine thread: the next start is read at once, and several
        # join the same step. A refusal comes back through the outbox.
        self.scheduler.enqueue(generation)
        log.info("generate_started", request_id=request_id, mode=generation.request.spec.mode,
                 num_prompt_tokens=len(message.prompt_ids), stream="many")

    def has_live(self) -> bool:
        """Whether a generation of the stream is still running (or queued)."""
        with self._lock:
            return bool(self._live)

    def cancel_all(self) -> None:
        """Cancels every generation of the stream (the client is gone: free the rows)."""
        with self._lock:
            live = list(self._live.values())
        for generation in live:
            self.scheduler.cancel(generation)

    # ------------------------------------------------------------ writer (the RPC thread)

    def _message(self, items: list[tuple[str, Item]]) -> verifier_pb2.GenerateManyResponse:
        """One message for everything waiting: each generation's consecutive results in one
        update, an error as an update of its own after them."""
        response = verifier_pb2.GenerateManyResponse()
        waiting: dict[str, list[RoundResult]] = {}
        for request_id, item in items:
            if isinstance(item, _Refused):
                code, text = status_of(item.error, "GenerateMany")
                response.updates.add(request_id=request_id, error_code=code.value[0],
                                     error_message=text)
            elif isinstance(item, BaseException):
                self._add_results(response, request_id, waiting.pop(request_id, []))
                code, text = status_of(item, "GenerateMany")
                response.updates.add(request_id=request_id, error_code=code.value[0],
                                     error_message=text)
                self._ended(request_id, "", code.name)
            else:
                waiting.setdefault(request_id, []).append(item)
        for request_id, results in waiting.items():
            self._add_results(response, request_id, results)
        return response

    def _add_results(self, response: verifier_pb2.GenerateManyResponse, request_id: str,
                     results: list[RoundResult]) -> None:
        if not results:
            return
        update = response.updates.add(request_id=request_id)
        with self._lock:
            generation = self._live.get(request_id)
        received = generation.received_unix_s if generation is not None else 0.0
        self.respond(results, results[-1].stats, update.response, received)
        if results[-1].finished:
            self._ended(request_id, update.response.finish_reason, "OK")

    def _ended(self, request_id: str, finish_reason: str, status: str) -> None:
        """finish_reason: "" when the generation did not run to its end (status says why)."""
        with self._lock:
            self._live.pop(request_id, None)
        log.info("generate_finished", request_id=request_id, stream="many",
                 finish_reason=finish_reason, status=status)
