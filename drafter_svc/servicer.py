"""The Drafter gRPC servicer: decodes a round (a DraftBatch, or wire version 1's
DraftItems), drafts all its rows in ONE batched round of the drafter
(`ddtree.engine.draft_graphs`, a CUDA graph replay on a GPU), encodes the trees. Rows are
checked together (arrays, not a message per row); a failed row carries its error in the
reply and the stream lives on."""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator

import grpc
import numpy as np
import structlog
import torch
from torch import Tensor

from ddtree import codec, draft_codec
from ddtree.draft_codec import DraftedTrees, DraftRound
from ddtree.engine.draft_graphs import (
    BONUS,
    BUDGET,
    COMMITTED,
    FORCE_CHAIN,
    MAX_TOPK,
    NUM_PENDING,
    SLOTS,
    DraftInputs,
    GraphDrafter,
    segment_rows,
)
from ddtree.engine.request import MODE_RULES, SpecParams
from ddtree.errors import DDTreeError, InvalidArgumentError, SessionNotFoundError
from ddtree.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc
from drafter_svc.sessions import DraftRow, DraftSessionTable

log = structlog.get_logger("drafter_svc")


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, graphs: GraphDrafter, sessions: DraftSessionTable,
                 info: drafter_pb2.DrafterInfo) -> None:
        self.graphs = graphs
        self.drafter = graphs.drafter
        self.sessions = sessions
        self.info = info
        self.device = self.drafter.embeddings.embed_tokens.weight.device
        self.feature_width = len(info.target_layer_ids) * info.hidden_size  # k*H
        # One model, many streams (M verifiers): one round at a time.
        self.model_lock = threading.Lock()

    def GetInfo(
        self, request: drafter_pb2.DrafterInfoRequest, context: grpc.ServicerContext
    ) -> drafter_pb2.DrafterInfo:
        return self.info

    def Draft(
        self, request_iterator: Iterator[drafter_pb2.DraftRequest], context: grpc.ServicerContext
    ) -> Iterator[drafter_pb2.DraftResponse]:
        """The Draft stream over gRPC (`serve_stream`)."""
        yield from self.serve_stream(request_iterator, context.peer())

    def serve_stream(self, request_iterator: Iterator[drafter_pb2.DraftRequest],
                     peer: str) -> Generator[drafter_pb2.DraftResponse, None, None]:
        """A Draft stream, over gRPC or the Unix socket (drafter_svc/local_socket.py): one
        reply per request (also for release-only requests, so replies pair up); a batch
        is answered with trees, items (wire version 1) with results.

        Sessions opened on this stream die with it: a verifier that lost the stream
        cannot continue them anyway (it falls back to ar), so their rows are freed at once.
        """
        opened: set[str] = set()
        log.info("draft_stream_open", peer=peer)
        try:
            for request in request_iterator:
                if request.release_sessions:
                    self.sessions.release(request.release_sessions)
                    opened.difference_update(request.release_sessions)
                reply = drafter_pb2.DraftResponse(round_id=request.round_id)
                if request.items:
                    reply.results.extend(self._draft_items(list(request.items), opened))
                if request.HasField("batch"):
                    self._draft_round(request.batch, opened, reply.trees)
                yield reply
        finally:
            self.sessions.release(opened)
            log.info("draft_stream_closed", peer=peer, num_released=len(opened))

    def _draft_round(self, msg: drafter_pb2.DraftBatch, opened: set[str],
                     out: drafter_pb2.DraftTrees) -> None:
        """A batch's trees, written into `out` (the reply's); a malformed batch fails
        every row."""
        try:
            batch = draft_codec.draft_round_from_proto(msg, self.feature_width)
        except InvalidArgumentError as exc:
            num_rows = len(msg.session_ids)
            empty, zeros = np.zeros((num_rows, 1), np.int64), np.zeros(num_rows, np.int64)
            errors = dict.fromkeys(range(num_rows), _error(exc, ""))
            self._pack(DraftedTrees(empty, empty, zeros, zeros, errors), out)
            return
        self._pack(self._draft(batch, opened, {}), out)

    def _pack(self, trees: DraftedTrees, out: drafter_pb2.DraftTrees) -> None:
        draft_codec.draft_trees_to_proto(trees, out)

    def _draft_items(self, items: list[drafter_pb2.DraftItem],
                     opened: set[str]) -> list[drafter_pb2.DraftResult]:
        """Wire version 1: the items as one batch; an item whose features are malformed
        fails alone."""
        failed: dict[int, Exception] = {}
        features = []
        for index, item in enumerate(items):
            try:
                features.append(self._decode_features(item).float())
            except InvalidArgumentError as exc:
                failed[index] = exc
                features.append(torch.zeros(0, self.feature_width))
        batch = DraftRound(
            [item.session_id for item in items],
            np.array([item.committed_len for item in items], dtype=np.int64),
            np.array([item.bonus_token for item in items], dtype=np.int64),
            np.array([f.shape[0] for f in features], dtype=np.int64),
            torch.cat(features) if features else torch.zeros(0, self.feature_width),
            {i: item.spec for i, item in enumerate(items) if item.HasField("spec")})
        trees = self._draft(batch, opened, failed)
        results = []
        for j, item in enumerate(items):
            result = drafter_pb2.DraftResult(session_id=item.session_id,
                                             committed_len=item.committed_len)
            if j in trees.errors:
                result.error, result.error_code = trees.errors[j]
            else:
                size = int(trees.num_nodes[j])
                result.tree.tokens.extend(trees.tokens[j, :size].tolist())
                result.tree.parents.extend(trees.parents[j, :size].tolist())
            results.append(result)
        return results

    def _decode_features(self, item: drafter_pb2.DraftItem) -> Tensor:
        """-> features (C, k*H) on the CPU, checked (wire version 1)."""
        features = codec.tensor_from_proto(item.features, "features", ndim=2)
        if features.shape[1] != self.feature_width:
            raise InvalidArgumentError(
                f"features: width {features.shape[1]}, expected {self.feature_width} "
                f"(k={len(self.info.target_layer_ids)} layers x hidden {self.info.hidden_size})")
        if not features.is_floating_point():
            raise InvalidArgumentError(f"features: dtype {features.dtype} is not floating point")
        return features

    def _draft(self, batch: DraftRound, opened: set[str],
               failed: dict[int, Exception]) -> DraftedTrees:
        """Every row's tree from ONE batched drafter round (a graph replay); the rows in
        `failed` (and those that fail their checks here) get their error instead."""
        num_rows = len(batch.session_ids)
        max_nodes = max(self.info.max_budget, self.info.block_size - 1)  # a chain always fits
        _check_rows(batch, self.info.vocab_size, max_nodes, failed)
        tokens = parents = np.zeros((num_rows, 1), dtype=np.int64)
        num_nodes = np.zeros(num_rows, dtype=np.int64)
        with self.model_lock:
            drafted = self._rows_of(batch, opened, failed)
            if drafted:
                try:
                    tree = self.graphs.propose(self._inputs(batch, drafted))
                except Exception as exc:  # noqa: BLE001 - every row of the batch fails
                    failed.update((r, exc) for r, _, _ in drafted)
                else:
                    index = [r for r, _, _ in drafted]
                    tokens, parents = tree.tokens, tree.parents
                    if len(drafted) < num_rows:  # the failed rows' trees stay empty
                        tokens = np.zeros((num_rows, tree.tokens.shape[1]), dtype=np.int64)
                        parents = np.zeros_like(tokens)
                        tokens[index], parents[index] = tree.tokens, tree.parents
                    num_nodes[index] = tree.num_nodes
                    for (_, row, _), committed in zip(
                            drafted, batch.committed_len[index].tolist(), strict=True):
                        row.context_len = committed
        errors = {r: _error(exc, batch.session_ids[r]) for r, exc in failed.items()}
        return DraftedTrees(tokens, parents, num_nodes, batch.committed_len, errors)

    def _rows_of(self, batch: DraftRound, opened: set[str],
                 failed: dict[int, Exception]) -> list[tuple[int, DraftRow, bool]]:
        """(row index, session row, opened now) of each row that drafts this round: known
        sessions whose context ends where the new features start, and new sessions
        (opened here, their features put in their context)."""
        drafted = []
        rows = self.sessions.lookup(batch.session_ids)
        starts = batch.feature_starts
        for r, (session_id, row, committed, num_new) in enumerate(zip(
                batch.session_ids, rows, batch.committed_len.tolist(),
                batch.num_features.tolist(), strict=True)):
            if r in failed:
                continue
            try:
                if session_id in opened or r not in batch.specs:
                    drafted.append((r, self._continuing(row, session_id, committed, num_new),
                                    False))
                else:
                    features = batch.features[starts[r]: starts[r] + num_new]
                    drafted.append((r, self._open(session_id, batch.specs[r], committed,
                                                  features, opened), True))
            except Exception as exc:  # noqa: BLE001 - reported per row
                failed[r] = exc
        return drafted

    def _continuing(self, row: DraftRow | None, session_id: str, committed_len: int,
                    num_new: int) -> DraftRow:
        """A known session whose context plus the new rows ends at committed_len."""
        if row is None:
            raise SessionNotFoundError(
                f"unknown session {session_id!r}: a new session needs the features of all "
                f"{committed_len} committed rows and its spec, got {num_new} rows")
        if row.context_len + num_new != committed_len:
            raise InvalidArgumentError(
                f"draft context holds {row.context_len} tokens; {num_new} new rows do "
                f"not end at committed length {committed_len}")
        if num_new > self.drafter.block_size:
            raise InvalidArgumentError(
                f"features: {num_new} new rows exceed the block size {self.drafter.block_size}")
        return row

    def _open(self, session_id: str, msg: common_pb2.SpecParams, committed_len: int,
              features: Tensor, opened: set[str]) -> DraftRow:
        """A new session: its spec, and the features of all its committed rows."""
        spec = codec.spec_from_proto(msg, SpecParams(), self.info.max_budget)
        if not MODE_RULES[spec.mode].drafts:
            raise InvalidArgumentError(f"spec.mode {spec.mode} has nothing to draft")
        if features.shape[0] != committed_len:
            raise InvalidArgumentError(
                f"a new session needs the features of all {committed_len} committed "
                f"rows, got {features.shape[0]}")
        row = self.sessions.open(session_id, spec)
        opened.add(session_id)
        self.drafter.start(row.slot, session_id, features.to(self.device))
        return row

    def _inputs(self, batch: DraftRound, drafted: list[tuple[int, DraftRow, bool]]) -> DraftInputs:
        """The drafted rows' ints (7, R') and their new features, one gather each."""
        index = np.array([r for r, _, _ in drafted], dtype=np.int64)
        ints = np.empty((7, len(drafted)), dtype=np.int64)
        ints[[SLOTS, BUDGET, FORCE_CHAIN, MAX_TOPK]] = np.array(
            [(row.slot, row.num_nodes, row.force_chain, row.spec.max_topk or 0)
             for _, row, _ in drafted], dtype=np.int64).T
        if batch.num_nodes is not None and batch.force_chain is not None:  # this round's
            # tree of each row, from the verifier (its auto rows change size every round)
            ints[BUDGET], ints[FORCE_CHAIN] = batch.num_nodes[index], batch.force_chain[index]
        ints[COMMITTED], ints[BONUS] = batch.committed_len[index], batch.bonus_token[index]
        # A row that opens now has its features in its context already: nothing pending.
        ints[NUM_PENDING] = np.where([new for _, _, new in drafted], 0, batch.num_features[index])
        rows = segment_rows(batch.feature_starts[index], ints[NUM_PENDING])
        if len(rows) == batch.features.shape[0]:  # every feature row, in order (the rule)
            return DraftInputs(ints, batch.features)
        return DraftInputs(ints, batch.features[torch.from_numpy(rows)])


