"""Self-distillation data: the target's own responses to the training prompts.

Batched transformers generation (left padding, stop at the target's end-of-turn token),
mostly greedy (the lossless T=0 path is what the drafter must match best) plus a share of
sampled batches for diversity. Shards of prompts are written to
`<work_dir>/responses/shard-NNNNN.pt` as they finish; a shard on disk is never redone, so
a run cut short (time budget, killed call) resumes where it stopped.

Shard format (torch.save, tensors only): `tokens` (total,) int32 = prompt + response of
each sequence back to back; `offsets` (n+1,) int64; `prompt_lens` (n,) int64;
`prompt_index` (n,) int64 into the prompt list; `temperature` (n,) float32.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm import tqdm

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class ResponseConfig:
    max_new_tokens: int = 256
    batch_size: int = 512
    shard_size: int = 2048
    sample_fraction: float = 0.25  # share of batches sampled instead of greedy
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int = 0
    max_seconds: float | None = None  # stop starting new shards after this


def shard_path(work_dir: Path, index: int) -> Path:
    return work_dir / "responses" / f"shard-{index:05d}.pt"


def completed_shards(work_dir: Path) -> list[Path]:
    """The `.pt` shards of this module, then the `.npz` shards of the engine's generator
    and carried packs (ddtree.training.shards)."""
    work_dir = Path(work_dir)
    return sorted((work_dir / "responses").glob("shard-*.pt")) + sorted(
        (work_dir / "responses").glob("*.npz"))


def load_generator_model(target_dir: Path, device: torch.device,
                         dtype: torch.dtype) -> PreTrainedModel:
    """The target as a transformers causal LM, in eval mode on `device`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
    return model.to(device).eval()


def generate_responses(model: PreTrainedModel, prompts: Sequence[Sequence[int]], work_dir: Path,
                       config: ResponseConfig, stop_token_ids: Sequence[int], pad_token_id: int,
                       progress: bool = True) -> list[Path]:
    """Generates the missing shards of responses to `prompts` (token id lists, already in
    chat form); returns all shard paths on disk. Honours `config.max_seconds` between
    shards (using the last shard's duration as the estimate of the next)."""
    num_shards = math.ceil(len(prompts) / config.shard_size)
    start, last_seconds = time.perf_counter(), 0.0
    bar = tqdm(total=len(prompts), desc="responses", unit="prompt", disable=not progress)
    for index in range(num_shards):
        lo, hi = index * config.shard_size, min(len(prompts), (index + 1) * config.shard_size)
        path = shard_path(work_dir, index)
        if path.exists():
            bar.update(hi - lo)
            continue
        elapsed = time.perf_counter() - start
        if config.max_seconds is not None and elapsed + last_seconds > config.max_seconds:
            break
        shard_start = time.perf_counter()
        shard = generate_shard(model, prompts[lo:hi], lo, index, config, stop_token_ids,
                               pad_token_id, bar)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        torch.save(shard, partial)
        partial.replace(path)
        last_seconds = time.perf_counter() - shard_start
    bar.close()
    return completed_shards(work_dir)


def generate_shard(model: PreTrainedModel, prompts: Sequence[Sequence[int]], first_index: int,
                   shard: int, config: ResponseConfig, stop_token_ids: Sequence[int],
                   pad_token_id: int, bar: tqdm) -> dict[str, Tensor]:
    """One shard: prompts sorted by length (little padding per batch), batch by batch."""
    rng = random.Random(config.seed * 1_000_003 + shard)
    torch.manual_seed(config.seed * 1_000_003 + shard)  # the sampling draws of this shard
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    sequences: list[tuple[int, list[int], list[int], float]] = []
    for begin in range(0, len(order), config.batch_size):
        rows = order[begin:begin + config.batch_size]
        temperature = config.temperature if rng.random() < config.sample_fraction else 0.0
        responses = generate_halving(model, [prompts[i] for i in rows], temperature, config,
                                     stop_token_ids, pad_token_id)
        for row, response in zip(rows, responses, strict=True):
            sequences.append((first_index + row, list(prompts[row]), response, temperature))
        bar.update(len(rows))
    sequences.sort()
    return pack_sequences(sequences)


def generate_halving(model: PreTrainedModel, prompts: Sequence[Sequence[int]], temperature: float,
                     config: ResponseConfig, stop_token_ids: Sequence[int],
                     pad_token_id: int) -> list[list[int]]:
    """`generate_batch`, split in halves on CUDA out-of-memory (a lent GPU call is too short
    to lose to a batch size guessed a bit too large)."""
    try:
        return generate_batch(model, prompts, temperature, config, stop_token_ids, pad_token_id)
    except torch.cuda.OutOfMemoryError:
        if len(prompts) == 1:
            raise
    torch.cuda.empty_cache()
    half = len(prompts) // 2
    return [response for part in (prompts[:half], prompts[half:])
            for response in generate_halving(model, part, temperature, config, stop_token_ids,
                                             pad_token_id)]


@torch.no_grad()
def generate_batch(model: PreTrainedModel, prompts: Sequence[Sequence[int]], temperature: float,
                   config: ResponseConfig, stop_token_ids: Sequence[int],
                   pad_token_id: int) -> list[list[int]]:
    """Responses to one batch, each cut after its first stop token (kept: the drafter
    learns to predict the end of a turn too)."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left padding: every prompt ends at `width`
        input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt):] = 1
    sampling = (dict(do_sample=True, temperature=temperature, top_p=config.top_p, top_k=0)
                if temperature > 0 else dict(do_sample=False))
    generation = GenerationConfig(max_new_tokens=config.max_new_tokens,
                                  eos_token_id=list(stop_token_ids), pad_token_id=pad_token_id,
                                  **sampling)
    output = model.generate(input_ids=input_ids.to(device),
                            attention_mask=attention_mask.to(device),
                            generation_config=generation)
    stops = set(stop_token_ids)
    responses = []
    for new_tokens in output[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(new_tokens) if t in stops), len(new_tokens))
        responses.append(new_tokens[:end])
    return responses


def pack_sequences(sequences: Sequence[tuple[int, list[int], list[int], float]],
                   ) -> dict[str, Tensor]:
    """(prompt index, prompt ids, response ids, temperature) tuples -> the shard dict."""
    flat: list[int] = []
    offsets, prompt_lens = [0], []
    for _, prompt, response, _ in sequences:
        flat += prompt + response
        offsets.append(len(flat))
        prompt_lens.append(len(prompt))
    return {
        "tokens": torch.tensor(flat, dtype=torch.int32),
        "offsets": torch.tensor(offsets, dtype=torch.long),
        "prompt_lens": torch.tensor(prompt_lens, dtype=torch.long),
        "prompt_index": torch.tensor([s[0] for s in sequences], dtype=torch.long),
        "temperature": torch.tensor([s[3] for s in sequences], dtype=torch.float32),
    }
