"""Stage times of a round without a host sync of their own: CUDA events on a GPU (read
after the round's one sync, when they have completed), wall-clock marks on the CPU."""

from __future__ import annotations

import time

import torch


class RoundTimer:
    """start at construction; `mark()` ends a stage; `seconds()` after the round's sync."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[object] = [self._now()]

    def _now(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def mark(self) -> None:
        self._marks.append(self._now())

    def seconds(self) -> list[float]:
        """Each stage's duration; on a GPU call after a sync that covers the last mark."""
        pairs = zip(self._marks, self._marks[1:], strict=False)
        if self.cuda:
            return [begin.elapsed_time(end) / 1000.0  # type: ignore[attr-defined]
                    for begin, end in pairs]
        return [float(end) - float(begin) for begin, end in pairs]  # type: ignore[arg-type]


def round_cost(started: float, finished: float, previous_end: float) -> float:
    """What a round cost the engine's throughput, from host clock readings: its launch,
    the moment the host saw it complete, and when the host saw the round before complete.
    A pipelined round is launched while the previous one still runs, so the time since its
    launch would count the end of the previous round too (twice the cost of a GPU-bound
    round: `auto` then judged trees, timed in traffic, against ar, timed alone, at half
    their rate); the time since the previous round's end does not."""
    return finished - max(started, previous_end)
