"""KV capacity accounting and the OpenSession/Verify/CloseSession sessions of clients that
bring their own draft trees.

Every generation and every open session holds one target KV cache, so both draw from
one `KVSlots` budget; when it is empty the caller gets RESOURCE_EXHAUSTED up front
instead of an out-of-memory error mid-traffic.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from ddtree import codec
from ddtree.engine import GenerationRequest, RoundResult, SpecParams, VerifySession
from ddtree.errors import (
    CapacityError,
    InvalidArgumentError,
    SessionNotFoundError,
    TreeValidationError,
)
from ddtree.models.target import TargetModel
from ddtree.sampling import SamplingParams
from ddtree.tree import DraftTree, validate_tree
from ddtree.v1 import common_pb2


class KVSlots:
    """A counter of KV caches in use, bounded by `max_sessions`."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._in_use = 0
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._in_use

    def acquire(self) -> None:
        with self._lock:
            if self._in_use >= self.max_sessions:
                raise CapacityError(
                    f"the verifier is at capacity ({self.max_sessions} generations/sessions)"
                )
            self._in_use += 1

    def release(self) -> None:
        with self._lock:
            assert self._in_use > 0, "KV slot released twice"
            self._in_use -= 1


def checked_tree(
    msg: common_pb2.DraftTree,
    session: VerifySession,
    max_nodes: int,
    max_depth: int | None = None,
) -> DraftTree:
    """A tree from outside (a client or the drafter) as a DraftTree `session` can verify,
    on the session's device.

    Raises TreeValidationError saying what is wrong: the node count, the structure, a token
    outside the vocabulary, twin siblings, or a root that is not the session's bonus token.
    """
    tree = codec.tree_from_proto(msg, max_nodes=max_nodes)
    vocab_size = session.target.config.vocab_size
    validate_tree(tree.tokens[0], tree.parents[0], vocab_size, max_nodes, max_depth)  # (1+N,)
    root = int(tree.tokens[0, 0])
    if root != session.bonus_token:
        raise TreeValidationError(
            f"tree.tokens[0] = {root} must be the session's bonus token {session.bonus_token}"
        )
    device = session.device
    return DraftTree(
        tokens=tree.tokens.to(device), parents=tree.parents.to(device), depth=tree.depth.to(device)
    )


@dataclass
class VerifyOutcome:
    accepted_path: list[int]  # node indices, root first
    committed_tokens: list[int]  # the tokens of the path (now in the KV)
    bonus_token: int
    committed_len: int
    features: Tensor | None  # (1, A, k*H) when requested


@dataclass
class ClientSession:
    """A VerifySession driven by a client's own trees."""

    session: VerifySession
    return_features: bool


class ClientSessions:
    """session id -> ClientSession for OpenSession/Verify/CloseSession. `open` and `verify`
    run the target, so the caller runs them on the engine thread; each open session holds
    one KV slot until closed."""

    def __init__(
        self,
        target: TargetModel,
        slots: KVSlots,
        max_model_len: int,
        max_budget: int,
        feature_layers: Callable[[], tuple[int, ...]],
    ) -> None:
        self.target = target
        self.max_model_len = max_model_len
        self.max_budget = max_budget
        self.feature_layers = feature_layers  # the connected drafter's, () when none
        self._slots = slots
        self._sessions: dict[str, ClientSession] = {}
        self._lock = threading.Lock()

    def open(
        self, prompt_ids: list[int], sampling: SamplingParams, return_features: bool
    ) -> tuple[str, VerifySession, RoundResult]:
        """Prefills the prompt; -> (session id, session, the prefill's result)."""
        layers = self.feature_layers() if return_features else ()
        if return_features and not layers:
            raise InvalidArgumentError(
                "return_features needs the drafter's target layer ids; no drafter is connected"
            )
        if len(prompt_ids) + self.max_budget + 2 > self.max_model_len:
            raise InvalidArgumentError(
                f"a prompt of {len(prompt_ids)} tokens leaves no room for a tree of "
                f"{self.max_budget} nodes under max_model_len {self.max_model_len}"
            )
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=self.max_model_len - len(prompt_ids),
            sampling=sampling,
            spec=SpecParams(mode="tree", budget=self.max_budget),
            ignore_eos=True,  # the client decides when to stop
        )
        self._slots.acquire()
        try:
            session = VerifySession(
                self.target, request, layers, self.max_model_len, self.max_budget
            )
            result = session.prefill()
        except BaseException:
            self._slots.release()
            raise
        session_id = uuid.uuid4().hex
        with self._lock:
            self._sessions[session_id] = ClientSession(session, return_features)
        return session_id, session, result

    def verify(
        self, session_id: str, msg: common_pb2.DraftTree, committed_len: int, return_features: bool
    ) -> VerifyOutcome:
        """Verifies a client's tree with the full tree walk; commits the accepted path."""
        client = self._get(session_id)
        session = client.session
        if committed_len and committed_len != session.committed_len:
            raise InvalidArgumentError(
                f"committed_len {committed_len} does not match the session's "
                f"{session.committed_len}"
            )
        if return_features and not client.return_features:
            raise InvalidArgumentError(
                "return_features needs a session opened with return_features"
            )
        tree = checked_tree(msg, session, self.max_budget)
        num_rows = tree.tokens.shape[1]
        if session.committed_len + num_rows + 1 > self.max_model_len:
            raise InvalidArgumentError(
                f"a tree of {num_rows} rows does not fit: the session holds "
                f"{session.committed_len} of max_model_len {self.max_model_len} tokens"
            )
        result = session.verify(tree)
        return VerifyOutcome(
            accepted_path=result.path,
            committed_tokens=result.committed_tokens,
            bonus_token=session.bonus_token,
            committed_len=session.committed_len,
            features=result.features if return_features else None,
        )

    @property
    def num_open(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _get(self, session_id: str) -> ClientSession:
        with self._lock:
            found = self._sessions.get(session_id)
        if found is None:
            raise SessionNotFoundError(f"unknown or closed session {session_id!r}")
        return found

    def close(self, session_id: str) -> bool:
        """Frees the session's KV; False when it was not open."""
        with self._lock:
            found = self._sessions.pop(session_id, None)
        if found is not None:
            self._slots.release()
        return found is not None

    def close_all(self) -> None:
        with self._lock:
            session_ids = list(self._sessions)
        for session_id in session_ids:
            self.close(session_id)
