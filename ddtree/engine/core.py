"""The engine: a pool of rows, a bounded admission queue, and `step()`, one round for every
active generation (ddtree/engine/round.py). `ddtree generate`, the in-process bench and
verifier_svc all drive this one class.

A step admits waiting requests into free rows (their prompts prefilled together in one
forward, replayed as a CUDA graph of a padded static shape where it fits: each one's first
token is that step's output), then launches ONE round over
all running rows in the smallest static bucket that holds them: the draft half (a captured
graph with the local drafter, or the remote drafter's trees), the verify half (a captured
graph), and a single device-to-host copy of the round's output table, which the next step
reads (pipelined) once it has launched its own round. Abort frees a row at once.

Not thread-safe: one thread owns an Engine (verifier_svc's engine thread, or the caller).
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from ddtree.engine.config import EngineConfig, PoolPlan, plan_pool
from ddtree.engine.drafting import DeviceDrafting, Drafting, LocalDrafter
from ddtree.engine.graphs import GraphRunner
from ddtree.engine.logprobs import token_logprobs
from ddtree.engine.policy import BudgetPolicy
from ddtree.engine.prefill import LaunchedPrefill, launch_prefill
from ddtree.engine.prefill_graphs import PrefillGraphs
from ddtree.engine.request import MODE_RULES, GenerationRequest, RoundResult
from ddtree.engine.round import BucketKey, RoundBuffers, draft_into, verify_into
from ddtree.engine.rows import Row
from ddtree.engine.state import BONUS, COMMITTED, RowParams, SlotAllocator, SlotState
from ddtree.engine.timing import RoundTimer, round_cost
from ddtree.errors import CapacityError, InvalidArgumentError
from ddtree.models.kv_pool import KVPool
from ddtree.models.ops import Backend
from ddtree.models.target import TargetModel
from ddtree.round_trace import RoundTrace
from ddtree.stats import GenerationStats

Output = tuple[str, RoundResult]
# Replays timed per policy choice and batch bucket (`Engine._measure_policy`).
POLICY_REPEATS = 5


@dataclass
class InFlight:
    """A launched round: its rows, shape, the host copy of its output table (valid once
    `done` completed; None on the CPU) and what its harvest needs."""

    rows: list[Row]
    key: BucketKey
    width: int
    host: Tensor
    done: torch.cuda.Event | None
    timer: RoundTimer
    logits: Tensor
    started: float
    captured: bool  # a graph was captured: the round's time measures the capture
    measurements: int  # the engine's policy measurements at launch (one since: ditto)
    auto_rows: list[int]  # indices into rows of the auto rows, whose tree size was...
    auto_choice: int  # ... the policy's choice for this round (0: none)
    drafted: list[int]  # each row's tree nodes besides the root this round


@dataclass(frozen=True)
class _Admission:
    """The prefill of the rows admitted by one step, enqueued at `started`."""

    launched: LaunchedPrefill
    started: float


@dataclass
class EngineCounters:
    """Since start-up; `batch_sizes[i]` = rounds that carried i rows."""

    num_rounds: int = 0
    num_target_forwards: int = 0
    num_rejected: int = 0
    num_expired_sessions: int = 0
    num_sent_ahead: int = 0  # draft rounds asked for before their step (_send_ahead, halves)
    batch_sizes: list[int] | None = None


class Engine:
    def __init__(self, target: TargetModel, drafting: Drafting | None,
                 config: EngineConfig | None = None, plan: PoolPlan | None = None) -> None:
        config = config or EngineConfig()
        self.target, self.drafting, self.config = target, drafting, config
        weight = target.embeddings.embed_tokens.weight
        self.device, dtype = weight.device, weight.dtype
        target.backend = Backend(kernels=target.backend.kernels, invariant=config.invariant,
                                 fused=config.fused_prologues,
                                 swiglu_epilogue=config.swiglu_epilogue,
                                 reduce_fusions=config.reduce_fusions,
                                 rope_epilogue=config.rope_epilogue,
                                 round_commit=config.round_commit)
        if isinstance(drafting, LocalDrafter):
            drafting.backend = dataclasses.replace(drafting.backend,
                                                   swiglu_epilogue=config.swiglu_epilogue,
                                                   reduce_fusions=config.reduce_fusions,
                                                   rope_epilogue=config.rope_epilogue)
        depth = drafting.block_size - 1 if drafting is not None else 0
        self.plan = plan or plan_pool(config, target.config, self.device, dtype, 0, depth)
        self.pool: KVPool = target.new_pool(self.plan.num_slots + 1, self.plan.max_len)
        self.feature_layers = drafting.target_layer_ids if drafting is not None else ()
        feature_width = len(self.feature_layers) * target.config.hidden_size
        block = drafting.block_size if drafting is not None else 1
        self.state = SlotState(self.plan.num_slots, block, feature_width, self.device, dtype)
        self.slots = SlotAllocator(self.plan.num_slots)
        self.graphs = GraphRunner(self.device, config.cuda_graphs)
        static = config.static_prefill if config.static_prefill is not None else (
            self.graphs.enabled)
        self._static_prefill = PrefillGraphs(
            self.graphs, self.state.scratch, self.plan.max_len, self.plan.num_slots,
            config.max_prefill_tokens, self.device) if static else None
        self.counters = EngineCounters(batch_sizes=[0] * (self.plan.num_slots + 1))
        self._trace = RoundTrace("engine", leader=True)  # DDTREE_TRACE_DIR: a profiler window
        self.waiting: deque[Row] = deque()
        self.running: dict[str, Row] = {}  # request id -> row, in admission order
        self.sessions: dict[str, Row] = {}  # client sessions (OpenSession), see sessions.py
        self._buffers: dict[tuple[int, int], RoundBuffers] = {}
        self._eos = tuple(target.config.eos_token_ids)
        self.policy = BudgetPolicy(depth, config.max_budget) if drafting is not None else None
        measure = (config.measure_policy if config.measure_policy is not None
                   else self.graphs.enabled)
        self._measures_policy = bool(measure)
        self._measured_batches: set[int] = set()  # batch buckets measured for the policy
        self._in_flight: InFlight | None = None
        self._last_round_end = 0.0  # when the host last saw a round complete
        # Alternating halves (a remote drafter, see `step`): each half's launched round,
        # each half's draft round asked for and not yet received, whose turn it is.
        self._flights: dict[int, InFlight] = {}
        self._sent: dict[int, Any] = {}  # group -> the drafter's SentRound
        self._turn = 0
        self._planned: int | None = None  # the auto rows' tree size of a round sent ahead
        if isinstance(drafting, DeviceDrafting):
            drafting.attach(self)  # its draft half reads this engine's tables

    # ------------------------------------------------------------ requests

    @property
    def max_model_len(self) -> int:
        return self.plan.max_model_len

    def add_request(self, request_id: str, request: GenerationRequest) -> None:
        """Queues a generation; raises InvalidArgumentError (bad request, duplicate id) or
        CapacityError (the queue is full) at once."""
        try:
            request.validate(self.target.config.vocab_size, self.max_model_len,
                             self.config.max_budget)
        except InvalidArgumentError:
            self.counters.num_rejected += 1
            raise
        if request_id in self.running or any(r.request_id == request_id for r in self.waiting):
            raise InvalidArgumentError(f"request_id {request_id!r} is already running")
        if len(self.waiting) >= self.config.max_queue + self.slots.num_free:
            self.counters.num_rejected += 1
            raise CapacityError(f"the server is at capacity ({len(self.waiting)} requests wait)")
        self.waiting.append(self._new_row(request_id, request))

    def _new_row(self, request_id: str, request: GenerationRequest) -> Row:
        drafting = (self.drafting is not None and MODE_RULES[request.spec.mode].drafts
                    and getattr(self.drafting, "available", True))
        depth = self.drafting.block_size - 1 if self.drafting is not None else 0
        mode = request.spec.mode if drafting else "ar"
        num_nodes = MODE_RULES[mode].num_nodes(request.spec.budget, depth)
        if mode == "auto":
            num_nodes = depth  # the policy sets it every round
        seed = request.sampling.seed
        stats = GenerationStats(mode, request.spec.budget)
        stats.num_prompt_tokens = len(request.prompt_ids)
        return Row(request_id, request, num_nodes, request.stop_set(self._eos),
                   seed if seed is not None else secrets.randbits(63), stats, drafting=drafting,
                   auto=mode == "auto", force_chain=MODE_RULES[mode].force_chain)

    def abort(self, request_id: str) -> bool:
        """Ends a waiting or running generation at once (its row is free for the next
        round); False when unknown."""
        for row in list(self.waiting):
            if row.request_id == request_id:
                self.waiting.remove(row)
                return True
        running = self.running.pop(request_id, None)
        if running is None:
            return False
        self._release(running)
        self._drop_sent()
        return True

    def _drop_sent(self) -> None:
        """Draft rounds asked for ahead that no round will take (every row ended or was
        aborted): dropped now, so that nothing is left in flight."""
        if not self.running and self._sent and not self._flights:
            cast(Any, self.drafting).abandon(list(self._sent.values()))
            self._sent.clear()
            self._planned = None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._in_flight or self._flights)

    # ------------------------------------------------------------ the step

    @torch.inference_mode()
    def step(self, early: Callable[[list[Output]], None] | None = None) -> list[Output]:
        """Admits what fits, then one round for every running row; returns each
        generation's RoundResults of this step (a row's first token before its rounds).
        The admitted rows' prefill is enqueued before the round, which carries them, and
        its first tokens are read after the round is launched (the GPU has the round
        queued while the host waits for them). With `early`, those first tokens go to it
        as soon as they are read instead of into the returned list: a server sends them
        before the step's round ends (through a drafter service the round's exchange
        and verify come after the read: ~4 ms of a c8 round on the H200, lease 20).

        Pipelined (the default with the local drafter): the round launched by this step is
        read by the NEXT step, after that step has launched its own round, so the host's
        work overlaps the device's. A row finished by round k is still carried by round
        k+1 (its output is dropped): the pool has room for that extra tree.

        With a remote drafter (whose trees need the host's view of the last round) and
        `EngineConfig.alternate` (off by default: measured slower on the H200), the rows
        form two halves that take turns when both draft (`_step_alternating`): a step
        completes one half's round and asks the drafter for its next trees, then launches
        the other half's round with the trees asked for one step earlier, so that each
        half's drafter exchange may overlap the other half's verify. Otherwise, with a
        remote drafter and `EngineConfig.send_ahead` (the default), each step ends by
        asking for the next round's trees (`_send_ahead`), which the next step takes."""
        self._trace.tick()
        outputs: list[Output] = []
        prefill = self._admit()  # enqueued; its first tokens are read below
        if self._alternates():
            if prefill is not None:
                self._first_tokens(prefill, outputs, early)
            outputs.extend(self._step_alternating())
            return outputs
        for group in sorted(self._flights):  # leaving the turns: both halves' rounds end
            outputs.extend(self._complete(self._flights.pop(group)))
        rows = list(self.running.values())
        previous, self._in_flight = self._in_flight, None
        pipelined = self._can_pipeline(rows)
        if prefill is not None and (not pipelined or prefill.launched.wants_logits):
            self._first_tokens(prefill, outputs, early)  # the host's view before the round
            prefill, rows = None, list(self.running.values())
        if previous is not None and not pipelined:
            outputs.extend(self._complete(previous))  # host state current before launching
            previous, rows = None, list(self.running.values())
        flight = self._launch(rows) if rows else None
        if prefill is not None:  # the GPU has this round queued behind the prefill
            self._first_tokens(prefill, outputs, early)
        if previous is not None:
            outputs.extend(self._complete(previous))
        if flight is not None and pipelined:
            self._in_flight = flight
        elif flight is not None:
            outputs.extend(self._complete(flight))
            self._send_ahead()  # after the policy saw this round: it may plan the next
        return outputs

    def _send_ahead(self) -> None:
        """Right after a round's harvest, with a remote drafter (`EngineConfig.send_ahead`,
        not alternating): asks the drafter now for every running drafting row's next trees,
        so that it drafts while the host delivers this step's results, admits and launches
        the next step, which takes those trees. Before, all that came ahead of the
        exchange, in series with it (~1.4 ms of host work against ~2.1 ms of drafter wait
        in a c8 round through a drafter service, lease 20; asking ahead: tree@16 through
        the three processes +16% at c1, +8% at c8, lease 21). Asked for earlier, before
        the round's results were built, it measured no gain (lease 22, another machine).
        The auto rows' tree size for that round is chosen here: it travels with the
        request. A row aborted meanwhile is skipped then; one admitted meanwhile verifies
        its root alone in that round anyway."""
        if (not self.config.send_ahead or self.config.alternate or self._sent
                or not hasattr(self.drafting, "send")):
            return
        rows = list(self.running.values())
        auto = [row for row in rows if row.follows_policy]
        if auto and self.policy is not None:
            batch = self.plan.batch_bucket(len(rows))
            self._measure_policy(batch, auto)
            self._planned = self._follow_policy(auto, batch)
        sent = cast(Any, self.drafting).send(self, rows)
        if sent is not None:
            self._sent[0] = sent
            self.counters.num_sent_ahead += 1

    def _alternates(self) -> bool:
        """Two halves take turns: a remote drafter that can send ahead, drafting rows in
        both halves, and no row that reads its round's logits (the halves may share a
        bucket's graph, whose logits the next launch overwrites)."""
        if not self.config.alternate or not hasattr(self.drafting, "send"):
            return False
        groups = {row.group for row in self.running.values() if row.drafting and row.num_nodes}
        return len(groups) == 2 and not any(row.wants_logprobs for row in self.running.values())

    def _step_alternating(self) -> list[Output]:
        outputs: list[Output] = []
        if self._in_flight is not None:  # a pipelined round from before the turns
            outputs.extend(self._complete(self._in_flight))
            self._in_flight = None
        group, other = self._turn, self._turn ^ 1
        self._turn = other
        for done in (other, group):  # `group`'s own round ended last step (the rule)
            flight = self._flights.pop(done, None)
            if flight is not None:
                outputs.extend(self._complete(flight))
        if other not in self._sent:  # its next trees, drafted while `group` verifies
            sent = cast(Any, self.drafting).send(self, self._group_rows(other))
            if sent is not None:
                self._sent[other] = sent
                self.counters.num_sent_ahead += 1
        rows = self._group_rows(group)
        if rows:
            self._flights[group] = self._launch(rows, (group,))
        return outputs

    def _group_rows(self, group: int) -> list[Row]:
        return [row for row in self.running.values() if row.group == group]

    def _assign_groups(self, rows: list[Row]) -> None:
        """New rows join the half with fewer drafting rows (ties: the first)."""
        counts = [0, 0]
        for row in self.running.values():
            counts[row.group] += row.drafting
        for row in rows:
            row.group = 0 if counts[0] <= counts[1] else 1
            counts[row.group] += row.drafting

    def _can_pipeline(self, rows: list[Row]) -> bool:
        """Everything the next round needs is on the device: no row drafts outside the
        graphs (a remote drafter needs the host's view of the last round) and no row reads
        this round's logits (logprobs)."""
        if not self.config.pipeline:
            return False
        remote = self.drafting is not None and not self._drafts_in_round
        if remote and any(row.drafting or row.num_nodes for row in rows):
            return False  # its trees' roots are the host's bonus tokens: they must be current
        return not any(row.wants_logprobs for row in rows)

    @property
    def _drafts_in_round(self) -> bool:
        """The drafter reads the round's state on the device (this process's drafter, or
        one sharing the engine's tables): no host view of the last round needed."""
        return isinstance(self.drafting, (LocalDrafter, DeviceDrafting))

    def _admit(self) -> _Admission | None:
        """Takes waiting requests into free rows (up to `max_prefill_tokens` prompt tokens,
        at least one request) and enqueues their prefill, together in one forward; the
        rows run from now on (their first tokens are read by `_read_prefill`)."""
        admitted: list[Row] = []
        budget = self.config.max_prefill_tokens
        while self.waiting and self.slots.num_free and (budget > 0 or not admitted):
            row = self.waiting.popleft()
            slot = self.slots.allocate()
            assert slot is not None
            row.slot = slot
            budget -= len(row.request.prompt_ids)
            admitted.append(row)
        if not admitted:
            return None
        self._assign_groups(admitted)
        self._admit_auto([row for row in admitted if row.follows_policy],
                         self.plan.batch_bucket(len(self.running) + len(admitted)))
        admission = self._prefill(admitted)
        for row in admitted:
            self.running[row.request_id] = row
        return admission

    def _admit_auto(self, rows: list[Row], batch: int) -> None:
        """New auto rows start as ar when the policy prefers ar at the batch bucket they
        join (judged once for the step's whole admission: a row admitted first must not
        pay for drafting context it drops in the first round)."""
        if not rows or self.policy is None:
            return
        self._measure_policy(batch, rows)
        if self.policy.prefers_ar(batch):
            for row in rows:
                row.auto, row.drafting, row.num_nodes = False, False, 0
                row.stats.mode = "ar"

    def _prefill(self, rows: list[Row]) -> _Admission:
        """Enqueues the rows' prefill and the drafter's first context (device work only:
        the prompt features stay on the device)."""
        started = time.perf_counter()
        params = [RowParams.of(row.request, row.num_nodes, row.seed) for row in rows]
        layers = self.feature_layers if any(row.drafting for row in rows) else ()
        launched = launch_prefill(self.target, self.pool, self.state, rows, params, layers,
                                  self._static_prefill)
        self.counters.num_target_forwards += 1
        for row, features in zip(rows, launched.features, strict=True):
            row.committed_len = len(row.request.prompt_ids)
            if row.drafting and self.drafting is not None and features is not None:
                self.drafting.start(row.slot, row.request_id, features)
        return _Admission(launched, started)

    def _first_tokens(self, admission: _Admission, outputs: list[Output],
                      early: Callable[[list[Output]], None] | None) -> None:
        """The admitted rows' first tokens, to `early` now or into the step's `outputs`."""
        first = self._read_prefill(admission)
        if early is None:
            outputs.extend(first)
        elif first:
            early(first)

    def _read_prefill(self, admission: _Admission) -> list[Output]:
        """The admitted rows' first tokens, once their prefill ran; a row that its first
        token ends leaves (a round launched meanwhile carries it; its output is dropped)."""
        prefilled = admission.launched.read()
        seconds = time.perf_counter() - admission.started  # every row waited for all of it
        outputs: list[Output] = []
        for row, (first, _, prompt_logprobs, logprobs) in zip(
                admission.launched.rows, prefilled, strict=True):
            row.bonus_token = first
            result = row.emit([first], 0, logprobs)
            result.prompt_logprobs = prompt_logprobs
            row.stats.stage_seconds["prefill"] += seconds
            outputs.append((row.request_id, result))
            if row.finished and self.running.get(row.request_id) is row:
                self.running.pop(row.request_id)
                self._release(row)
        return outputs

    def _launch(self, rows: list[Row], groups: tuple[int, ...] | None = None) -> InFlight:
        """Enqueues one round for `rows` and the copy of its output table to the host;
        it takes the draft rounds sent ahead for `groups` (None: every one)."""
        sent = [self._sent.pop(g) for g in (groups if groups is not None else (0, 1))
                if g in self._sent]
        auto = [row for row in rows if row.follows_policy]
        batch = self.plan.batch_bucket(len(rows))
        if auto:
            self._measure_policy(batch, auto)  # before the clock: not this round's cost
        started, num_graphs = time.perf_counter(), self.graphs.num_graphs
        measurements = self.policy_measurements
        auto_choice = 0
        planned, self._planned = self._planned, None  # chosen when the trees were asked for
        if self.policy is not None:
            self.policy.tick()
            if auto:
                auto_choice = self._follow_policy(auto, batch, planned)
        key = self._bucket(rows)
        buffers = self._buffers_for(key)
        slots = [row.slot for row in rows] + [self.state.scratch] * (key.batch - len(rows))
        if slots != buffers.last_slots:  # unchanged rows (the steady state): nothing to send
            buffers.rows.copy_(torch.tensor(slots), non_blocking=True)
            buffers.last_slots = slots
        timer = RoundTimer(self.device)
        if key.num_nodes:
            self._draft(rows, key, buffers, sent)
        elif sent:  # every row went to ar since (the policy): nothing to verify
            cast(Any, self.drafting).abandon(sent)
        timer.mark()
        drafted = [0 if row.root_only else row.num_nodes for row in rows]
        layers = self.feature_layers if key.num_nodes else ()
        verified = self._replay(("verify", key), buffers, lambda: verify_into(
            self.state, self.target, self.pool, buffers, key, layers,
            fast_ar=self.config.fast_ar))
        timer.mark()
        host = buffers.next_host_out()
        host.copy_(buffers.out, non_blocking=True)  # the round's one device-to-host copy
        done = torch.cuda.Event() if self.device.type == "cuda" else None
        if done is not None:
            done.record()
        if key.num_nodes and self.drafting is not None:
            self.drafting.overlap_verify(self)  # a remote drafter opens new rows' sessions
        self.counters.num_rounds += 1
        self.counters.num_target_forwards += 1
        assert self.counters.batch_sizes is not None
        self.counters.batch_sizes[len(rows)] += 1
        auto_rows = [i for i, row in enumerate(rows) if row.follows_policy and drafted[i]]
        return InFlight(rows, key, buffers.width, host, done, timer, verified.logits, started,
                        self.graphs.num_graphs != num_graphs, measurements, auto_rows,
                        auto_choice, drafted)

    def _complete(self, flight: InFlight) -> list[Output]:
        """Waits for a launched round and turns its output table into results."""
        if flight.done is not None:
            flight.done.synchronize()
        finished = time.perf_counter()
        seconds = round_cost(flight.started, finished, self._last_round_end)
        self._last_round_end = finished
        stages = dict(zip(("draft", "verify"), flight.timer.seconds(), strict=True))
        table = flight.host.tolist()
        outputs = self._harvest(flight.rows, table, flight.logits, flight.width, stages,
                                flight.drafted)
        measured = flight.measurements != self.policy_measurements  # the wait measures that
        if self.policy is not None and not flight.captured and not measured:
            # Every round's cost is its shape's, whoever's rows; acceptance only from the
            # auto rows that drafted (each row's accepted path: node indices, root first).
            width, auto = flight.width, flight.auto_rows if flight.auto_choice else []
            paths = [table[i][2 + width: 2 + width + table[i][0]] for i in auto]
            self.policy.observe(flight.key.batch, flight.key.num_nodes, seconds,
                                flight.auto_choice, paths)
        return outputs

    def _follow_policy(self, rows: list[Row], batch: int, planned: int | None = None) -> int:
        """Sets the auto rows' tree size for this round (or ends their drafting: 0); the
        `planned` choice (made when the round's trees were asked for) instead of a new one."""
        assert self.policy is not None
        if planned == 0 or (planned is None and self.policy.prefers_ar(batch)):
            for row in rows:
                row.auto, row.num_nodes = False, 0
                row.stats.mode = "ar"
                self._stop_drafting(row)
            return 0
        choice = self.policy.choose(batch) if planned is None else planned
        for row in rows:
            if row.num_nodes != choice:
                row.num_nodes, row.force_chain = choice, choice == self.policy.depth
                self.state.set_tree_shape(row.slot, choice, row.force_chain)
        return choice

    @property
    def policy_measurements(self) -> int:
        """Batch buckets measured for the policy so far (each once)."""
        return len(self._measured_batches)

    def _measure_policy(self, batch: int, rows: list[Row]) -> None:
        """Times one round of every policy choice (ar too) at batch bucket `batch`, once:
        its graphs captured and replayed on scratch rows, so the policy judges by measured
        costs instead of exploring every tree size in traffic at every batch size. The
        scratch rows attend to `rows`' mean context over their generation (an empty
        context makes a tree's verify look cheap next to ar's: its attention reads
        1 + N queries' keys). With a remote drafter only ar is measured (its round is the
        verifier's alone); tree rounds, the drafter's hop included, are timed in traffic,
        so `auto` behind a slow hop goes to ar instead of trusting a prior."""
        policy = self.policy
        if not self._measures_policy or policy is None or batch in self._measured_batches:
            return
        self._measured_batches.add(batch)
        context = sum(len(row.request.prompt_ids) + row.request.max_tokens // 2
                      for row in rows) // max(len(rows), 1)
        context = min(context, self.plan.max_model_len // 2)
        for choice in (0, *policy.choices) if self._drafts_in_round else (0,):
            key = BucketKey(batch, self.plan.node_bucket(choice))
            buffers = self._scratch_buffers(key)
            self._scratch_round(key, buffers, context)  # captures (once) and warms up
            _sync(self.device)
            started = time.perf_counter()
            for _ in range(POLICY_REPEATS):
                self._scratch_round(key, buffers, context)
            _sync(self.device)
            policy.measure(batch, choice, (time.perf_counter() - started) / POLICY_REPEATS)

    @torch.inference_mode()
    def warm_up(self) -> int:
        """Every static shape traffic takes, compiled and captured before any request (what
        vLLM's start-up graph capture does): each prefill token bucket (with and without
        the drafter's features), and at every batch bucket a greedy scratch round of ar
        and of each policy choice - the shapes the policy measures at a batch bucket's
        first traffic. Without it a first use costs its captures and, for a new row
        class of the GEMM's tiles, Triton's compiles: lease 13 saw a 1.0 s first token
        for the first 307-token prompt and a 0.6 s stall of 8 streams when `auto` first
        met batch 8. Largest shapes first (the graphs share one memory pool). Nothing is
        measured or counted: the policy still times each batch bucket on its first
        traffic, with the rows' real context. With a remote drafter the verify half runs
        on a scratch tree (the drafter service warms up its own half). -> shapes warmed."""
        num_shapes = 0
        if self._static_prefill is not None:
            for layers in dict.fromkeys(((), tuple(self.feature_layers))):
                num_shapes += self._static_prefill.warm_up(self.target, self.pool, layers)
        choices = self.policy.choices if self.policy is not None else ()
        context = self.drafting.block_size if self.drafting is not None else 1
        for batch in sorted(self.plan.batch_buckets, reverse=True):
            for num_nodes in sorted({self.plan.node_bucket(c) for c in (0, *choices)},
                                    reverse=True):
                key = BucketKey(batch, num_nodes)
                self._scratch_round(key, self._scratch_buffers(key), context)
                num_shapes += 1
        _sync(self.device)
        return num_shapes

    def _scratch_buffers(self, key: BucketKey) -> RoundBuffers:
        """`key`'s buffers with every row the scratch row (the next real round sends its
        rows again)."""
        buffers = self._buffers_for(key)
        buffers.rows.fill_(self.state.scratch)
        buffers.last_slots = []
        return buffers

    def _scratch_round(self, key: BucketKey, buffers: RoundBuffers, context: int) -> None:
        """One round of `key` on scratch rows at committed length `context` (the verify
        resets the scratch row at its end)."""
        drafting = self.drafting
        self.state.ints[self.state.scratch, COMMITTED] = context
        if key.num_nodes and isinstance(drafting, LocalDrafter):
            self._replay(("draft", key.batch, key.num_nodes), buffers,
                         lambda: draft_into(self.state, drafting, buffers))
        elif key.num_nodes and isinstance(drafting, DeviceDrafting) and drafting.draft(buffers):
            pass  # the sharing drafter's half (its graph captured on these scratch rows)
        elif key.num_nodes:  # a remote drafter's tree: every node a child of the root
            buffers.parents.fill_(0)
            buffers.parents[:, 0] = -1
            buffers.depth.fill_(1)
            buffers.depth[:, 0] = 0
            buffers.valid.fill_(True)
        layers = self.feature_layers if key.num_nodes else ()
        self._replay(("verify", key), buffers, lambda: verify_into(
            self.state, self.target, self.pool, buffers, key, layers,
            fast_ar=self.config.fast_ar))

    def _stop_drafting(self, row: Row) -> None:
        """The row continues in ar for good (its trees are the root alone from now)."""
        if row.drafting and self.drafting is not None:
            self.drafting.release(row.slot, row.request_id)
        row.drafting, row.num_nodes = False, 0
        self.state.set_tree_shape(row.slot, 0, False)

    def _draft(self, rows: list[Row], key: BucketKey, buffers: RoundBuffers,
               sent: list[Any]) -> None:
        drafting = self.drafting
        assert drafting is not None
        if isinstance(drafting, LocalDrafter):
            self._replay(("draft", key.batch, key.num_nodes), buffers,
                         lambda: draft_into(self.state, drafting, buffers))
            return
        if isinstance(drafting, DeviceDrafting):
            unknown = set(drafting.unknown([row.slot for row in rows if row.drafting]))
            for row in rows:  # their budget 0 before the draft reads it: roots alone
                if row.slot in unknown:
                    self._stop_drafting(row)
            if not drafting.draft(buffers):  # the drafter failed: roots alone, rows in ar
                buffers.set_root_only(self.state.column(buffers.rows, BONUS))
                for row in rows:
                    self._stop_drafting(row)
            return
        # A drafter outside the graphs (verifier_svc's RemoteDrafter) fills the trees itself.
        cast(Any, drafting).propose(self, rows, buffers, sent)

    def _replay(self, graph_key: Any, buffers: RoundBuffers, fn: Callable[[], Any]) -> Any:
        """Runs fn through its graph, capturing it first (on scratch rows) if needed."""
        if self.graphs.enabled and graph_key not in self.graphs:
            real = buffers.rows.clone()
            buffers.rows.fill_(self.state.scratch)
            self.graphs.capture(graph_key, fn)
            buffers.rows.copy_(real)
            self.state.reset_scratch()
        return self.graphs.run(graph_key, fn)

    def _bucket(self, rows: list[Row]) -> BucketKey:
        num_nodes = self.plan.node_bucket(max(row.num_nodes for row in rows))
        sampled = any(not row.request.sampling.is_greedy for row in rows)
        filtered = any(not row.request.sampling.is_greedy and (
            row.request.sampling.top_k > 0 or row.request.sampling.top_p < 1) for row in rows)
        return BucketKey(self.plan.batch_bucket(len(rows)), num_nodes, sampled, filtered)

    def _buffers_for(self, key: BucketKey) -> RoundBuffers:
        shape = (key.batch, key.num_nodes)
        if shape not in self._buffers:
            width = self.drafting.block_size if key.num_nodes and self.drafting else 1
            self._buffers[shape] = RoundBuffers(key.batch, key.num_nodes, width, self.device)
        return self._buffers[shape]

    # ------------------------------------------------------------ after the round

    def _harvest(self, rows: list[Row], out: list[list[int]], logits: Tensor, width: int,
                 stages: dict[str, float], drafted: list[int]) -> list[Output]:
        outputs: list[Output] = []
        for index, row in enumerate(rows):
            if row.finished or self.running.get(row.request_id) is not row:
                continue  # ended (finished, aborted) while this round was in flight
            accepted, next_token = out[index][0], out[index][1]
            tokens = out[index][2: 2 + accepted]
            path = out[index][2 + width: 2 + width + accepted]
            logprobs = None
            if row.wants_logprobs:
                at_path = logits[index][torch.tensor(path, device=logits.device)]  # (A, V)
                logprobs = token_logprobs(at_path, tokens[1:] + [next_token],
                                          row.request.top_logprobs)
            row.committed_len += accepted
            row.bonus_token, row.num_pending = next_token, accepted
            for stage, seconds in stages.items():
                row.stats.stage_seconds[stage] += seconds
            row.stats.record_round(accepted, drafted[index])
            result = row.emit(tokens[1:] + [next_token], accepted, logprobs)
            result.num_drafted_nodes = drafted[index]
            result.committed_tokens, result.path = tokens, path
            outputs.append((row.request_id, result))
            if row.finished:
                self.running.pop(row.request_id, None)
                self._release(row)
        return outputs

    def _release(self, row: Row) -> None:
        if row.slot >= 0:
            self.slots.free(row.slot)
            if row.drafting and self.drafting is not None:
                self.drafting.release(row.slot, row.request_id)
        row.slot = -1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
