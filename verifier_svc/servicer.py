"""The Verifier gRPC servicer: converts messages, delegates to the scheduler (generations)
or to the engine's client sessions (run on the engine thread); errors map in
verifier_svc/status.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import grpc
import structlog
import torch

from ddtree import codec
from ddtree.engine import GenerationRequest, RoundResult
from ddtree.engine.sessions import ClientSessions, VerifyOutcome
from ddtree.errors import InvalidArgumentError, TreeValidationError
from ddtree.stats import GenerationStats
from ddtree.tree_validation import validate_tree
from ddtree.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.generate_many import ManyStream
from verifier_svc.scheduler import Scheduler
from verifier_svc.shared_drafter import SharedDrafter
from verifier_svc.status import streaming, unary

log = structlog.get_logger("verifier_svc")


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(
        self,
        config: VerifierServiceConfig,
        scheduler: Scheduler,
        sessions: ClientSessions,
        model_info: verifier_pb2.ModelInfo,
        drafter: DrafterClient | None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.sessions = sessions
        self.drafter = drafter
        self.model_info = model_info  # static part; drafter fields are filled per call

    @streaming
    def Generate(
        self, request: verifier_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[verifier_pb2.GenerateResponse]:
        request_id = request.request_id or uuid.uuid4().hex
        generation = self.scheduler.submit(request_id, self._generation_request(request),
                                           owner=context.peer())
        # Client gone (cancelled, deadline, disconnect): free the KV within one round.
        context.add_callback(lambda: self.scheduler.cancel(generation))
        log.info(
            "generate_started",
            request_id=request_id,
            mode=generation.request.spec.mode,
            num_prompt_tokens=len(request.prompt_ids),
        )
        finish_reason = ""
        for results in generation.results(context.is_active):
            response = self._response(results, generation.stats,
                                      received_unix_s=generation.received_unix_s)
            finish_reason = response.finish_reason
            yield response
        log.info("generate_finished", request_id=request_id, finish_reason=finish_reason,
                 active=context.is_active())

    @streaming
    def GenerateMany(
        self, request_iterator: Iterator[verifier_pb2.GenerateManyRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[verifier_pb2.GenerateManyResponse]:
        log.info("generate_many_open", peer=context.peer())
        stream = self.many_stream(context.peer())
        context.add_callback(stream.cancel_all)  # client gone: free the rows
        yield from stream.run(request_iterator, context.is_active)
        log.info("generate_many_closed", peer=context.peer(), active=context.is_active())

    def many_stream(self, peer: str) -> ManyStream:
        """A GenerateMany stream's state, over gRPC or the Unix socket."""
        return ManyStream(self.scheduler, self._generation_request, self._response, peer)

    def _generation_request(self, msg: verifier_pb2.GenerateRequest) -> GenerationRequest:
        if msg.max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be >= 0, got {msg.max_tokens}")
        max_tokens = msg.max_tokens or max(1, self.model_info.max_model_len - len(msg.prompt_ids))
        return GenerationRequest(
            prompt_ids=list(msg.prompt_ids),
            max_tokens=max_tokens,
            sampling=codec.sampling_from_proto(msg.sampling),
            spec=codec.spec_from_proto(msg.spec, self.config.default_spec, self.config.max_budget),
            stop_token_ids=tuple(msg.stop_token_ids),
            ignore_eos=msg.ignore_eos,
            top_logprobs=msg.top_logprobs if msg.logprobs else -1,
            prompt_logprobs=msg.prompt_logprobs,
        )

    @staticmethod
    def _response(
        results: list[RoundResult], stats: GenerationStats | None,
        response: verifier_pb2.GenerateResponse | None = None, received_unix_s: float = 0.0,
    ) -> verifier_pb2.GenerateResponse:
        """One message for consecutive rounds of one generation (filled in `response`
        when given: GenerateMany's update holds it); `received_unix_s`: when the verifier
        read the generation's request."""
        last = results[-1]
        if response is None:
            response = verifier_pb2.GenerateResponse()
        response.finish_reason = last.finish_reason or ""
        for result in results:
            response.token_ids.extend(result.new_tokens)
            if result.committed_tokens:  # a verify round (the prefill's result has none)
                response.acceptance_lengths.append(result.acceptance_length)
                response.drafted_nodes.append(result.num_drafted_nodes)
            if result.logprobs is not None:
                response.logprobs.extend(codec.logprobs_to_proto(result.logprobs))
            if result.prompt_logprobs is not None:
                response.prompt_logprobs.extend(codec.logprobs_to_proto(result.prompt_logprobs))
        if last.finished and stats is not None:
            response.stats.CopyFrom(codec.stats_to_proto(stats))
        response.received_unix_s = received_unix_s
        response.sent_unix_s = time.time()
        return response

    @unary
    def Abort(
        self, request: verifier_pb2.AbortRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.AbortResponse:
        found = self.scheduler.abort(request.request_id, owner=context.peer())
        log.info("abort", request_id=request.request_id, found=found)
        return verifier_pb2.AbortResponse(found=found)

    @unary
    def GetModelInfo(
        self, request: verifier_pb2.ModelInfoRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.ModelInfo:
        info = verifier_pb2.ModelInfo()
        info.CopyFrom(self.model_info)
        drafter = self.drafter.info if self.drafter is not None else None
        drafting = self.scheduler.engine.drafting
        local = drafting if self.config.local_drafter else None
        info.drafter_connected = drafter is not None or local is not None
        if isinstance(drafting, SharedDrafter):  # new rows draft once the link is attached
            info.drafter_connected = drafting.linked
        info.block_size = (drafter.block_size if drafter is not None
                           else local.block_size if local is not None else 0)
        return info

    @unary
    def OpenSession(
        self, request: verifier_pb2.OpenSessionRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.OpenSessionResponse:
        sampling = codec.sampling_from_proto(request.sampling)
        opened = self.scheduler.call(lambda: self.sessions.open(
            list(request.prompt_ids), sampling, request.return_features))
        response = verifier_pb2.OpenSessionResponse(
            session_id=opened.session_id, bonus_token=opened.bonus_token,
            committed_len=opened.committed_len)
        if opened.features is not None:
            response.features.CopyFrom(codec.tensor_to_proto(opened.features))  # (P, k*H)
        log.info("session_opened", session_id=opened.session_id,
                 num_prompt_tokens=len(request.prompt_ids))
        return response

    @unary
    def Verify(
        self, request: verifier_pb2.VerifyRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.VerifyResponse:
        outcome = self.scheduler.call(lambda: self._verify(request))
        response = verifier_pb2.VerifyResponse(
            accepted_path=outcome.accepted_path, committed_tokens=outcome.committed_tokens,
            bonus_token=outcome.bonus_token, committed_len=outcome.committed_len)
        if outcome.features is not None:
            response.features.CopyFrom(codec.tensor_to_proto(outcome.features))  # (A, k*H)
        return response

    def _verify(self, request: verifier_pb2.VerifyRequest) -> VerifyOutcome:
        """On the engine thread: the client's tree checked, then verified."""
        bonus = self.sessions.bonus_token(request.session_id)  # NOT_FOUND first
        tokens, parents = checked_tree(request.tree, self.model_info.vocab_size,
                                       self.config.max_budget, bonus)
        return self.sessions.verify(request.session_id, tokens, parents, request.committed_len,
                                    request.return_features)

    @unary
    def GetStats(
        self, request: verifier_pb2.StatsRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.EngineStats:
        return self.scheduler.engine_stats()

    @unary
    def CloseSession(
        self, request: verifier_pb2.CloseSessionRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.CloseSessionResponse:
        found = self.scheduler.call(lambda: self.sessions.close(request.session_id))
        log.info("session_closed", session_id=request.session_id, found=found)
        return verifier_pb2.CloseSessionResponse(found=found)


def checked_tree(msg: common_pb2.DraftTree, vocab_size: int, max_nodes: int,
                 bonus_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A client's tree as (tokens, parents) (1+N,) int64, or TreeValidationError saying
    what is wrong: the node count, the structure, a token outside the vocabulary, twin
    siblings, or a root that is not the session's bonus token."""
    tree = codec.tree_from_proto(msg, max_nodes=max_nodes)
    validate_tree(tree.tokens[0], tree.parents[0], vocab_size, max_nodes)
    root = int(tree.tokens[0, 0])
    if root != bonus_token:
        raise TreeValidationError(
            f"tree.tokens[0] = {root} must be the session's bonus token {bonus_token}")
    return tree.tokens[0], tree.parents[0]
