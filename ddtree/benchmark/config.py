"""What one benchmark run measures: the speculation grid (`SpecPoint`), the load points
(`LoadPoint`), the per-request generation settings (`RequestSettings`) and the whole frozen
`BenchConfig` the CLI builds from its flags."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ddtree.engine import MODES
from ddtree.errors import InvalidArgumentError

# `server`: send no `ddtree` extension, measure the server as it is configured (the only
# meaningful choice against a foreign OpenAI server); `hf`: transformers' own generate.
SERVER_MODE = "server"
HF_MODE = "hf"
TREE_MODES = ("tree", "shadow")


@dataclass(frozen=True)
class SpecPoint:
    """One speculation setting; None fields are the server's (or engine's) default."""

    mode: str
    budget: int | None = None  # tree and shadow only
    max_topk: int | None = None  # tree and shadow only

    @property
    def label(self) -> str:
        parts = [self.mode]
        if self.budget is not None:
            parts.append(f"b{self.budget}")
        if self.max_topk is not None:
            parts.append(f"k{self.max_topk}")
        return " ".join(parts)

    def serve_flags(self) -> str:
        """The `ddtree serve` flags that make this the server's default."""
        flags = f"--mode {self.mode}"
        if self.budget is not None:
            flags += f" --budget {self.budget}"
        if self.max_topk is not None:
            flags += f" --max-topk {self.max_topk}"
        return flags


@dataclass(frozen=True)
class LoadPoint:
    """Closed loop (`concurrency` workers, no rate) or open loop (Poisson arrivals at
    `request_rate` per second, at most `concurrency` in flight when set)."""

    concurrency: int | None = 1
    request_rate: float | None = None

    @property
    def label(self) -> str:
        if self.request_rate is None:
            return f"c{self.concurrency}"
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"
        cap = f" c{self.concurrency}" if self.concurrency is not None else ""
        return f"r{rate}{cap}"


@dataclass(frozen=True)
class RequestSettings:
    """What every request of the run shares (the same on every target)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # request i of prompt p gets seed + p
    ignore_eos: bool = False
    is_chat: bool = True  # chat template around the prompt (else raw completion)

    def seed_for(self, prompt_index: int) -> int | None:
        return None if self.seed is None else self.seed + prompt_index


@dataclass(frozen=True)
class BenchConfig:
    specs: tuple[SpecPoint, ...]
    loads: tuple[LoadPoint, ...]
    settings: RequestSettings
    repeats: int = 1
    warmup: int | None = None  # None: one request per worker of the load point
    num_requests: int | None = None  # per repeat; None: every prompt once (or until duration)
    duration_s: float | None = None  # no new request starts after this many seconds
    seed: int = 0  # Poisson arrivals

    def validate(self) -> None:
        if self.repeats < 1:
            raise InvalidArgumentError(f"--repeats must be >= 1, got {self.repeats}")
        if self.num_requests is not None and self.num_requests < 1:
            raise InvalidArgumentError("--num-requests must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise InvalidArgumentError("--duration must be > 0")
        if self.settings.max_tokens < 1:
            raise InvalidArgumentError("--max-tokens must be >= 1")


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise InvalidArgumentError(f"{flag}: expected integers, got {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise InvalidArgumentError(f"{flag}: expected positive integers, got {text!r}")
    return values


def parse_topk_list(text: str) -> list[int | None]:
    """`none,4,8` -> [None, 4, 8] (None: no cap in-process, the server's default on a URL)."""
    return [None if v.strip() in ("none", "0") else parse_int_list(v, "--max-topk")[0]
            for v in text.split(",") if v.strip()]


def parse_rate_list(text: str) -> list[float]:
    try:
        rates = [math.inf if v.strip() == "inf" else float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise InvalidArgumentError(f"--request-rate: expected numbers or inf: {text!r}") from exc
    if not rates or any(r <= 0 for r in rates):
        raise InvalidArgumentError(f"--request-rate: expected rates > 0, got {text!r}")
    return rates


def spec_grid(modes: Sequence[str], budgets: Sequence[int],
              topks: Sequence[int | None]) -> list[SpecPoint]:
    """Every mode; tree and shadow once per (budget, max_topk)."""
    specs = []
    for mode in modes:
        if mode not in (*MODES, SERVER_MODE):
            raise InvalidArgumentError(f"unknown mode {mode!r} (one of {MODES + (SERVER_MODE,)})")
        if mode in TREE_MODES:
            specs += [SpecPoint(mode, b, k) for b in budgets for k in topks]
        else:
            specs.append(SpecPoint(mode))
    return specs


def load_grid(concurrency: Sequence[int] | None, rates: Sequence[float] | None) -> list[LoadPoint]:
    """Closed loop per concurrency; with rates, open loop per (rate, concurrency cap)."""
    if rates:
        caps: Sequence[int | None] = concurrency or [None]
        return [LoadPoint(c, r) for r in rates for c in caps]
    return [LoadPoint(c) for c in (concurrency or [1])]
