"""Stop strings matched across chunk boundaries.

Text that could be the beginning of a stop string is held back until the next chunk
decides it; when a stop string completes, the text before it is released (the stop string
itself only with `include_stop`) and the generation is over.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str], include_stop: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include_stop = include_stop
        self.held = ""  # a suffix of the text so far that is a prefix of some stop string
        self.is_stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        """-> (text safe to emit now, whether a stop string completed)."""
        assert not self.is_stopped, "feed after a stop string matched"
        if not self.stops:
            return text, False
        buffer = self.held + text
        hit = self._first_stop(buffer)
        if hit is not None:
            start, stop = hit
            self.held, self.is_stopped = "", True
            return buffer[:start] + (stop if self.include_stop else ""), True
        keep = self._longest_partial(buffer)
        self.held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back text, once the generation ended without completing a stop string."""
        held, self.held = self.held, ""
        return held

    def _first_stop(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stops:
            at = buffer.find(stop)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        return best

    def _longest_partial(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
