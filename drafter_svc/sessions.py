"""The drafter's per-request state: one `DraftSession` (append-only draft KV) per session id,
bounded by a capacity limit, freed on release or when the stream that opened it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ddtree.engine import DraftSession
from ddtree.errors import CapacityError, SessionNotFoundError


class DraftSessionTable:
    """Thread-safe map session id -> DraftSession; `factory` allocates a fresh session."""

    def __init__(self, factory: Callable[[], DraftSession], max_sessions: int) -> None:
        self._factory = factory
        self._max_sessions = max_sessions
        self._sessions: dict[str, DraftSession] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def get_or_open(self, session_id: str, committed_len: int, num_new_rows: int) -> DraftSession:
        """The session's state; a new session must start with the whole committed context.

        A verifier that lost its drafter session (drafter restarted, released) and sends
        only the newest rows gets NOT_FOUND instead of a draft built on a partial context.
        """
        if not session_id:
            raise SessionNotFoundError("session_id is empty")
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                return session
            if num_new_rows != committed_len:
                raise SessionNotFoundError(
                    f"unknown session {session_id!r}: a new session needs the features of "
                    f"all {committed_len} committed rows, got {num_new_rows}"
                )
            if len(self._sessions) >= self._max_sessions:
                raise CapacityError(
                    f"the drafter holds its maximum of {self._max_sessions} sessions"
                )
            session = self._factory()
            self._sessions[session_id] = session
            return session

    def release(self, session_ids: Iterable[str]) -> None:
        """Frees the sessions' draft KV; unknown ids are ignored (release is idempotent)."""
        with self._lock:
            for session_id in session_ids:
                self._sessions.pop(session_id, None)
