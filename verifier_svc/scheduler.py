"""The engine thread: the ONE thread that touches the target model.

It runs every active generation round-robin, one round each per pass: gather the items
of all generations still drafting into one DraftRequest, wait for the trees, then
`VerifySession.verify` each generation and hand its RoundResult to the RPC thread that
streams it. Other model work (OpenSession, Verify) runs between passes as jobs.

A generation whose drafter fails (down, too slow, an item error, a stale or invalid tree)
continues in plain ar steps, which stay lossless; it never goes back to drafting, since
the drafter's copy of its context is gone. Batching several generations into one target
call can later replace the per-generation loop in `_round` without touching the RPCs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TypeVar

import structlog
import torch

from ddtree import codec
from ddtree.engine import GenerationRequest, RoundResult, VerifySession
from ddtree.errors import InvalidArgumentError
from ddtree.models.target import TargetModel
from ddtree.stats import GenerationStats
from ddtree.tree import DraftTree
from ddtree.v1 import drafter_pb2, verifier_pb2
from verifier_svc.drafter_client import DrafterClient, DrafterUnavailable
from verifier_svc.sessions import KVSlots, checked_tree

log = structlog.get_logger("verifier_svc.scheduler")

T = TypeVar("T")


# Below this mean acceptance length over enough rounds, the drafter is almost surely not
# the target's (or its target layers are wrong): say so instead of serving slowly in silence.
MIN_HEALTHY_ACCEPTANCE, MIN_ROUNDS_TO_JUDGE = 1.1, 32


def warn_if_acceptance_near_one(generation: Generation) -> None:
    stats = generation.stats
    if stats is None or stats.num_rounds < MIN_ROUNDS_TO_JUDGE:
        return
    if stats.mean_acceptance_length < MIN_HEALTHY_ACCEPTANCE:
        log.warning("acceptance_near_one", request_id=generation.request_id,
                    mean_acceptance_length=round(stats.mean_acceptance_length, 3),
                    num_rounds=stats.num_rounds,
                    hint="is the drafter trained for this target (and its layer ids)?")


class GenerationAborted(Exception):
    """The generation was stopped by Abort or by its client going away."""


@dataclass
class Generation:
    request_id: str
    request: GenerationRequest
    out: queue.Queue[RoundResult | BaseException] = field(default_factory=queue.Queue)
    aborted: threading.Event = field(default_factory=threading.Event)
    session: VerifySession | None = None
    stats: GenerationStats | None = None  # outlives `session` (read for the last message)
    drafting: bool = False  # the drafter holds this generation's context
    block_size: int = 0
    pending_features: torch.Tensor | None = None  # (1, C, k*H) rows the drafter lacks

    def results(self, is_active: Callable[[], bool]) -> Iterator[RoundResult]:
        """The RPC thread's view: RoundResults in order until finished; raises on errors."""
        while True:
            try:
                item = self.out.get(timeout=1.0)
            except queue.Empty:
                if not is_active():
                    return
                continue
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return


