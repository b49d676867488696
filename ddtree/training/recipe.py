"""The drafter training recipe end to end, as stages whose state lives in a work dir, so a
job cut into short calls (a lent GPU, 10 minutes a call) can run one stage per call:

  prompts   -> <work_dir>/prompts.pt          (token ids in the target's chat form)
  generate  -> <work_dir>/responses/*.pt|npz  (the target's own answers; resumable;
                                               transformers, or the batched engine)
  train     -> <work_dir>/train/*, out_dir    (the drafter in z-lab's format)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ddtree.errors import InvalidArgumentError
from ddtree.models.checkpoint import read_config
from ddtree.training.data import SequenceStore
from ddtree.training.prompts import PromptConfig, build_prompts, encode_prompts
from ddtree.training.responses import (
    ResponseConfig,
    completed_shards,
    generate_responses,
    load_generator_model,
)
from ddtree.training.trainer import TrainConfig, train_drafter

STAGES = ("prompts", "generate", "train")


def prompts_stage(target_dir: Path, work_dir: Path, config: PromptConfig,
                  max_prompt_tokens: int = 384) -> dict[str, Any]:
    """Builds and tokenizes the prompts once; an existing prompts.pt made with the same
    settings is kept (its responses stay valid)."""
    from transformers import AutoTokenizer

    path = Path(work_dir) / "prompts.pt"
    settings = json.dumps({**asdict(config), "max_prompt_tokens": max_prompt_tokens},
                          default=str, sort_keys=True)
    if path.exists() and torch.load(path, weights_only=True)["settings"] == settings:
        return prompt_stats(path)
    if completed_shards(Path(work_dir)):
        raise InvalidArgumentError(f"{work_dir} holds responses to other prompts; "
                                   "use a fresh work dir")
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = build_prompts(config)
    ids, sources = [], []
    for prompt in prompts:  # one at a time, to keep each prompt's source label
        encoded = encode_prompts([prompt], tokenizer, max_prompt_tokens)
        if encoded:
            ids.append(encoded[0])
            sources.append(prompt.source)
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets = torch.tensor([0] + [len(i) for i in ids]).cumsum(0)
    torch.save({"tokens": torch.tensor([t for i in ids for t in i], dtype=torch.int32),
                "offsets": offsets, "sources": sources, "settings": settings}, path)
    return prompt_stats(path)


def load_prompt_ids(work_dir: Path) -> list[list[int]]:
    path = Path(work_dir) / "prompts.pt"
    if not path.exists():
        raise InvalidArgumentError(f"no {path}: run the prompts stage first")
    saved = torch.load(path, weights_only=True)
    tokens, offsets = saved["tokens"].tolist(), saved["offsets"].tolist()
    return [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def prompt_stats(path: Path) -> dict[str, Any]:
    saved = torch.load(path, weights_only=True)
    counts: dict[str, int] = {}
    for source in saved["sources"]:
        counts[source] = counts.get(source, 0) + 1
    lengths = saved["offsets"].diff().float()
    return {"num_prompts": len(saved["sources"]), "by_source": counts,
            "mean_prompt_tokens": round(float(lengths.mean()), 1) if len(lengths) else 0.0}


def stop_and_pad_ids(target_dir: Path) -> tuple[list[int], int]:
    """End-of-turn ids (config.json `eos_token_id`, int or list) and the pad id."""
    config = read_config(Path(target_dir))
    eos = config.get("eos_token_id")
    stops = [int(t) for t in (eos if isinstance(eos, list) else [eos]) if t is not None]
    if not stops:
        raise InvalidArgumentError(f"{target_dir}/config.json has no eos_token_id")
    pad = config.get("pad_token_id")
    return stops, int(pad if pad is not None else stops[0])


def generate_stage(target_dir: Path, work_dir: Path, config: ResponseConfig,
                   device: torch.device, progress: bool = True) -> dict[str, Any]:
    """Generates the missing response shards (stops early at `config.max_seconds`)."""
    prompts = load_prompt_ids(Path(work_dir))
    stops, pad = stop_and_pad_ids(Path(target_dir))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    start = time.perf_counter()
    model = load_generator_model(Path(target_dir), device, dtype)
    generate_responses(model, prompts, Path(work_dir), config, stops, pad, progress)
    stats = response_stats(Path(work_dir), stops)
    stats["seconds"] = round(time.perf_counter() - start, 1)
    stats["num_prompts"] = len(prompts)
    return stats


def engine_generate_stage(target_dir: Path, work_dir: Path, config: ResponseConfig,
                          max_num_seqs: int, device: torch.device) -> dict[str, Any]:
    """The generate stage through the project's batched engine (ar mode) instead of
    transformers: same prompts and sampling recipe, `.npz` shards (ddtree.training.shards)."""
    from ddtree.models.target import load_target
    from ddtree.training.engine_responses import EngineGenConfig, generate_with_engine

    prompts = load_prompt_ids(Path(work_dir))
    stops, _ = stop_and_pad_ids(Path(target_dir))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_target(Path(target_dir), device, dtype)
    engine_config = EngineGenConfig(
        max_new_tokens=config.max_new_tokens, max_num_seqs=max_num_seqs,
        sample_fraction=config.sample_fraction, temperature=config.temperature,
        top_p=config.top_p, seed=config.seed, max_seconds=config.max_seconds,
        cuda_graphs=device.type == "cuda")
    stats = generate_with_engine(target, prompts, Path(work_dir), engine_config, stops)
    return {**stats, **response_stats(Path(work_dir), stops)}


def response_stats(work_dir: Path, stop_token_ids: list[int]) -> dict[str, Any]:
    shards = completed_shards(work_dir)
    store = SequenceStore.load(shards, min_response=0)
    ends = [int(store.tokens[int(s) + int(n) - 1]) in stop_token_ids
            for s, n in zip(store.starts, store.lengths, strict=True)]
    response_lengths = (store.lengths - store.prompt_lens).float()
    return {"num_shards": len(shards), "num_sequences": len(store),
            "num_response_tokens": store.num_response_tokens(),
            "mean_response_tokens": round(float(response_lengths.mean()), 1) if ends else 0.0,
            "ended_with_eos": round(sum(ends) / max(1, len(ends)), 3)}


def train_stage(target_dir: Path, out_dir: Path, work_dir: Path, config: TrainConfig,
                device: torch.device, resume: bool = False,
                progress: bool = True) -> dict[str, Any]:
    return train_drafter(Path(target_dir), Path(out_dir), Path(work_dir), config, device,
                         resume=resume, progress=progress)
