"""The engine's drafting step over the wire: `RemoteDrafter` implements the engine's
Drafting interface (ddtree/engine/drafting.py) with the gRPC Draft stream.

Per round it sends ONE DraftRequest whose DraftBatch carries every drafting row: the
newly committed target features of all rows in one tensor (gathered on the device and
copied to the host once), their bonus tokens and committed lengths, a row's spec only in
its first round; it waits for the trees (two tensors for all rows) under a deadline
derived from the measured round trip, validates all trees at once and sends them to the
round's static buffers in one host-to-device copy. No loop over rows touches a tensor
element by element. A row whose tree is missing, late, stale or invalid continues in ar
(still exact): the drafter's copy of its context is no longer trusted.

A row admitted this step opens its drafter session after its first round's verify is
launched (`overlap_verify`): its prompt features (P x k*H, ~0.9 MB for the demo pair at
150 tokens) travel and the drafter builds its first context while the verifier's GPU
verifies, instead of inside the round's exchange, where every running row waited for them
(lease 18: a step that admitted took 13.0 ms against 6.3 through a drafter service at c8).
That first round verifies the row's root alone (one token, as ar); it drafts from the next.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import structlog
import torch
from torch import Tensor

from ddtree import draft_codec
from ddtree.engine.draft_graphs import segment_rows
from ddtree.engine.round import RoundBuffers
from ddtree.engine.rows import Row
from ddtree.errors import TreeValidationError
from ddtree.tree_validation import CheckedRows, check_rows
from ddtree.v1 import drafter_pb2
from verifier_svc.drafter_client import DrafterClient, DrafterUnavailable, DraftTicket

if TYPE_CHECKING:
    from ddtree.engine.core import Engine

log = structlog.get_logger("verifier_svc.remote_drafter")

# The deadline of a round's reply: this many times the recent round trip, within bounds.
DEADLINE_FACTOR, MIN_DEADLINE_S = 8.0, 0.25
# Weight of the newest round trip in the moving average.
EMA_WEIGHT = 0.2
# Planes of the staged trees (_Staging).
TOKENS, PARENTS, DEPTH, VALID = range(4)


class RemoteDrafter:
    def __init__(self, client: DrafterClient, info: drafter_pb2.DrafterInfo,
                 max_timeout_s: float, new_shape_timeout_s: float | None = None) -> None:
        self.client = client
        self.info = info
        self.block_size = info.block_size
        self.target_layer_ids = tuple(info.target_layer_ids)
        self.max_timeout_s = max_timeout_s
        self.new_shape_timeout_s = (max_timeout_s if new_shape_timeout_s is None
                                    else new_shape_timeout_s)
        self._round_trip_s: float | None = None
        # (drafting rows, tree nodes) the drafter has answered once: its first round of a
        # shape captures that shape's CUDA graphs (~0.3 s on the H200, past the adaptive
        # deadline of a few ms rounds: every row of the round then stopped drafting).
        self._shapes_seen: set[tuple[int, int]] = set()
        self._first_features: dict[str, _FirstContext] = {}  # request id -> prompt rows
        self._opening: list[Row] = []  # rows whose session opens after this round's launch
        self._sent_spec: set[str] = set()
        self._staging: dict[tuple[int, int], _Staging] = {}

    @property
    def available(self) -> bool:
        """Connected to a drafter that fits (new rows draft only then)."""
        info = self.client.info
        return info is not None and (info.block_size, tuple(info.target_layer_ids)) == (
            self.block_size, self.target_layer_ids)

    def deadline_s(self, shape: tuple[int, int]) -> float:
        """How long a round of `shape` (drafting rows, tree nodes) waits for its trees:
        `new_shape_timeout_s` for a shape the drafter has not answered yet (its graph
        capture, and on a fresh host the compile of kernels specialised to it: 10-13 s per
        tree size on the H200, lease 9), else a multiple of the recent round trip (timed
        once any shape was answered) within bounds."""
        if shape not in self._shapes_seen or self._round_trip_s is None:
            return self.new_shape_timeout_s
        return min(self.max_timeout_s, max(MIN_DEADLINE_S, DEADLINE_FACTOR * self._round_trip_s))

    @staticmethod
    def shape_of(rows: Sequence[Row]) -> tuple[int, int]:
        return len(rows), max((row.num_nodes for row in rows), default=0)

    def start(self, slot: int, request_id: str, features: Tensor) -> None:
        self._first_features[request_id] = _FirstContext.of(features)

    def release(self, slot: int, request_id: str) -> None:
        self._first_features.pop(request_id, None)
        if request_id in self._sent_spec:
            self._sent_spec.discard(request_id)
            self.client.release([request_id])

    def propose(self, engine: Engine, rows: list[Row], buffers: RoundBuffers,
                sent: Sequence[SentRound] = ()) -> None:
        """Fills `buffers`' trees for `rows` (root alone for rows that do not draft): the
        trees of the rounds in `sent` (asked for earlier by `send`) for their rows, one
        exchange now for the drafting rows none of them covers."""
        staging = self._staging_for(buffers)
        staging.wait()
        np.copyto(staging.planes, staging.default)  # (4, B, 1+N): tokens, parents, depth, valid
        staging.planes[TOKENS, : len(rows), 0] = [row.bonus_token for row in rows]
        vocab_size = engine.target.config.vocab_size
        covered: set[int] = set()
        if sent:
            place = {id(row): i for i, row in enumerate(rows)}
            for pending in sent:
                trees = self._receive(pending)
                covered.update(id(row) for row in pending.rows)
                self._place([(place.get(id(row), -1), row) for row in pending.rows], trees,
                            staging.host, vocab_size)
        drafting = [(i, row) for i, row in enumerate(rows)
                    if row.drafting and row.num_nodes and id(row) not in covered]
        # New rows: the root alone this round, their sessions opened once it is launched.
        self._opening = [row for _, row in drafting if row.request_id in self._first_features]
        for row in self._opening:
            row.root_only = True
        drafting = [(i, row) for i, row in drafting
                    if row.request_id not in self._first_features]
        if drafting:
            request, ordered = self._request(engine, drafting)
            trees = self._exchange(request, [row for _, row in ordered])
            self._place(ordered, trees, staging.host, vocab_size)
        staging.send(buffers)

    def overlap_verify(self, engine: Engine) -> None:
        """After a round's verify is launched: opens the drafter sessions of the round's
        new rows (their prompt features, spec and first token), without waiting for the
        reply; the drafter builds their contexts while the GPU verifies. A row whose
        session fails to open finds out in its next round (unknown session) and continues
        in ar."""
        for row in self._opening:
            row.root_only = False  # the engine has counted this round's trees
        opening = [(i, row) for i, row in enumerate(self._opening)
                   if row.drafting and row.request_id in self._first_features]
        self._opening = []
        if not opening:
            return
        request, ordered = self._request(engine, opening)
        try:
            self.client.post(request)
        except DrafterUnavailable as exc:
            for _, row in ordered:
                self._stop_drafting(row, str(exc))

    def send(self, engine: Engine, rows: list[Row]) -> SentRound | None:
        """Asks now for the next trees of `rows`' drafting rows and returns at once (the
        engine verifies another group meanwhile); None when no row drafts or there is no
        drafter (those rows then ask again in their round)."""
        drafting = [(i, row) for i, row in enumerate(rows) if row.drafting and row.num_nodes]
        if not drafting:
            return None
        request, ordered = self._request(engine, drafting)
        started = time.perf_counter()
        try:
            ticket = self.client.send(request)
        except DrafterUnavailable as exc:
            for _, row in ordered:
                self._stop_drafting(row, str(exc))
            return None
        return SentRound(ticket, [row for _, row in ordered], started)

    def abandon(self, sent: Sequence[SentRound]) -> None:
        """Rounds sent ahead that will not be verified: their replies are dropped, and a
        row still drafting stops (the drafter's copy of its context ran ahead)."""
        for pending in sent:
            pending.ticket.stream.forget(pending.ticket.round_id)
            for row in pending.rows:
                if row.drafting and row.slot >= 0:  # not released (ended, aborted) yet
                    self._stop_drafting(row, "its draft round was abandoned")

    def _receive(self, pending: SentRound) -> drafter_pb2.DraftTrees | None:
        try:
            shape = self.shape_of(pending.rows)
            trees = self.client.receive(pending.ticket, self.deadline_s(shape))
        except DrafterUnavailable as exc:
            log.warning("drafter_round_failed", reason=str(exc), num_rows=len(pending.rows))
            return None
        self._observe(time.perf_counter() - pending.started, shape)
        return trees

    def _staging_for(self, buffers: RoundBuffers) -> _Staging:
        shape = (buffers.batch, 1 + buffers.num_nodes)
        if shape not in self._staging:
            self._staging[shape] = _Staging(buffers.batch, 1 + buffers.num_nodes,
                                            buffers.tokens.device)
        return self._staging[shape]

    def _request(self, engine: Engine, drafting: list[tuple[int, Row]]
                 ) -> tuple[drafter_pb2.DraftRequest, list[tuple[int, Row]]]:
        """The round's request, its DraftBatch built in place: rows that start drafting
        (their prompt features) first, then the continuing ones (their pending features,
        gathered in one index_select and copied to the host once). -> (request, the
        (batch index, row) of its rows in order)."""
        new = [(i, row) for i, row in drafting if row.request_id in self._first_features]
        continuing = [(i, row) for i, row in drafting
                      if row.request_id not in self._first_features]
        parts = [self._first_features.pop(row.request_id).rows() for _, row in new]
        num_features = [part.shape[0] for part in parts]
        if continuing:
            pending = engine.state.pending
            assert pending is not None
            counts = np.array([row.num_pending for _, row in continuing], dtype=np.int64)
            slots = np.array([row.slot for _, row in continuing], dtype=np.int64)
            index = segment_rows(slots * self.block_size, counts)
            flat = pending.view(-1, pending.shape[-1])  # (slots * b, k*H)
            parts.append(flat.index_select(0, torch.from_numpy(index).to(flat.device)).cpu())
            num_features += counts.tolist()
        features = parts[0] if len(parts) == 1 else torch.cat(parts)  # (sum C, k*H) host
        ordered = new + continuing
        specs = {j: row.request.spec for j, (_, row) in enumerate(ordered)
                 if row.request_id not in self._sent_spec}
        if specs:
            self._sent_spec.update(row.request_id for _, row in ordered)
        request = drafter_pb2.DraftRequest()
        draft_codec.draft_batch_to_proto(
            [row.request_id for _, row in ordered], [row.committed_len for _, row in ordered],
            [row.bonus_token for _, row in ordered], features, num_features, specs,
            out=request.batch, num_nodes=[row.num_nodes for _, row in ordered],
            force_chain=[row.force_chain for _, row in ordered])
        return request, ordered

    def _exchange(self, request: drafter_pb2.DraftRequest,
                  rows: Sequence[Row]) -> drafter_pb2.DraftTrees | None:
        started, shape = time.perf_counter(), self.shape_of(rows)
        try:
            trees = self.client.exchange(request, self.deadline_s(shape))
        except DrafterUnavailable as exc:
            log.warning("drafter_round_failed", reason=str(exc), num_rows=len(rows))
            return None
        self._observe(time.perf_counter() - started, shape)
        return trees

    def _observe(self, elapsed: float, shape: tuple[int, int]) -> None:
        """One round trip of `shape` into the moving average the deadline follows (a
        shape's first, which may include a capture, only marks the shape as seen)."""
        first_of_shape = shape not in self._shapes_seen
        self._shapes_seen.add(shape)
        if first_of_shape and self._round_trip_s is not None:
            return
        self._round_trip_s = elapsed if self._round_trip_s is None else (
            (1 - EMA_WEIGHT) * self._round_trip_s + EMA_WEIGHT * elapsed)

    def _place(self, ordered: list[tuple[int, Row]], msg: drafter_pb2.DraftTrees | None,
               host: Tensor, vocab_size: int) -> None:
        """Checks every row's tree at once and writes the good ones into `host`
        (4, B, 1+N); the other rows continue in ar. A row at batch index -1 (it ended,
        or is not in this round) or no longer drafting is skipped."""
        rows = [row for _, row in ordered]
        live = np.array([i >= 0 and row.drafting for i, row in ordered], dtype=bool)
        width = host.shape[2]
        try:
            if msg is None:
                raise TreeValidationError("no draft result for this row")
            trees = draft_codec.draft_trees_from_proto(msg, len(rows), width)
        except TreeValidationError as exc:
            reason = str(exc) if msg is None else f"invalid trees from the drafter: {exc}"
            for j in np.flatnonzero(live).tolist():
                self._stop_drafting(rows[j], reason)
            return
        problems, checked = self._check(rows, trees, vocab_size, width - 1)
        for j, problem in sorted(problems.items()):
            if live[j]:
                self._stop_drafting(rows[j], problem)
        good: slice | np.ndarray = slice(None)  # every row, the rule
        if problems or not live.all():
            bad = np.zeros(len(rows), dtype=bool)
            bad[list(problems)] = True
            good = np.flatnonzero(live & ~bad)
            if not len(good):
                return
        index = np.array([i for i, _ in ordered])[good]  # (G,) the rows' places in the batch
        real = checked.real[good]  # (G, W)
        host.numpy()[:, index, : real.shape[1]] = np.stack([  # (4, G, W)
            np.where(real, trees.tokens[good], 0), checked.parents[good], checked.depth[good],
            real])

    def tree_problems(self, rows: list[Row], trees: draft_codec.DraftedTrees, vocab_size: int,
                      max_nodes: int) -> dict[int, str]:
        """Why each bad row's tree cannot be verified (row index in the batch -> reason),
        in the order of the checks; vectorised over the rows."""
        return self._check(rows, trees, vocab_size, max_nodes)[0]

    def _check(self, rows: list[Row], trees: draft_codec.DraftedTrees, vocab_size: int,
               max_nodes: int) -> tuple[dict[int, str], CheckedRows]:
        """tree_problems, and check_rows' verdict (the good rows' parents and depths)."""
        problems: dict[int, str] = {}
        for j, (error, code) in trees.errors.items():
            problems[j] = f"drafter error {code}: {error}"
        committed, num_nodes, bonus = np.array(  # (3, R)
            [(row.committed_len, row.num_nodes, row.bonus_token) for row in rows],
            dtype=np.int64).reshape(-1, 3).T
        stale = trees.committed_len != committed
        limit = np.minimum(num_nodes, max_nodes) + 1  # the root too
        too_big, missing = trees.num_nodes > limit, trees.num_nodes < 1
        checked = check_rows(trees.tokens, trees.parents, np.maximum(trees.num_nodes, 1),
                             vocab_size, self.block_size - 1)
        roots = trees.tokens[:, 0]
        wrong_root = roots != bonus
        if not (problems or checked.problems or (stale | too_big | missing | wrong_root).any()):
            return problems, checked  # every tree is good: the rule
        for j in np.flatnonzero(stale).tolist():
            problems.setdefault(j, f"stale tree built on committed length "
                                   f"{trees.committed_len[j]}, the row is at {committed[j]}")
        for j in np.flatnonzero(too_big).tolist():
            problems.setdefault(j, f"invalid tree from the drafter: tree: "
                                   f"{trees.num_nodes[j] - 1} nodes besides the root exceed "
                                   f"max_nodes {limit[j] - 1}")
        for j in np.flatnonzero(missing).tolist():
            problems.setdefault(j, "no draft result for this row")
        for j, problem in checked.problems.items():
            problems.setdefault(j, f"invalid tree from the drafter: {problem}")
        for j in np.flatnonzero(wrong_root).tolist():
            problems.setdefault(j, f"invalid tree from the drafter: tree root {roots[j]} is "
                                   f"not the bonus token {bonus[j]}")
        return problems, checked

    def _stop_drafting(self, row: Row, reason: str) -> None:
        log.warning("drafter_fallback_ar", request_id=row.request_id, reason=reason)
        row.drafting = False
        row.num_nodes = 0
        self.release(row.slot, row.request_id)


@dataclass(frozen=True)
class _FirstContext:
    """A new row's prompt features on their way to the host: copied to pinned memory
    right after the prefill, on the stream, so that reading them later waits for that
    copy only, not for the round launched meanwhile."""

    host: Tensor  # (P, k*H)
    copied: torch.cuda.Event | None

    @classmethod
    def of(cls, features: Tensor) -> _FirstContext:
        if features.device.type != "cuda":
            return cls(features, None)
        host = torch.empty(features.shape, dtype=features.dtype, pin_memory=True)
        host.copy_(features, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return cls(host, copied)

    def rows(self) -> Tensor:
        if self.copied is not None:
            self.copied.synchronize()
        return self.host


@dataclass
class SentRound:
    """A draft round asked for by `RemoteDrafter.send`: its ticket, its rows (in the
    request's order) and when it was sent."""

    ticket: DraftTicket
    rows: list[Row]
    started: float


class _Staging:
    """A round's trees on their way to RoundBuffers of one shape: host (4, B, 1+N) int64
    (tokens, parents, depth, valid; pinned on a GPU) written by the host through `planes`
    (its numpy view), sent with ONE copy to the device and spread from there into the
    buffers, without a host sync (on the CPU the host copy is spread directly).
    `default` (numpy) is every row's tree as the root alone (padding nodes depth 1)."""

    def __init__(self, batch: int, width: int, device: torch.device) -> None:
        pinned = device.type == "cuda"
        self.default = np.zeros((4, batch, width), dtype=np.int64)
        self.default[PARENTS, :, 0] = -1
        self.default[DEPTH, :, 1:] = 1
        self.default[VALID, :, 0] = 1
        self.host = torch.zeros(4, batch, width, dtype=torch.long, pin_memory=pinned)
        self.planes = self.host.numpy()
        self.on_device = torch.zeros(4, batch, width, dtype=torch.long, device=device) if (
            pinned) else self.host
        # The host copy is rewritten only after its last copy to the device finished.
        self.sent = torch.cuda.Event() if pinned else None

    def send(self, buffers: RoundBuffers) -> None:
        if self.on_device is not self.host:
            self.on_device.copy_(self.host, non_blocking=True)
        for plane, buffer in ((TOKENS, buffers.tokens), (PARENTS, buffers.parents),
                              (DEPTH, buffers.depth), (VALID, buffers.valid)):
            buffer.copy_(self.on_device[plane])
        if self.sent is not None:
            self.sent.record()

    def wait(self) -> None:
        if self.sent is not None:
            self.sent.synchronize()
