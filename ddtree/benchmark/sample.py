"""One prompt of a workload and one measured request.

Clock rules, the same for every target: `start` is taken before the request is sent (so a
server's queueing counts), TTFT ends at the first chunk that carries content (or reasoning
content), inter-token latency is the gap between consecutive content chunks (one chunk
may carry several tokens under speculation), TPOT = (e2e - TTFT) / (tokens - 1), and token
counts are the server's `usage` (exact), never a count of chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BenchPrompt:
    index: int  # position in its prompt set (the key for the `=ar` comparison)
    text: str
    token_ids: tuple[int, ...] | None = None  # encoded, template applied (in-process, hf)


@dataclass
class RequestSample:
    prompt_index: int
    start: float  # time.perf_counter() just before the request was sent
    end: float = 0.0  # when the response (or stream) was complete
    chunk_times: list[float] = field(default_factory=list)  # each content-carrying chunk
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    text: str = ""
    token_ids: list[int] | None = None  # where the target exposes them (in-process, hf)
    acceptance_histogram: list[int] | None = None  # index i = verify rounds committing i tokens
    served_mode: str | None = None  # what the server reports it ran (our stats)
    served_budget: int | None = None
    # The server's own stage times over the request (our stats: prefill, draft, verify;
    # device time where it has CUDA events): where a round's time goes, in process and
    # through a server alike
    stage_seconds: dict[str, float] | None = None
    error: str | None = None
    repeat: int = 0

    @property
    def is_ok(self) -> bool:
        return self.error is None

    @property
    def has_output(self) -> bool:
        """Finished and produced content (latencies are defined)."""
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft_s(self) -> float:
        return self.chunk_times[0] - self.start

    @property
    def e2e_s(self) -> float:
        return self.end - self.start

    @property
    def itl_s(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        if self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    @property
    def tokens_per_second(self) -> float | None:
        """Decode speed of this request, TTFT excluded (= 1 / TPOT)."""
        tpot = self.tpot_s
        return 1.0 / tpot if tpot else None

    @property
    def e2e_tokens_per_second(self) -> float | None:
        """Completion tokens / end-to-end time, TTFT included (the user's old script)."""
        return self.completion_tokens / self.e2e_s if self.e2e_s > 0 else None

    @property
    def num_rounds(self) -> int | None:
        return None if self.acceptance_histogram is None else sum(self.acceptance_histogram)

    def output_key(self) -> tuple[str, Any]:
        """What the `=ar` check compares: token ids where known, else the text."""
        if self.token_ids is not None:
            return "ids", tuple(self.token_ids)
        return "text", self.text

    def to_dict(self, run_start: float) -> dict[str, Any]:
        ok = self.has_output
        return {
            "repeat": self.repeat,
            "prompt_index": self.prompt_index,
            "start_s": round(self.start - run_start, 6),
            "ttft_s": round(self.ttft_s, 6) if ok else None,
            "e2e_s": round(self.e2e_s, 6) if ok else None,
            "tpot_s": _round(self.tpot_s) if ok else None,
            "itl_s": [round(x, 6) for x in self.itl_s] if ok else [],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "num_rounds": self.num_rounds,
            "acceptance_histogram": self.acceptance_histogram,
            "served_mode": self.served_mode,
            "served_budget": self.served_budget,
            "stage_seconds": (None if self.stage_seconds is None else
                              {k: round(v, 6) for k, v in sorted(self.stage_seconds.items())}),
            "text": self.text,
            "token_ids": self.token_ids,
            "error": self.error,
        }


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)
