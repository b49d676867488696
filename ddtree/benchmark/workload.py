"""The prompt sets of a run, named and in order: the `seed` preset, synthetic prompts, and
each `--prompts` source (`humaneval` by name, or a JSONL file); each prompt encoded (chat
template applied, as the gateway and `ddtree generate --chat` do) when a tokenizer is
needed, i.e. for the in-process and hf targets (the CLI passes the encoder)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ddtree.benchmark.sample import BenchPrompt
from ddtree.errors import InvalidArgumentError
from ddtree.prompts import SEED_PROMPTS, load_named_or_file, synthetic_prompts

DEFAULT_SOURCE = "humaneval"
DEFAULT_SYNTHETIC_PROMPTS = 8


@dataclass(frozen=True)
class PromptSources:
    files: tuple[str, ...] = ()  # `humaneval` or JSONL paths
    preset: str | None = None  # `seed`
    synthetic_input_len: int | None = None
    num_prompts: int | None = None  # the first N of each set
    is_chat: bool = True
    seed: int = 0


Encoder = Callable[[str], Sequence[int]]


def prompt_texts(sources: PromptSources, tokenizer: Any | None) -> dict[str, list[str]]:
    limit = sources.num_prompts
    sets: dict[str, list[str]] = {}
    if sources.preset is not None:
        if sources.preset != "seed":
            raise InvalidArgumentError(f"unknown preset {sources.preset!r} (known: seed)")
        sets["seed"] = list(SEED_PROMPTS[:limit])
    if sources.synthetic_input_len is not None:
        count = limit or DEFAULT_SYNTHETIC_PROMPTS
        sets[f"synthetic-{sources.synthetic_input_len}"] = synthetic_prompts(
            count, sources.synthetic_input_len, sources.seed, tokenizer)
    files: Sequence[str] = sources.files or (() if sets else (DEFAULT_SOURCE,))
    for source in files:
        name, texts = load_named_or_file(source, limit, sources.is_chat)
        if name in sets:
            raise InvalidArgumentError(f"two prompt sets named {name!r}")
        sets[name] = texts
    for name, texts in sets.items():
        if not texts:
            raise InvalidArgumentError(f"prompt set {name!r} is empty")
    return sets


def prompt_sets(sources: PromptSources, tokenizer: Any | None,
                encode: Encoder | None) -> dict[str, list[BenchPrompt]]:
    """Set name -> prompts; token ids where `encode` is given (in-process and hf targets)."""
    return {
        name: [BenchPrompt(i, text, tuple(encode(text)) if encode else None)
               for i, text in enumerate(texts)]
        for name, texts in prompt_texts(sources, tokenizer).items()
    }
