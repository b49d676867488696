"""A row's prefill: the prompt through the target once (eagerly: prompt lengths vary), its
first token chosen like any bonus token, and the row's device state set. Every mode shares
this one prefill, so the prompt's K/V and first token never depend on the mode."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ddtree.acceptance import sample_race
from ddtree.engine.logprobs import token_logprobs
from ddtree.engine.request import TokenLogprob
from ddtree.engine.rows import Row
from ddtree.engine.state import RowParams, SlotState
from ddtree.models.kv_pool import KVPool
from ddtree.models.meta import causal_meta
from ddtree.models.target import TargetModel
from ddtree.sampling import (
    STREAM_FIRST,
    RowSampling,
    SamplingParams,
    counter_uniform,
    row_target_probs,
    seed_to_int64,
)


def prefill_row(
    target: TargetModel, pool: KVPool, state: SlotState, row: Row, params: RowParams,
    feature_layers: Sequence[int],
) -> tuple[int, Tensor | None, list[TokenLogprob] | None, list[TokenLogprob] | None]:
    """-> (first token, prompt features (P, k*H) or None, prompt logprobs, the first
    token's logprobs), each logprob list only when the request asks for it."""
    request = row.request
    device = pool.k.device
    prompt = torch.tensor(request.prompt_ids, dtype=torch.long, device=device)
    num_prompt = prompt.shape[0]
    meta = causal_meta(row.slot, 0, num_prompt, device)
    last = torch.tensor([num_prompt - 1], device=device)
    out = target(prompt, meta, pool, feature_layers,
                 logit_rows=None if request.prompt_logprobs else last)
    first = choose_token(out.logits[-1:], params, row.seed)  # (1,)
    state.start_row(row.slot, num_prompt, first, params)
    first_token = int(first.item())
    prompt_logprobs = logprobs = None
    if request.prompt_logprobs:
        prompt_logprobs = token_logprobs(out.logits[:-1], request.prompt_ids[1:],
                                         max(request.top_logprobs, 0))
    if request.top_logprobs >= 0:
        logprobs = token_logprobs(out.logits[-1:], [first_token], request.top_logprobs)
    return first_token, out.features, prompt_logprobs, logprobs


def choose_token(logits: Tensor, params: RowParams, seed: int) -> Tensor:
    """logits (1, V) -> (1,) the target's token: argmax, or a sample of the same
    distribution every round uses, from the row's own counter-based stream."""
    if params.temperature == 0:
        return logits.argmax(-1)
    device = logits.device
    sampling = SamplingParams(params.temperature, params.top_k, params.top_p)
    rows = RowSampling.of(sampling, 1, device, torch.tensor([seed_to_int64(seed)], device=device))
    probs = row_target_probs(logits[None], rows)[0]  # (1, V)
    counter = torch.zeros(1, dtype=torch.long, device=device)
    return sample_race(probs, counter_uniform(rows.seed, counter, STREAM_FIRST, probs.shape[-1]))
