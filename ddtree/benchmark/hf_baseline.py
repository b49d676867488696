"""transformers' own `generate` as a baseline row: the same target checkpoint, prompts and
max tokens, greedy, with a static KV cache (`cache_implementation="static"`); torch.compile
of the forward only when asked (transformers compiles a static-cache forward on GPUs by
default, which `disable_compile` turns off). It stops on the same EOS ids as the engine
(config.json's `eos_token_id`), so its tokens are comparable with the ar row."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ddtree.benchmark.config import RequestSettings, SpecPoint
from ddtree.benchmark.sample import BenchPrompt, RequestSample
from ddtree.benchmark.serial import SerialRunner
from ddtree.benchmark.target import RunBounds
from ddtree.models.checkpoint import read_config


class _ChunkClock:
    """A transformers streamer that only timestamps: `generate` puts the prompt first,
    then each new token (moved to the host, so the step has finished)."""

    def __init__(self, sample: RequestSample) -> None:
        self.sample = sample
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if self.seen_prompt:
            self.sample.chunk_times.append(time.perf_counter())
        self.seen_prompt = True

    def end(self) -> None:
        pass


def eos_token_ids(target_dir: str | Path) -> list[int]:
    value = read_config(Path(target_dir)).get("eos_token_id")
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class HFTarget:
    name = "hf"

    def __init__(self, target_dir: str | Path, device: torch.device, dtype: torch.dtype,
                 tokenizer: Any, is_compiled: bool = False) -> None:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
        self.model = model.to(device).eval()
        self.device, self.tokenizer, self.is_compiled = device, tokenizer, is_compiled
        self.eos = eos_token_ids(target_dir)
        self.runner = SerialRunner("ddtree-bench-hf")

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf", "device": str(self.device), "dtype": str(self.model.dtype),
                "cache_implementation": "static", "compile": self.is_compiled}

    async def prepare(self, bounds: RunBounds) -> None:
        """Nothing to size: `generate` allocates its static cache per call."""

    async def send(self, prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> RequestSample:
        return await self.runner.run(prompt.index,
                                     lambda sample: self._generate(prompt, settings, sample))

    @torch.inference_mode()
    def _generate(self, prompt: BenchPrompt, settings: RequestSettings,
                  sample: RequestSample) -> None:
        assert prompt.token_ids is not None, "hf prompts are encoded up front"
        ids = torch.tensor([prompt.token_ids], dtype=torch.long, device=self.device)  # (1, S)
        eos = [] if settings.ignore_eos else self.eos
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings.max_tokens,
            do_sample=False, temperature=None, top_p=None, top_k=None,
            cache_implementation="static", disable_compile=not self.is_compiled,
            eos_token_id=eos or None, pad_token_id=(eos or [0])[0],
            streamer=_ChunkClock(sample),
        )  # (1, S + new)
        sample.end = time.perf_counter()
        tokens = out[0, ids.shape[1]:].tolist()
        stop = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
        tokens = tokens[:stop]  # the engine excludes the stop token from its output
        del sample.chunk_times[len(tokens):]
        sample.prompt_tokens = ids.shape[1]
        sample.completion_tokens = len(tokens)
        sample.token_ids = tokens
        sample.text = self.tokenizer.decode(tokens, skip_special_tokens=True)

    async def aclose(self) -> None:
        self.runner.close()
