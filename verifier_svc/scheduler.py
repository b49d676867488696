"""The engine thread: the ONE thread that touches the target model and the engine.

It loops `Engine.step()` (admission, then one round for every running generation) and
hands each generation's RoundResults to the RPC thread streaming it (Generate: one queue
per generation; GenerateMany: one outbox per stream, flushed once per step). Everything else that
touches the engine - admitting a request, aborting one, the client sessions' calls - runs
on this thread between steps as a job (`call`), so the engine needs no locks.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from ddtree.engine import Engine, GenerationRequest, RoundResult
from ddtree.engine.sessions import ClientSessions
from ddtree.stats import GenerationStats
from ddtree.v1 import verifier_pb2

log = structlog.get_logger("verifier_svc.scheduler")

T = TypeVar("T")

# Below this mean acceptance length over enough rounds, the drafter is almost surely not
# the target's (or its target layers are wrong): say so instead of serving slowly in silence.
MIN_HEALTHY_ACCEPTANCE, MIN_ROUNDS_TO_JUDGE = 1.1, 32


def warn_if_acceptance_near_one(request_id: str, stats: GenerationStats | None) -> None:
    if stats is None or stats.num_rounds < MIN_ROUNDS_TO_JUDGE or stats.mode == "ar":
        return
    if stats.mean_acceptance_length < MIN_HEALTHY_ACCEPTANCE:
        log.warning("acceptance_near_one", request_id=request_id,
                    mean_acceptance_length=round(stats.mean_acceptance_length, 3),
                    num_rounds=stats.num_rounds,
                    hint="is the drafter trained for this target (and its layer ids)?")


class GenerationAborted(Exception):
    """The generation was stopped by Abort or by its client going away."""


Item = RoundResult | BaseException


class Outbox:
    """What the engine thread hands one GenerateMany stream: every generation's results
    and ends, in order, released to the stream's writer once per step (`flush`), so that
    the writer sends one message for all the rows of a round."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, Item]] = deque()
        self._ready = threading.Condition()

    def put(self, request_id: str, item: Item) -> None:
        with self._ready:
            self._items.append((request_id, item))

    def flush(self) -> None:
        with self._ready:
            if self._items:
                self._ready.notify()

    def wake(self) -> None:
        """Wakes the writer even with nothing to send (it then checks whether to end)."""
        with self._ready:
            self._ready.notify()

    def take(self, timeout_s: float) -> list[tuple[str, Item]]:
        """Everything waiting; blocks up to `timeout_s` for the next flush when empty."""
        with self._ready:
            if not self._items:
                self._ready.wait(timeout_s)
            items = list(self._items)
            self._items.clear()
            return items


@dataclass
class Generation:
    request_id: str
    request: GenerationRequest
    owner: str = ""  # the gRPC peer that started it: only it may Abort it
    out: queue.Queue[Item] = field(default_factory=queue.Queue)
    stats: GenerationStats | None = None  # set with the first result
    outbox: Outbox | None = None  # GenerateMany: results go to the stream's outbox instead
    # When the verifier read the request (wall clock): every message of it carries this.
    received_unix_s: float = field(default_factory=time.time)

    def put(self, item: Item, flush: bool = True) -> Outbox | None:
        """Hands over a result or the error that ends it; -> the outbox to flush later
        when `flush` is False (the engine thread flushes once per step)."""
        if self.outbox is None:
            self.out.put(item)
            return None
        self.outbox.put(self.request_id, item)
        if flush:
            self.outbox.flush()
        return self.outbox

    def results(self, is_active: Callable[[], bool]) -> Iterator[list[RoundResult]]:
        """The RPC thread's view: RoundResults in order until finished, in batches: each
        batch is every result waiting when the reader came back (one when it keeps up, all
        the waiting rounds in one message when it falls behind); raises on errors."""
        while True:
            try:
                item = self.out.get(timeout=1.0)
            except queue.Empty:
                if not is_active():
                    return
                continue
            batch: list[RoundResult] = []
            while not isinstance(item, BaseException):
                batch.append(item)
                if item.finished:
                    break
                try:
                    item = self.out.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self.stats = batch[-1].stats
                yield batch
                if batch[-1].finished:
                    return
            if isinstance(item, BaseException):
                raise item


