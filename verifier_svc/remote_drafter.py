"""The engine's drafting step over the wire: `RemoteDrafter` implements the engine's
Drafting interface (ddtree/engine/drafting.py) with the gRPC Draft stream.

Per round it sends ONE DraftRequest with an item per drafting row (the row's newly
committed target features, its bonus token and committed length; its spec only with its
first item), waits for the trees under a deadline derived from the measured round trip,
validates each tree (vectorised) and writes all of them into the round's static buffers in
one copy per tensor. A row whose tree is missing, late, stale or invalid continues in ar
(still exact): the drafter's copy of its context is no longer trusted.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import structlog
import torch
from torch import Tensor

from ddtree import codec
from ddtree.engine.round import RoundBuffers
from ddtree.engine.rows import Row
from ddtree.errors import InvalidArgumentError
from ddtree.tree_validation import validate_tree
from ddtree.v1 import common_pb2, drafter_pb2
from verifier_svc.drafter_client import DrafterClient, DrafterUnavailable

if TYPE_CHECKING:
    from ddtree.engine.core import Engine

log = structlog.get_logger("verifier_svc.remote_drafter")

# The deadline of a round's reply: this many times the recent round trip, within bounds.
DEADLINE_FACTOR, MIN_DEADLINE_S = 8.0, 0.25
# Weight of the newest round trip in the moving average.
EMA_WEIGHT = 0.2


class RemoteDrafter:
    def __init__(self, client: DrafterClient, info: drafter_pb2.DrafterInfo,
                 max_timeout_s: float) -> None:
        self.client = client
        self.info = info
        self.block_size = info.block_size
        self.target_layer_ids = tuple(info.target_layer_ids)
        self.max_timeout_s = max_timeout_s
        self._round_trip_s: float | None = None
        self._first_features: dict[str, Tensor] = {}  # request id -> (P, k*H) prompt rows
        self._sent_spec: set[str] = set()

    @property
    def available(self) -> bool:
        """Connected to a drafter that fits (new rows draft only then)."""
        info = self.client.info
        return info is not None and (info.block_size, tuple(info.target_layer_ids)) == (
            self.block_size, self.target_layer_ids)

    def deadline_s(self) -> float:
        if self._round_trip_s is None:
            return self.max_timeout_s  # the first rounds include the drafter's warm-up
        return min(self.max_timeout_s, max(MIN_DEADLINE_S, DEADLINE_FACTOR * self._round_trip_s))

    def start(self, slot: int, request_id: str, features: Tensor) -> None:
        self._first_features[request_id] = features

    def release(self, slot: int, request_id: str) -> None:
        self._first_features.pop(request_id, None)
        if request_id in self._sent_spec:
            self._sent_spec.discard(request_id)
            self.client.release([request_id])

    def propose(self, engine: Engine, rows: list[Row], buffers: RoundBuffers) -> None:
        """Fills `buffers`' trees for `rows` (root alone for rows that do not draft)."""
        drafting = [(i, row) for i, row in enumerate(rows) if row.drafting and row.num_nodes]
        shape = (buffers.batch, 1 + buffers.num_nodes)
        tokens = np.zeros(shape, dtype=np.int64)
        parents = np.zeros(shape, dtype=np.int64)
        parents[:, 0] = -1
        valid = np.zeros(shape, dtype=bool)
        valid[:, 0] = True
        for i, row in enumerate(rows):
            tokens[i, 0] = row.bonus_token
        if drafting:
            results = self._exchange(engine, [row for _, row in drafting])
            for i, row in drafting:
                self._place(row, results.get(row.request_id), i, tokens, parents, valid,
                            engine.target.config.vocab_size, buffers.num_nodes)
        depth = _depths(parents, valid)
        for buffer, array in ((buffers.tokens, tokens), (buffers.parents, parents),
                              (buffers.depth, depth), (buffers.valid, valid)):
            buffer.copy_(torch.from_numpy(array), non_blocking=False)

    def _exchange(self, engine: Engine,
                  rows: list[Row]) -> dict[str, drafter_pb2.DraftResult]:
        items = self._items(engine, rows)
        started = time.perf_counter()
        try:
            results = self.client.exchange(items, self.deadline_s())
        except DrafterUnavailable as exc:
            log.warning("drafter_round_failed", reason=str(exc), num_rows=len(rows))
            return {}
        elapsed = time.perf_counter() - started
        self._round_trip_s = elapsed if self._round_trip_s is None else (
            (1 - EMA_WEIGHT) * self._round_trip_s + EMA_WEIGHT * elapsed)
        return results

    def _items(self, engine: Engine, rows: list[Row]) -> list[drafter_pb2.DraftItem]:
        """One item per row; the pending features of all continuing rows in one copy."""
        continuing = [row for row in rows if row.request_id not in self._first_features]
        pending: dict[str, Tensor] = {}
        if continuing:
            assert engine.state.pending is not None
            slots = torch.tensor([row.slot for row in continuing], device=engine.device)
            host = engine.state.pending[slots].cpu()  # (R, b, k*H)
            pending = {row.request_id: host[j, : row.num_pending]
                       for j, row in enumerate(continuing)}
        items = []
        for row in rows:
            features = self._first_features.pop(row.request_id, None)
            if features is None:
                features = pending[row.request_id]
            item = drafter_pb2.DraftItem(
                session_id=row.request_id, committed_len=row.committed_len,
                bonus_token=row.bonus_token, features=codec.tensor_to_proto(features))
            if row.request_id not in self._sent_spec:
                item.spec.CopyFrom(codec.spec_to_proto(row.request.spec))
                self._sent_spec.add(row.request_id)
            items.append(item)
        return items

    def _place(self, row: Row, result: drafter_pb2.DraftResult | None, index: int,
               tokens: np.ndarray, parents: np.ndarray, valid: np.ndarray, vocab_size: int,
               width: int) -> None:
        """Checks the row's tree and writes it at batch row `index`; otherwise the row
        continues in ar."""
        problem = None
        if result is None:
            problem = "no draft result for this row"
        elif result.error:
            problem = f"drafter error {result.error_code}: {result.error}"
        elif result.committed_len != row.committed_len:
            problem = (f"stale tree built on committed length {result.committed_len}, the "
                       f"row is at {row.committed_len}")
        else:
            try:
                tree_tokens, tree_parents = self._checked(result.tree, row, vocab_size, width)
            except InvalidArgumentError as exc:
                problem = f"invalid tree from the drafter: {exc}"
        if problem is not None:
            self._stop_drafting(row, problem)
            return
        size = tree_tokens.shape[0]
        tokens[index, :size], parents[index, :size] = tree_tokens, tree_parents
        valid[index, :size] = True

    def _checked(self, msg: common_pb2.DraftTree, row: Row, vocab_size: int,
                 width: int) -> tuple[np.ndarray, np.ndarray]:
        tree = codec.tree_from_proto(msg, max_nodes=min(row.num_nodes, width))
        validate_tree(tree.tokens[0], tree.parents[0], vocab_size, width, self.block_size - 1)
        if int(tree.tokens[0, 0]) != row.bonus_token:
            raise InvalidArgumentError(
                f"tree root {int(tree.tokens[0, 0])} is not the bonus token {row.bonus_token}")
        return tree.tokens[0].numpy(), tree.parents[0].numpy()

    def _stop_drafting(self, row: Row, reason: str) -> None:
        log.warning("drafter_fallback_ar", request_id=row.request_id, reason=reason)
        row.drafting = False
        row.num_nodes = 0
        self.release(row.slot, row.request_id)


def _depths(parents: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(B, 1+N) depth of each node of topologically ordered trees; padding nodes 1."""
    depth = np.zeros_like(parents)
    for i in range(1, parents.shape[1]):
        depth[:, i] = depth[np.arange(parents.shape[0]), np.maximum(parents[:, i], 0)] + 1
    return np.where(valid, depth, 1)