class Scheduler:
    def __init__(
        self,
        target: TargetModel,
        drafter: DrafterClient | None,
        slots: KVSlots,
        max_model_len: int,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.slots = slots
        self.max_model_len = max_model_len
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._active: dict[str, Generation] = {}  # engine thread only
        self._known: dict[str, Generation] = {}  # started or active; guarded by _lock
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # ------------------------------------------------------------ called from RPC threads

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def call(self, fn: Callable[[], T], timeout_s: float = 120.0) -> T:
        """Runs `fn` on the engine thread between rounds; returns its result or raises."""
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

    def submit(self, request_id: str, request: GenerationRequest) -> Generation:
        """Queues a generation (its KV slot is taken now: CapacityError up front)."""
        generation = Generation(request_id, request)
        with self._lock:
            if request_id in self._known:
                raise InvalidArgumentError(f"request_id {request_id!r} is already running")
            self.slots.acquire()
            self._known[request_id] = generation
        self._jobs.put(lambda: self._start(generation))
        return generation

    def abort(self, request_id: str) -> bool:
        """Stops a generation within one round and frees its KV; False when unknown."""
        with self._lock:
            generation = self._known.get(request_id)
        if generation is None:
            return False
        self.cancel(generation)
        return True

    def cancel(self, generation: Generation) -> None:
        """Aborts this very generation (a no-op once it finished, even if its id is reused)."""
        generation.aborted.set()
        self._jobs.put(self._reap_aborted)  # wakes an idle engine thread

    def engine_stats(self, num_open_sessions: int) -> verifier_pb2.EngineStats:
        """The load right now (read from RPC threads; counts are approximate by a round)."""
        with self._lock:
            num_known = len(self._known)
        running = len(self._active)
        return verifier_pb2.EngineStats(
            num_running=running, num_waiting=max(0, num_known - running),
            num_open_sessions=num_open_sessions, max_num_seqs=self.slots.max_sessions,
            kv_usage=self.slots.in_use / self.slots.max_sessions,
        )

    # ------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        while True:
            for job in self._take_jobs(wait=not self._active):
                if job is None:
                    self._shutdown()
                    return
                job()
            if self._active:
                try:
                    self._round()
                except Exception as exc:  # a bug, not a request's fault: fail loudly, live on
                    log.exception("round_failed")
                    for generation in list(self._active.values()):
                        self._finish(generation, exc)

    def _take_jobs(self, wait: bool) -> list[Callable[[], None] | None]:
        """Every queued job; blocks for the first one only when no generation is active."""
        jobs = [self._jobs.get()] if wait else []
        while True:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                return jobs

    def _start(self, generation: Generation) -> None:
        if generation.aborted.is_set():
            self._finish(generation, GenerationAborted("aborted before it started"))
            return
        try:
            result = self._prefill(generation)
        except Exception as exc:
            self._finish(generation, exc)
            return
        generation.out.put(result)
        if result.finished:
            self._finish(generation)
        else:
            self._active[generation.request_id] = generation

    def _prefill(self, generation: Generation) -> RoundResult:
        request = generation.request
        info = self.drafter.info if self.drafter is not None else None
        if request.spec.mode != "ar" and info is None:
            log.warning("drafter_unavailable_using_ar", request_id=generation.request_id)
            if self.drafter is not None:
                self.drafter.connect(wait=False)
            request = replace(request, spec=replace(request.spec, mode="ar"))
        drafting = request.spec.mode != "ar" and info is not None
        layers: tuple[int, ...] = ()
        block_size = max_nodes = 1
        if drafting and info is not None:
            layers, block_size = tuple(info.target_layer_ids), info.block_size
            max_nodes = max(request.spec.budget, block_size)  # the tree, or the chain of L+1
        session = VerifySession(self.target, request, layers, self.max_model_len, max_nodes)
        generation.session, generation.stats = session, session.stats
        generation.drafting = drafting
        generation.block_size = block_size
        result = session.prefill()
        generation.pending_features = result.features if drafting else None
        return result

    def _round(self) -> None:
        self._reap_aborted()
        generations = list(self._active.values())
        trees = self._draft([g for g in generations if g.drafting])
        for generation in generations:
            self._verify(generation, trees.get(generation.request_id))

    def _verify(self, generation: Generation, tree: DraftTree | None) -> None:
        session = generation.session
        assert session is not None
        mode = session.request.spec.mode
        try:
            result = session.verify(
                tree,
                first_child_only=mode in ("linear", "shadow"),
                max_depth=generation.block_size - 1 if tree is not None else None,
            )
        except Exception as exc:
            self._finish(generation, exc)
            return
        if generation.drafting:
            generation.pending_features = result.features
        generation.out.put(result)
        if result.finished:
            self._finish(generation)

    def _draft(self, generations: list[Generation]) -> dict[str, DraftTree]:
        """One DraftRequest for all `generations` -> their trees (absent = ar this round)."""
        if not generations:
            return {}
        assert self.drafter is not None
        items = [self._draft_item(g) for g in generations]
        started = time.perf_counter()
        try:
            results = self.drafter.draft(items)
        except DrafterUnavailable as exc:
            for generation in generations:
                self._stop_drafting(generation, str(exc))
            return {}
        # Drafter compute plus the network, as the verifier sees it.
        elapsed = time.perf_counter() - started
        trees = {}
        for generation in generations:
            assert generation.session is not None
            generation.session.stats.stage_seconds["draft"] += elapsed
            tree, problem = self._tree_of(generation, results.get(generation.request_id))
            if tree is None:
                self._stop_drafting(generation, problem)
            else:
                trees[generation.request_id] = tree
        return trees

    def _draft_item(self, generation: Generation) -> drafter_pb2.DraftItem:
        session = generation.session
        assert session is not None and generation.pending_features is not None
        features, generation.pending_features = generation.pending_features, None
        return drafter_pb2.DraftItem(
            session_id=generation.request_id,
            committed_len=session.committed_len,
            bonus_token=session.bonus_token,
            features=codec.tensor_to_proto(features[0]),  # (C, k*H)
            spec=codec.spec_to_proto(session.request.spec),
        )

    def _tree_of(
        self, generation: Generation, result: drafter_pb2.DraftResult | None
    ) -> tuple[DraftTree | None, str]:
        """The result's tree when it fits this generation, else (None, why not)."""
        session = generation.session
        assert session is not None
        if result is None:
            return None, "no draft result for this generation"
        if result.error:
            return None, f"drafter error {result.error_code}: {result.error}"
        if result.committed_len != session.committed_len:
            return None, (
                f"stale tree built on committed length {result.committed_len}, "
                f"the generation is at {session.committed_len}"
            )
        try:
            max_nodes = max(session.request.spec.budget, generation.block_size)
            return checked_tree(result.tree, session, max_nodes, generation.block_size - 1), ""
        except InvalidArgumentError as exc:
            return None, f"invalid tree from the drafter: {exc}"

    def _stop_drafting(self, generation: Generation, reason: str) -> None:
        log.warning("drafter_fallback_ar", request_id=generation.request_id, reason=reason)
        generation.drafting = False
        generation.pending_features = None
        if self.drafter is not None:
            self.drafter.release([generation.request_id])

    def _reap_aborted(self) -> None:
        for generation in [g for g in self._active.values() if g.aborted.is_set()]:
            self._finish(generation, GenerationAborted("aborted"))

    def _finish(self, generation: Generation, error: BaseException | None = None) -> None:
        """Ends a generation: frees its KV slot and the drafter's session; reports `error`."""
        if error is not None:
            generation.out.put(error)
        self._active.pop(generation.request_id, None)
        with self._lock:
            if self._known.pop(generation.request_id, None) is None:
                return  # already finished
            self.slots.release()
        if generation.drafting and self.drafter is not None:
            self.drafter.release([generation.request_id])
            warn_if_acceptance_near_one(generation)
        generation.session, generation.drafting = None, False

    def _shutdown(self) -> None:
        for generation in list(self._active.values()):
            self._finish(generation, GenerationAborted("the verifier is shutting down"))
