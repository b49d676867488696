"""Client sessions: OpenSession / Verify / CloseSession for gRPC clients that bring their own
draft trees. A session is a pool row like any generation's; its Verify runs the same
verify half of the round (round.py) eagerly over the client's tree with the full tree
walk. The engine's thread closes the sessions unused for the idle timeout (`expire`)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.engine.core import Engine
from ddtree.engine.prefill import prefill_rows
from ddtree.engine.request import GenerationRequest, SpecParams
from ddtree.engine.round import BucketKey, RoundBuffers, verify_into
from ddtree.engine.rows import Row
from ddtree.engine.state import RowParams
from ddtree.errors import CapacityError, InvalidArgumentError, SessionNotFoundError
from ddtree.sampling import SamplingParams
from ddtree.stats import GenerationStats
from ddtree.tree import DraftTree, depths_from_parents


@dataclass
class OpenedSession:
    session_id: str
    bonus_token: int
    committed_len: int
    features: Tensor | None  # (P, k*H) of the prompt, when asked for


@dataclass
class VerifyOutcome:
    accepted_path: list[int]  # node indices, root first
    committed_tokens: list[int]  # the tokens of the path (now in the KV)
    bonus_token: int
    committed_len: int
    features: Tensor | None  # (A, k*H) of the committed rows, when asked for


class ClientSessions:
    """The engine's client sessions (call from the engine's thread)."""

    def __init__(self, engine: Engine, max_budget: int) -> None:
        self.engine = engine
        self.max_budget = max_budget
        self.return_features: dict[str, bool] = {}

    def open(self, prompt_ids: list[int], sampling: SamplingParams,
             return_features: bool) -> OpenedSession:
        engine = self.engine
        layers = engine.feature_layers if return_features else ()
        if return_features and not layers:
            raise InvalidArgumentError(
                "return_features needs the drafter's target layer ids; no drafter is connected")
        room = engine.max_model_len - len(prompt_ids) - self.max_budget - 1
        if room < 1:
            raise InvalidArgumentError(
                f"a prompt of {len(prompt_ids)} tokens leaves no room for a tree of "
                f"{self.max_budget} nodes under max_model_len {engine.max_model_len}")
        request = GenerationRequest(prompt_ids, room, sampling, SpecParams("ar", 1),
                                    ignore_eos=True)
        request.validate(engine.target.config.vocab_size, engine.max_model_len)
        slot = engine.slots.allocate()
        if slot is None:
            raise CapacityError("the verifier has no free KV row for a session")
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        row = Row(secrets.token_hex(16), request, 0, frozenset(), seed,
                  GenerationStats("tree", self.max_budget), slot=slot)
        try:
            ((first, features, _, _),) = prefill_rows(
                engine.target, engine.pool, engine.state, [row], [RowParams.of(request, 0, seed)],
                layers)
        except BaseException:
            engine.slots.free(slot)
            raise
        engine.counters.num_target_forwards += 1
        row.committed_len, row.bonus_token = len(prompt_ids), first
        row.last_used_s = time.monotonic()
        engine.sessions[row.request_id] = row
        self.return_features[row.request_id] = return_features
        return OpenedSession(row.request_id, first, row.committed_len, features)

    def verify(self, session_id: str, tokens: Tensor, parents: Tensor, committed_len: int,
               return_features: bool) -> VerifyOutcome:
        """tokens, parents: (1+N,) int64, validated (structure, vocabulary, siblings);
        tokens[0] must be the session's bonus token (checked by the caller)."""
        row = self._get(session_id)
        if committed_len and committed_len != row.committed_len:
            raise InvalidArgumentError(f"committed_len {committed_len} does not match the "
                                       f"session's {row.committed_len}")
        if return_features and not self.return_features[session_id]:
            raise InvalidArgumentError("return_features needs a session opened with it")
        num_nodes = tokens.shape[0] - 1
        if num_nodes > self.max_budget:
            raise InvalidArgumentError(f"a tree of {num_nodes} nodes exceeds {self.max_budget}")
        if row.committed_len + num_nodes + 2 > self.engine.max_model_len:
            raise InvalidArgumentError(
                f"a tree of {num_nodes + 1} rows does not fit: the session holds "
                f"{row.committed_len} of max_model_len {self.engine.max_model_len} tokens")
        row.last_used_s = time.monotonic()
        return self._verify(row, tokens, parents, return_features)

    @torch.inference_mode()
    def _verify(self, row: Row, tokens: Tensor, parents: Tensor,
                return_features: bool) -> VerifyOutcome:
        engine = self.engine
        depth = depths_from_parents(parents)
        width = int(depth.max()) + 1
        num_nodes = tokens.shape[0] - 1
        buffers = RoundBuffers(1, num_nodes, width, engine.device)
        buffers.rows.fill_(row.slot)
        valid = torch.ones(1, num_nodes + 1, dtype=torch.bool)
        buffers.set_tree(DraftTree(tokens[None], parents[None], depth[None], valid=valid))
        sampling = row.request.sampling
        key = BucketKey(1, num_nodes, not sampling.is_greedy,
                        sampling.top_k > 0 or sampling.top_p < 1)
        layers = engine.feature_layers if return_features else ()
        out = verify_into(engine.state, engine.target, engine.pool, buffers, key, layers,
                          keep_pending=False)
        engine.counters.num_target_forwards += 1
        table = buffers.out[0].tolist()
        accepted, bonus = table[0], table[1]
        row.committed_len += accepted
        row.bonus_token = bonus
        features = None
        if out.path_features is not None:
            features = out.path_features[0, :accepted]
        return VerifyOutcome(table[2 + width: 2 + width + accepted], table[2: 2 + accepted],
                             bonus, row.committed_len, features)

    def close(self, session_id: str) -> bool:
        row = self.engine.sessions.pop(session_id, None)
        self.return_features.pop(session_id, None)
        if row is None:
            return False
        self.engine.slots.free(row.slot)
        return True

    def expire(self, idle_timeout_s: float) -> int:
        """Closes the sessions unused for idle_timeout_s; returns how many."""
        now = time.monotonic()
        stale = [sid for sid, row in self.engine.sessions.items()
                 if now - row.last_used_s > idle_timeout_s]
        for session_id in stale:
            self.close(session_id)
        self.engine.counters.num_expired_sessions += len(stale)
        return len(stale)

    def bonus_token(self, session_id: str) -> int:
        """The token the session's next tree must have at its root."""
        return self._get(session_id).bonus_token

    def _get(self, session_id: str) -> Row:
        row = self.engine.sessions.get(session_id)
        if row is None:
            raise SessionNotFoundError(f"unknown or closed session {session_id!r}")
        return row
