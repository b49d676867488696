"""The drafter's per-request state: each session id holds one row of the drafter's context
pool (append-only per session), its spec, and the context length it was built on; freed on
release or when the stream that opened it ends."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from ddtree.engine.request import MODE_RULES, SpecParams
from ddtree.engine.state import SlotAllocator
from ddtree.errors import CapacityError, InvalidArgumentError, SessionNotFoundError


@dataclass
class DraftRow:
    slot: int
    spec: SpecParams
    num_nodes: int  # tree nodes besides the root per round
    force_chain: bool  # the mode's rule, resolved once
    context_len: int = 0  # committed rows already in the context pool


class DraftSessionTable:
    """Thread-safe map session id -> DraftRow over `num_slots` pool rows."""

    def __init__(self, num_slots: int, depth: int) -> None:
        self._slots = SlotAllocator(num_slots)
        self._depth = depth
        self._sessions: dict[str, DraftRow] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def lookup(self, session_ids: list[str]) -> list[DraftRow | None]:
        """The sessions' rows (None where unknown), under one lock."""
        with self._lock:
            return [self._sessions.get(session_id) for session_id in session_ids]

    def open(self, session_id: str, spec: SpecParams) -> DraftRow:
        """A new session (its first item carries the whole context and the spec)."""
        if not session_id:
            raise SessionNotFoundError("session_id is empty")
        with self._lock:
            if session_id in self._sessions:
                raise InvalidArgumentError(f"session {session_id!r} is already open")
            slot = self._slots.allocate()
            if slot is None:
                raise CapacityError(
                    f"the drafter holds its maximum of {self._slots.num_slots} sessions")
            num_nodes = MODE_RULES[spec.mode].num_nodes(spec.budget, self._depth)
            row = DraftRow(slot, spec, num_nodes, MODE_RULES[spec.mode].force_chain)
            self._sessions[session_id] = row
            return row

    def release(self, session_ids: Iterable[str]) -> None:
        """Frees the sessions' rows; unknown ids are ignored (release is idempotent)."""
        with self._lock:
            for session_id in session_ids:
                row = self._sessions.pop(session_id, None)
                if row is not None:
                    self._slots.free(row.slot)