class Scheduler:
    def __init__(self, engine: Engine, sessions: ClientSessions,
                 session_idle_timeout_s: float) -> None:
        self.engine = engine
        self.sessions = sessions
        self.session_idle_timeout_s = session_idle_timeout_s
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._generations: dict[str, Generation] = {}  # engine thread only
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # ------------------------------------------------------------ called from RPC threads

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> bool:
        """Ends the engine thread after its current step; False if it did not end in time."""
        self._jobs.put(None)
        self._thread.join(timeout=30)
        return not self._thread.is_alive()

    def call(self, fn: Callable[[], T], timeout_s: float = 120.0) -> T:
        """Runs `fn` on the engine thread between steps; returns its result or raises."""
        future: Future[T] = Future()

        def job() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the caller, who maps it
                    future.set_exception(exc)

        self._jobs.put(job)
        try:
            return future.result(timeout=timeout_s)
        finally:
            future.cancel()  # a job that has not started yet never will

    def submit(self, request_id: str, request: GenerationRequest,
               owner: str = "") -> Generation:
        """Queues a generation; InvalidArgumentError / CapacityError (queue full) at once."""
        generation = Generation(request_id, request, owner)
        self.call(lambda: self._admit(generation))
        return generation

    def enqueue(self, generation: Generation) -> None:
        """Queues a generation without waiting (GenerateMany): a refusal (invalid, queue
        full) reaches its outbox as the error that ends it."""
        def job() -> None:
            try:
                self._admit(generation)
            except Exception as exc:  # the request's fault: handed to its stream
                generation.put(exc)

        self._jobs.put(job)

    def abort(self, request_id: str, owner: str = "") -> bool:
        """Stops a generation before the next round and frees its row; False when unknown
        or started by another peer (request ids are not secrets to rely on)."""
        def job() -> bool:
            generation = self._generations.get(request_id)
            if generation is None or generation.owner != owner:
                return False
            return self._abort(request_id)

        return self.call(job)

    def cancel(self, generation: Generation) -> None:
        """Aborts this very generation (a no-op once it finished, even if its id is reused)."""
        def job() -> None:
            if self._generations.get(generation.request_id) is generation:
                found = self._abort(generation.request_id)
                log.info("generation_cancelled", request_id=generation.request_id, found=found)

        self._jobs.put(job)

    def engine_stats(self) -> verifier_pb2.EngineStats:
        return self.call(self._engine_stats)

    # ------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        while True:
            for job in self._take_jobs(wait=not self.engine.has_work):
                if job is None:
                    self._shutdown()
                    return
                job()
            self.sessions.expire(self.session_idle_timeout_s)
            if not self.engine.has_work:
                continue
            try:
                # New rows' first tokens go out when read, before the step's round ends.
                outputs = self.engine.step(early=self._deliver_all)
            except Exception as exc:  # a bug, not a request's fault: fail loudly, live on
                log.exception("step_failed")
                self._fail_all(exc)
                continue
            self._deliver_all(outputs)

    def _take_jobs(self, wait: bool) -> list[Callable[[], None] | None]:
        """Every queued job; blocks (a while) for the first one when there is no work."""
        jobs: list[Callable[[], None] | None] = []
        if wait:
            try:
                # Wake up now and then to expire idle client sessions.
                jobs.append(self._jobs.get(timeout=min(1.0, self.session_idle_timeout_s)))
            except queue.Empty:
                return jobs
        while True:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                return jobs

    def _admit(self, generation: Generation) -> None:
        self.engine.add_request(generation.request_id, generation.request)
        self._generations[generation.request_id] = generation

    def _deliver_all(self, outputs: list[tuple[str, RoundResult]]) -> None:
        """Hands each result to its generation; each GenerateMany stream's writer is woken
        once for all of them."""
        outboxes = {self._deliver(request_id, result) for request_id, result in outputs}
        for outbox in outboxes:
            if outbox is not None:
                outbox.flush()

    def _deliver(self, request_id: str, result: RoundResult) -> Outbox | None:
        """-> the outbox to flush once the step's results are all in (None: nothing to)."""
        generation = self._generations.get(request_id)
        if generation is None:
            return None
        outbox = generation.put(result, flush=False)
        if result.finished:
            del self._generations[request_id]
            warn_if_acceptance_near_one(request_id, result.stats)
        return outbox

    def _abort(self, request_id: str) -> bool:
        found = self.engine.abort(request_id)
        generation = self._generations.pop(request_id, None)
        if generation is not None:
            generation.put(GenerationAborted("aborted"))
        return found

    def _fail_all(self, exc: BaseException) -> None:
        for request_id in list(self._generations):
            self.engine.abort(request_id)
            self._generations.pop(request_id).put(exc)

    def _engine_stats(self) -> verifier_pb2.EngineStats:
        engine, counters = self.engine, self.engine.counters
        histogram = list(counters.batch_sizes or [])
        while len(histogram) > 1 and histogram[-1] == 0:
            histogram.pop()
        return verifier_pb2.EngineStats(
            num_running=len(engine.running), num_waiting=len(engine.waiting),
            num_open_sessions=len(engine.sessions), max_num_seqs=engine.plan.num_slots,
            kv_usage=engine.slots.num_used / engine.plan.num_slots,
            num_rounds=counters.num_rounds, num_target_forwards=counters.num_target_forwards,
            batch_size_histogram=histogram, num_expired_sessions=counters.num_expired_sessions,
            num_rejected=counters.num_rejected, max_queue=engine.config.max_queue,
        )

    def _shutdown(self) -> None:
        for request_id in list(self._generations):
            self.engine.abort(request_id)
            self._generations.pop(request_id).put(
                GenerationAborted("the verifier is shutting down"))
