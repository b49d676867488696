"""Prefill: the prompts of the rows admitted in one step through the target in one forward
(eagerly: prompt lengths vary), each row's first token chosen like any bonus token, and the
rows' device state set. Every mode shares this one prefill, so a prompt's K/V and first
token never depend on the mode, nor on the other prompts of its forward."""

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
from ddtree.models.meta import prompts_meta
from ddtree.models.target import TargetModel
from ddtree.sampling import (
    STREAM_FIRST,
    RowSampling,
    SamplingParams,
    counter_uniform,
    row_target_probs,
    seed_to_int64,
)

Prefilled = tuple[int, Tensor | None, list[TokenLogprob] | None, list[TokenLogprob] | None]


def prefill_rows(
    target: TargetModel, pool: KVPool, state: SlotState, rows: Sequence[Row],
    params: Sequence[RowParams], feature_layers: Sequence[int],
) -> list[Prefilled]:
    """Several rows' prompts in ONE target forward (batched prefill; the kernels make each
    row's K/V, logits and features those of its prefill alone). Per row -> (first token,
    prompt features (P, k*H) or None, prompt logprobs, the first token's logprobs), each
    logprob list only when the request asks for it."""
    device = pool.k.device
    lengths = [len(row.request.prompt_ids) for row in rows]
    prompts = torch.tensor([t for row in rows for t in row.request.prompt_ids],
                           dtype=torch.long, device=device)
    meta = prompts_meta([row.slot for row in rows], lengths, device)
    # Logits of each row's last token, of its whole prompt when it asks for prompt logprobs:
    # row i's are logits[spans[i][0]:spans[i][1]], its first token's the last of them.
    wanted: list[int] = []
    spans: list[tuple[int, int]] = []
    starts: list[int] = []  # each row's first token in `prompts`
    end = 0
    for row, n in zip(rows, lengths, strict=True):
        starts.append(end)
        end += n
        begin = len(wanted)
        wanted.extend(range(end - n, end) if row.request.prompt_logprobs else (end - 1,))
        spans.append((begin, len(wanted)))
    out = target(prompts, meta, pool, feature_layers,
                 logit_rows=torch.tensor(wanted, device=device))
    firsts = [choose_token(out.logits[stop - 1:stop], p, row.seed)
              for row, p, (_, stop) in zip(rows, params, spans, strict=True)]
    for row, p, first, n in zip(rows, params, firsts, lengths, strict=True):
        state.start_row(row.slot, n, first, p)
    first_tokens = torch.cat(firsts).tolist()  # the one host sync
    results: list[Prefilled] = []
    for i, row in enumerate(rows):
        request, (begin, stop) = row.request, spans[i]
        prompt_logprobs = logprobs = None
        if request.prompt_logprobs:
            prompt_logprobs = token_logprobs(out.logits[begin:stop - 1], request.prompt_ids[1:],
                                             max(request.top_logprobs, 0))
        if request.top_logprobs >= 0:
            logprobs = token_logprobs(out.logits[stop - 1:stop], [first_tokens[i]],
                                      request.top_logprobs)
        features = None
        if out.features is not None:
            features = out.features[starts[i]:starts[i] + lengths[i]]
        results.append((first_tokens[i], features, prompt_logprobs, logprobs))
    return results


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
