"""Benchmark prompt files: FastChat question JSONL (`turns`), HumanEval (`prompt`),
plain `{"prompt": ...}` JSONL; optionally gzip-compressed. Measuring only, never training."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ddtree.errors import InvalidArgumentError


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
            record = json.loads(line)
            if "turns" in record:
                prompts.append(record["turns"][0])
            elif "prompt" in record:
                prompts.append(record["prompt"])
            else:
                raise InvalidArgumentError(f"{path}:{line_number}: no 'turns' or 'prompt' field")
            if limit is not None and len(prompts) >= limit:
                break
    return prompts