def _check_rows(batch: DraftRound, vocab_size: int, max_nodes: int,
                failed: dict[int, Exception]) -> None:
    """The checks of single rows that need no session, for all rows at once."""
    bonus, committed, num_new = batch.bonus_token, batch.committed_len, batch.num_features
    nodes = batch.num_nodes if batch.num_nodes is not None else np.ones_like(bonus)
    bad_nodes = (nodes < 1) | (nodes > max_nodes)
    if not ((bonus < 0) | (bonus >= vocab_size) | (committed < num_new) | bad_nodes).any():
        return  # the rule: one test for all rows, the loops below only name the bad ones
    for r in np.flatnonzero(bad_nodes).tolist():
        failed.setdefault(r, InvalidArgumentError(
            f"num_nodes {nodes[r]} out of [1, {max_nodes}]"))
    for r in np.flatnonzero((bonus < 0) | (bonus >= vocab_size)).tolist():
        failed.setdefault(r, InvalidArgumentError(
            f"bonus_token {bonus[r]} out of [0, {vocab_size})"))
    for r in np.flatnonzero(committed < num_new).tolist():
        failed.setdefault(r, InvalidArgumentError(
            f"committed_len {committed[r]} < {num_new[r]} feature rows"))


def _error(exc: Exception, session_id: str) -> tuple[str, str]:
    """(message, grpc status code name) of a failed row."""
    if isinstance(exc, DDTreeError):
        return str(exc), codec.status_code_for(exc).name
    log.error("draft_item_failed", session_id=session_id, exc_info=exc)
    return "internal drafter error", "INTERNAL"
