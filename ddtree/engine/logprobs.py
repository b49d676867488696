"""The target's logprobs of committed (or prompt) tokens, read from its logits."""

from __future__ import annotations

import torch
from torch import Tensor

from ddtree.engine.request import TokenLogprob


def token_logprobs(logits: Tensor, chosen: list[int], top_n: int) -> list[TokenLogprob]:
    """logits (A, V) at the positions that predicted `chosen` (A tokens) -> per token
    (token, its logprob, the top_n most likely (token, logprob) pairs)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    index = torch.tensor(chosen, device=logits.device)[:, None]
    picked = logp.gather(1, index)[:, 0].tolist()
    top_v, top_i = logp.topk(max(top_n, 1), dim=-1)
    tops = [list(zip(i, v, strict=True))[:top_n]
            for i, v in zip(top_i.tolist(), top_v.tolist(), strict=True)]
    return list(zip(chosen, picked, tops, strict=True))
