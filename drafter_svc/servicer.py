"""The Drafter gRPC servicer: decodes a round's DraftItems, drafts all of them in ONE
batched round of the drafter (`ddtree.engine.draft_graphs`, a CUDA graph replay on a GPU),
encodes the trees. A failed item carries its error in its DraftResult; the stream lives on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import structlog
import torch
from torch import Tensor

from ddtree import codec
from ddtree.engine.draft_graphs import DraftInputs, GraphDrafter
from ddtree.engine.request import MODE_RULES, SpecParams
from ddtree.errors import DDTreeError, InvalidArgumentError
from ddtree.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc
from drafter_svc.sessions import DraftRow, DraftSessionTable

log = structlog.get_logger("drafter_svc")


@dataclass
class _Prepared:
    """One decoded item of this round: its row and the features not yet in its context."""

    index: int
    row: DraftRow
    committed_len: int
    bonus: int
    pending: Tensor  # (C, k*H), C <= block_size (C = 0 for a session opened this round)


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
        self._model_lock = threading.Lock()

    def GetInfo(
        self, request: drafter_pb2.DrafterInfoRequest, context: grpc.ServicerContext
    ) -> drafter_pb2.DrafterInfo:
        return self.info

    def Draft(
        self, request_iterator: Iterator[drafter_pb2.DraftRequest], context: grpc.ServicerContext
    ) -> Iterator[drafter_pb2.DraftResponse]:
        """One reply per request (also for release-only requests, so replies pair up).

        Sessions opened on this stream die with it: a verifier that lost the stream
        cannot continue them anyway (it falls back to ar), so their rows are freed at once.
        """
        opened: set[str] = set()
        peer = context.peer()
        log.info("draft_stream_open", peer=peer)
        try:
            for request in request_iterator:
                self.sessions.release(request.release_sessions)
                opened.difference_update(request.release_sessions)
                results = self._draft_round(list(request.items), opened)
                yield drafter_pb2.DraftResponse(round_id=request.round_id, results=results)
        finally:
            self.sessions.release(opened)
            log.info("draft_stream_closed", peer=peer, num_released=len(opened))

    def _draft_round(self, items: list[drafter_pb2.DraftItem],
                     opened: set[str]) -> list[drafter_pb2.DraftResult]:
        results = [drafter_pb2.DraftResult(session_id=item.session_id,
                                           committed_len=item.committed_len) for item in items]
        prepared = []
        with self._model_lock:
            for index, item in enumerate(items):
                try:
                    prepared.append(self._prepare(index, item, opened))
                except Exception as exc:  # noqa: BLE001 - reported per item, below
                    _fail(results[index], exc, item.session_id)
            if prepared:
                try:
                    trees = self._propose(prepared)
                except Exception as exc:  # noqa: BLE001 - every item of the batch fails
                    for p in prepared:
                        _fail(results[p.index], exc, items[p.index].session_id)
                    return results
                for p, tree in zip(prepared, trees, strict=True):
                    results[p.index].tree.CopyFrom(tree)
                    p.row.context_len = p.committed_len
        return results

    def _prepare(self, index: int, item: drafter_pb2.DraftItem, opened: set[str]) -> _Prepared:
        features = self._decode_features(item)
        if item.session_id in opened or not item.HasField("spec"):
            row = self.sessions.get(item.session_id, item.committed_len, features.shape[0])
            if features.shape[0] > self.drafter.block_size:
                raise InvalidArgumentError(
                    f"features: {features.shape[0]} new rows exceed the block size "
                    f"{self.drafter.block_size}")
            return _Prepared(index, row, item.committed_len, item.bonus_token, features)
        spec = codec.spec_from_proto(item.spec, SpecParams(), self.info.max_budget)
        if not MODE_RULES[spec.mode].drafts:
            raise InvalidArgumentError(f"spec.mode {spec.mode} has nothing to draft")
        if features.shape[0] != item.committed_len:
            raise InvalidArgumentError(
                f"a new session needs the features of all {item.committed_len} committed "
                f"rows, got {features.shape[0]}")
        row = self.sessions.open(item.session_id, spec)
        opened.add(item.session_id)
        self.drafter.start(row.slot, item.session_id, features.to(self.device))
        return _Prepared(index, row, item.committed_len, item.bonus_token, features[:0])

    def _decode_features(self, item: drafter_pb2.DraftItem) -> Tensor:
        """-> features (C, k*H) on the CPU, checked."""
        features = codec.tensor_from_proto(item.features, "features", ndim=2)
        if features.shape[1] != self.feature_width:
            raise InvalidArgumentError(
                f"features: width {features.shape[1]}, expected {self.feature_width} "
                f"(k={len(self.info.target_layer_ids)} layers x hidden {self.info.hidden_size})")
        if not features.is_floating_point():
            raise InvalidArgumentError(f"features: dtype {features.dtype} is not floating point")
        if not 0 <= item.bonus_token < self.info.vocab_size:
            raise InvalidArgumentError(
                f"bonus_token {item.bonus_token} out of [0, {self.info.vocab_size})")
        if item.committed_len < features.shape[0]:
            raise InvalidArgumentError(
                f"committed_len {item.committed_len} < {features.shape[0]} feature rows")
        return features

    def _propose(self, prepared: list[_Prepared]) -> list[common_pb2.DraftTree]:
        """Every prepared item's tree from one batched drafter round (a graph replay)."""
        block = self.drafter.block_size
        pending = torch.zeros(len(prepared), block, self.feature_width)
        for j, p in enumerate(prepared):
            pending[j, : p.pending.shape[0]] = p.pending.float()
        tree = self.graphs.propose(DraftInputs(
            slots=[p.row.slot for p in prepared], committed=[p.committed_len for p in prepared],
            pending=pending, num_pending=[p.pending.shape[0] for p in prepared],
            bonus=[p.bonus for p in prepared], budget=[p.row.num_nodes for p in prepared],
            force_chain=[MODE_RULES[p.row.spec.mode].force_chain for p in prepared],
            max_topk=[p.row.spec.max_topk or 0 for p in prepared]))
        assert tree.valid is not None
        sizes = tree.valid.sum(dim=1).tolist()
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        return [common_pb2.DraftTree(tokens=tokens[j][:size], parents=parents[j][:size])
                for j, size in enumerate(sizes)]


def _fail(result: drafter_pb2.DraftResult, exc: Exception, session_id: str) -> None:
    if isinstance(exc, DDTreeError):
        result.error, result.error_code = str(exc), codec.status_code_for(exc).name
    else:
        log.error("draft_item_failed", session_id=session_id, exc_info=exc)
        result.error, result.error_code = "internal drafter error", "INTERNAL"
