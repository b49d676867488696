"""The Drafter gRPC servicer: decodes each DraftItem, delegates to `DraftSession.propose`,
encodes the tree. A failed item carries its error in its DraftResult; the stream lives on."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import structlog
import torch

from ddtree import codec
from ddtree.engine import SpecParams
from ddtree.errors import DDTreeError, InvalidArgumentError
from ddtree.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_svc.sessions import DraftSessionTable

log = structlog.get_logger("drafter_svc")


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(
        self,
        sessions: DraftSessionTable,
        info: drafter_pb2.DrafterInfo,
        device: torch.device,
    ) -> None:
        self.sessions = sessions
        self.info = info
        self.device = device
        self.feature_width = len(info.target_layer_ids) * info.hidden_size  # k*H
        # One model, many streams (M verifiers): run one propose at a time.
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
        cannot continue them anyway (it falls back to ar), so their KV is freed at once.
        """
        opened: set[str] = set()
        peer = context.peer()
        log.info("draft_stream_open", peer=peer)
        try:
            for request in request_iterator:
                self.sessions.release(request.release_sessions)
                opened.difference_update(request.release_sessions)
                results = [self._draft_item(item, opened) for item in request.items]
                yield drafter_pb2.DraftResponse(round_id=request.round_id, results=results)
        finally:
            self.sessions.release(opened)
            log.info("draft_stream_closed", peer=peer, num_released=len(opened))

    def _draft_item(self, item: drafter_pb2.DraftItem, opened: set[str]) -> drafter_pb2.DraftResult:
        result = drafter_pb2.DraftResult(
            session_id=item.session_id, committed_len=item.committed_len
        )
        try:
            features, spec = self._decode_item(item)
            session = self.sessions.get_or_open(
                item.session_id, item.committed_len, features.shape[1]
            )
            opened.add(item.session_id)
            with self._model_lock:
                tree = session.propose(features, item.bonus_token, item.committed_len, spec)
            result.tree.CopyFrom(codec.tree_to_proto(tree))
        except DDTreeError as exc:
            result.error, result.error_code = str(exc), codec.status_code_for(exc).name
        except Exception:
            log.exception("draft_item_failed", session_id=item.session_id)
            result.error, result.error_code = "internal drafter error", "INTERNAL"
        return result

    def _decode_item(self, item: drafter_pb2.DraftItem) -> tuple[torch.Tensor, SpecParams]:
        """-> features (1, C, k*H) on the drafter's device, the resolved spec."""
        features = codec.tensor_from_proto(item.features, "features", ndim=2)  # (C, k*H)
        if features.shape[1] != self.feature_width:
            raise InvalidArgumentError(
                f"features: width {features.shape[1]}, expected {self.feature_width} "
                f"(k={len(self.info.target_layer_ids)} layers x hidden {self.info.hidden_size})"
            )
        if not features.is_floating_point():
            raise InvalidArgumentError(f"features: dtype {features.dtype} is not floating point")
        if not 0 <= item.bonus_token < self.info.vocab_size:
            raise InvalidArgumentError(
                f"bonus_token {item.bonus_token} out of [0, {self.info.vocab_size})"
            )
        if item.committed_len < features.shape[0]:
            raise InvalidArgumentError(
                f"committed_len {item.committed_len} < {features.shape[0]} feature rows"
            )
        spec = codec.spec_from_proto(item.spec, SpecParams(), self.info.max_budget)
        if spec.mode == "ar":
            raise InvalidArgumentError("spec.mode ar has nothing to draft")
        return features.to(self.device).unsqueeze(0), spec
