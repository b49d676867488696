"""Splits reasoning (`<think>...</think>`, Qwen3 / DeepSeek-R1 style) from the answer,
streaming-safe: a tag cut across chunks is held back until it is complete or ruled out.

Text inside the tags goes to `reasoning_content`, the rest to `content`; the tags
themselves go nowhere. A chat template that opens the think block in the prompt
(`...<think>\\n`) starts the splitter inside it (`in_reasoning=True`).
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass
class Split:
    reasoning: str = ""
    content: str = ""

    def add(self, text: str, in_reasoning: bool) -> None:
        if in_reasoning:
            self.reasoning += text
        else:
            self.content += text


class ReasoningSplitter:
    def __init__(
        self, in_reasoning: bool = False, start: str = THINK_START, end: str = THINK_END
    ) -> None:
        self.in_reasoning = in_reasoning
        self.start, self.end = start, end
        self.held = ""  # a suffix that may be the beginning of the next tag

    def feed(self, text: str) -> Split:
        out = Split()
        buffer = self.held + text
        while True:
            tag = self.end if self.in_reasoning else self.start
            at = buffer.find(tag)
            if at < 0:
                break
            out.add(buffer[:at], self.in_reasoning)
            buffer = buffer[at + len(tag) :]
            self.in_reasoning = not self.in_reasoning
        keep = _partial_suffix(buffer, self.end if self.in_reasoning else self.start)
        self.held = buffer[len(buffer) - keep :]
        out.add(buffer[: len(buffer) - keep], self.in_reasoning)
        return out

    def flush(self) -> Split:
        """The held-back text at the end of the generation (it never became a tag)."""
        out = Split()
        out.add(self.held, self.in_reasoning)
        self.held = ""
        return out


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
