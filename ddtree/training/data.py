"""Training batches for a DFlash drafter: random anchors, blocks and the block mask.

Each sequence is a prompt followed by the target's own response. An anchor `a` inside the
response opens a block `[x[a], MASK x (b-1)]` at positions `a .. a+b-1`; block position
`k` (1..b-1) predicts `x[a+k]`, exactly the drafting task after the target committed
`x[0..a-1]` and chose the bonus token `x[a]`. Many blocks share one forward: a block's
queries see the context features strictly before its anchor and their own block (both
directions), never another block (ALGORITHMS.md section 5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

IGNORE_INDEX = -100
# (block size, gamma) of the DFlash recipe; other sizes interpolate linearly.
GAMMA_POINTS = ((8, 4.0), (10, 5.0), (16, 7.0))


def loss_gamma(block_size: int) -> float:
    """Decay of the per-position loss weight: 7 for b=16, 5 for 10, 4 for 8; linear in
    between and beyond (at least 1)."""
    sizes = [size for size, _ in GAMMA_POINTS]
    gammas = [gamma for _, gamma in GAMMA_POINTS]
    if block_size < sizes[0]:
        slope = (gammas[1] - gammas[0]) / (sizes[1] - sizes[0])
        return max(1.0, gammas[0] - slope * (sizes[0] - block_size))
    if block_size > sizes[-1]:
        slope = (gammas[-1] - gammas[-2]) / (sizes[-1] - sizes[-2])
        return gammas[-1] + slope * (block_size - sizes[-1])
    return float(np.interp(block_size, sizes, gammas))


def position_weights(block_size: int, gamma: float | None = None) -> Tensor:
    """(b-1,) float32: weight `exp(-(k-1)/gamma)` of block position k = 1..b-1 (early
    positions matter most: a draft is only accepted up to its first miss)."""
    gamma = loss_gamma(block_size) if gamma is None else gamma
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


@dataclass
class BlockBatch:
    """One training batch. S: padded sequence length, n: blocks per row, b: block size,
    Q = n * b block queries."""

    input_ids: Tensor  # (B, S) int64, padded with 0
    attention_mask: Tensor  # (B, S) int64, 1 on real tokens
    anchors: Tensor  # (B, n) int64; 0 for padding blocks
    bonus: Tensor  # (B, n) int64: the token at each anchor
    block_positions: Tensor  # (B, Q) int64: anchor + 0..b-1
    visible: Tensor  # (B, Q, S + Q) bool: context keys then block keys
    labels: Tensor  # (B, n, b-1) int64: x[anchor + k], IGNORE_INDEX outside the sequence
    weights: Tensor  # (B, n, b-1) float32: position weight, 0 where ignored


def sample_anchors(prompt_len: int, seq_len: int, num_anchors: int,
                   generator: torch.Generator) -> Tensor:
    """Sorted distinct anchors in the response, `[prompt_len, seq_len - 2]` (each block
    needs at least one label); fewer when the response is short. (n',) int64."""
    low, high = prompt_len, seq_len - 2
    if high < low:
        return torch.zeros(0, dtype=torch.long)
    choice = torch.randperm(high - low + 1, generator=generator)[:num_anchors]
    return (choice + low).sort().values


def block_visibility(anchors: Tensor, valid: Tensor, seq_len: int, block_size: int) -> Tensor:
    """anchors, valid: (B, n) -> visible (B, n*b, S + n*b) bool.

    Query rows of block j see context keys `s < anchors[j]` (none for a padding block) and
    the b keys of block j; every row sees at least its own block.
    """
    batch, num_blocks = anchors.shape
    q = num_blocks * block_size
    ctx = torch.arange(seq_len, device=anchors.device)
    ctx_visible = (ctx[None, None, :] < anchors[..., None]) & valid[..., None]  # (B, n, S)
    ctx_visible = ctx_visible.repeat_interleave(block_size, dim=1)  # (B, Q, S)
    block_of = torch.arange(q, device=anchors.device) // block_size  # (Q,)
    own = (block_of[:, None] == block_of[None, :]).expand(batch, q, q)  # (B, Q, Q)
    return torch.cat([ctx_visible, own], dim=-1)


def make_batch(sequences: Sequence[tuple[Tensor, int]], block_size: int, num_anchors: int,
               generator: torch.Generator, device: torch.device | str = "cpu") -> BlockBatch:
    """sequences: (token ids (T,) int, prompt length) pairs -> one BlockBatch on `device`
    with n = num_anchors blocks per row (rows with fewer anchors get padding blocks). The
    anchors are drawn on the CPU (seeded); the large tensors are built on `device`."""
    batch, seq_len = len(sequences), max(len(ids) for ids, _ in sequences)
    input_ids = torch.zeros(batch, seq_len, dtype=torch.long)
    lengths = torch.zeros(batch, dtype=torch.long)
    anchors = torch.zeros(batch, num_anchors, dtype=torch.long)
    valid = torch.zeros(batch, num_anchors, dtype=torch.bool)
    for row, (ids, prompt_len) in enumerate(sequences):
        input_ids[row, :len(ids)] = ids
        lengths[row] = len(ids)
        chosen = sample_anchors(prompt_len, len(ids), num_anchors, generator)
        anchors[row, :len(chosen)] = chosen
        valid[row, :len(chosen)] = True
    input_ids, lengths, anchors, valid = (t.to(device) for t in (input_ids, lengths, anchors,
                                                                  valid))
    offsets = torch.arange(block_size, device=device)
    targets = anchors[..., None] + offsets[1:]  # (B, n, b-1)
    inside = valid[..., None] & (targets < lengths[:, None, None])
    labels = torch.gather(input_ids, 1, targets.clamp(max=seq_len - 1).flatten(1))
    labels = labels.view_as(targets).masked_fill(~inside, IGNORE_INDEX)
    weights = position_weights(block_size).to(device).expand_as(targets) * inside
    return BlockBatch(
        input_ids=input_ids,
        attention_mask=(torch.arange(seq_len, device=device) < lengths[:, None]).long(),
        anchors=anchors, bonus=torch.gather(input_ids, 1, anchors),
        block_positions=(anchors[..., None] + offsets).flatten(1),
        visible=block_visibility(anchors, valid, seq_len, block_size),
        labels=labels, weights=weights.contiguous())


class SequenceStore:
    """All (prompt + response) sequences of the response shards, flat in memory.

    tokens: (total,) int32; starts, lengths, prompt_lens: (N,) int64; temperatures: (N,)
    float32, the temperature each response was generated at (0 = the target's greedy
    answer, the sequences teacher-forced acceptance at T = 0 is exact on).
    """

    def __init__(self, tokens: Tensor, starts: Tensor, lengths: Tensor, prompt_lens: Tensor,
                 temperatures: Tensor | None = None):
        self.tokens, self.starts, self.lengths, self.prompt_lens = (
            tokens, starts, lengths, prompt_lens)
        self.temperatures = (temperatures if temperatures is not None
                             else torch.zeros(len(starts), dtype=torch.float32))

    @classmethod
    def load(cls, shard_paths: Sequence[Path], min_response: int = 2) -> SequenceStore:
        """Reads shards written by `ddtree.training.responses` (`.pt`) or
        `ddtree.training.shards` (`.npz`); drops responses shorter than `min_response`
        tokens (no block fits)."""
        tokens, starts, lengths, prompt_lens, temps = [], [], [], [], []
        offset = 0
        for path in shard_paths:
            shard = _read_any_shard(Path(path))
            bounds = shard["offsets"]
            for i in range(len(bounds) - 1):
                start, end = int(bounds[i]), int(bounds[i + 1])
                prompt_len = int(shard["prompt_lens"][i])
                if end - start - prompt_len < min_response:
                    continue
                tokens.append(shard["tokens"][start:end])
                starts.append(offset)
                lengths.append(end - start)
                prompt_lens.append(prompt_len)
                temps.append(float(shard["temperature"][i]))
                offset += end - start
        flat = torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.int32)
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        return cls(flat, as_long(starts), as_long(lengths), as_long(prompt_lens),
                   torch.tensor(temps, dtype=torch.float32))

    def __len__(self) -> int:
        return len(self.starts)

    def get(self, index: int) -> tuple[Tensor, int]:
        start, length = int(self.starts[index]), int(self.lengths[index])
        return self.tokens[start:start + length].long(), int(self.prompt_lens[index])

    def num_response_tokens(self) -> int:
        return int((self.lengths - self.prompt_lens).sum())

    def split(self, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
        """(train indices, eval indices). A sequence is held out by a hash of its prompt
        and the seed, so it stays held out when more data arrives in a later session (a
        drafter resumed from an earlier run never trains on the new run's eval set); at
        least one eval sequence when there are two or more sequences."""
        if len(self) < 2:
            return list(range(len(self))), []
        keys = []
        for i in range(len(self)):
            start = int(self.starts[i])
            prompt = self.tokens[start:start + int(self.prompt_lens[i])].numpy().tobytes()
            digest = hashlib.blake2b(prompt, digest_size=8, salt=seed.to_bytes(8, "little",
                                                                                signed=True))
            keys.append(int.from_bytes(digest.digest(), "little") / 2.0**64)
        eval_set = [i for i, key in enumerate(keys) if key < eval_fraction]
        if not eval_set:
            eval_set = [min(range(len(self)), key=lambda i: keys[i])]
        if len(eval_set) == len(self):
            eval_set = eval_set[:-1]
        held = set(eval_set)
        return [i for i in range(len(self)) if i not in held], eval_set


def _read_any_shard(path: Path) -> dict[str, Tensor]:
    """A shard's tokens (int32), offsets, prompt lengths and temperatures as tensors."""
    if path.suffix == ".npz":
        from ddtree.training.shards import read_shard

        shard = read_shard(path)
        return {"tokens": torch.from_numpy(shard["tokens"].astype(np.int32)),
                "offsets": torch.from_numpy(shard["offsets"]),
                "prompt_lens": torch.from_numpy(shard["prompt_lens"].astype(np.int64)),
                "temperature": torch.from_numpy(shard["temperature"])}
    shard = torch.load(path, weights_only=True)
    if "temperature" not in shard:
        shard["temperature"] = torch.zeros(len(shard["prompt_lens"]))
    return shard
