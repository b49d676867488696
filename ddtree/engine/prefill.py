"""Prefill: the prompts of the rows admitted in one step through the target in one forward
(in static shapes replayed as a CUDA graph, ddtree/engine/prefill_graphs.py, or eagerly
in their exact shape), each row's first token chosen like any bonus token, and the
rows' device state set. Every mode shares this one prefill, so a prompt's K/V and first
token never depend on the mode, nor on the other prompts of its forward."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ddtree.acceptance import sample_race
from ddtree.engine.logprobs import token_logprobs
from ddtree.engine.prefill_graphs import PrefillGraphs, prompt_features
from ddtree.engine.request import TokenLogprob
from ddtree.engine.rows import Row
from ddtree.engine.state import RowParams, SlotState
from ddtree.models.kv_pool import KVPool
from ddtree.models.meta import device_ints, prompts_meta
from ddtree.models.target import TargetModel, TargetOutput
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
    static: PrefillGraphs | None = None,
) -> list[Prefilled]:
    """`launch_prefill`, then its results at once."""
    return launch_prefill(target, pool, state, rows, params, feature_layers, static).read()


class LaunchedPrefill:
    """A prefill enqueued on the device: each row's device state is set (its first token
    too) and its prompt features are device tensors, but the host has not read the first
    tokens yet. `read` waits for the prefill alone (its own event, not the work enqueued
    after it: the engine launches the next round before it reads), so a step that admits
    rows needs no host sync before its round."""

    def __init__(self, rows: Sequence[Row], out: TargetOutput, spans: list[tuple[int, int]],
                 firsts: Tensor, features: list[Tensor | None]) -> None:
        self.rows, self.out, self.spans, self.features = rows, out, spans, features
        if firsts.device.type == "cuda":
            self._host = torch.empty(firsts.shape, dtype=firsts.dtype, pin_memory=True)
            self._host.copy_(firsts, non_blocking=True)
            self._done: torch.cuda.Event | None = torch.cuda.Event()
            self._done.record()
        else:
            self._host, self._done = firsts, None

    @property
    def wants_logits(self) -> bool:
        """A row asks for logprobs: its read needs this prefill's logits as they are now."""
        return any(row.request.prompt_logprobs or row.request.top_logprobs >= 0
                   for row in self.rows)

    def read(self) -> list[Prefilled]:
        """Per row -> (first token, prompt features (P, k*H) or None, prompt logprobs, the
        first token's logprobs), each logprob list only when the request asks for it."""
        if self._done is not None:
            self._done.synchronize()
        first_tokens = self._host.tolist()
        logits = self.out.logits
        results: list[Prefilled] = []
        for i, row in enumerate(self.rows):
            request, (begin, stop) = row.request, self.spans[i]
            prompt_logprobs = logprobs = None
            if request.prompt_logprobs:
                prompt_logprobs = token_logprobs(logits[begin:stop - 1], request.prompt_ids[1:],
                                                 max(request.top_logprobs, 0))
            if request.top_logprobs >= 0:
                logprobs = token_logprobs(logits[stop - 1:stop], [first_tokens[i]],
                                          request.top_logprobs)
            results.append((first_tokens[i], self.features[i], prompt_logprobs, logprobs))
        return results


def launch_prefill(
    target: TargetModel, pool: KVPool, state: SlotState, rows: Sequence[Row],
    params: Sequence[RowParams], feature_layers: Sequence[int],
    static: PrefillGraphs | None = None,
) -> LaunchedPrefill:
    """Several rows' prompts in ONE target forward (batched prefill; the kernels make each
    row's K/V, logits and features those of its prefill alone), in static shapes through
    `static` when it is given and the step fits it (no prompt logprobs); every row's state
    set on the device. No host sync: `LaunchedPrefill.read` gives the results."""
    lengths = [len(row.request.prompt_ids) for row in rows]
    prompts = [row.request.prompt_ids for row in rows]
    is_static = (static is not None and static.fits(sum(lengths), len(rows))
                 and not any(row.request.prompt_logprobs for row in rows))
    if is_static:
        assert static is not None
        out = static.forward(target, pool, prompts, [row.slot for row in rows], feature_layers)
        spans = [(i, i + 1) for i in range(len(rows))]  # row i's last-token logits: row i
    else:
        out, spans = _eager_forward(target, pool, rows, lengths, feature_layers)
    last = out.logits[: len(rows)] if is_static else out.logits[
        device_ints([stop - 1 for _, stop in spans], out.logits.device)]  # (n, V)
    firsts = last.argmax(-1)  # (n,)
    for i, (row, p) in enumerate(zip(rows, params, strict=True)):
        if p.temperature != 0:
            firsts[i] = choose_token(last[i:i + 1], p, row.seed)[0]
        state.start_row(row.slot, lengths[i], firsts[i:i + 1], p)
    features = prompt_features(out.features, lengths, copy=is_static)
    return LaunchedPrefill(rows, out, spans, firsts, features)


def _eager_forward(target: TargetModel, pool: KVPool, rows: Sequence[Row], lengths: list[int],
                   feature_layers: Sequence[int]) -> tuple[TargetOutput, list[tuple[int, int]]]:
    """The prompts' forward in their exact shape. Logits of each row's last token, of its
    whole prompt when it asks for prompt logprobs: row i's are logits[spans[i][0]:
    spans[i][1]], its first token's the last of them."""
    device = pool.k.device
    prompts = device_ints([t for row in rows for t in row.request.prompt_ids], device)
    meta = prompts_meta([row.slot for row in rows], lengths, device)
    wanted: list[int] = []
    spans: list[tuple[int, int]] = []
    end = 0
    for row, n in zip(rows, lengths, strict=True):
        end += n
        begin = len(wanted)
        wanted.extend(range(end - n, end) if row.request.prompt_logprobs else (end - 1,))
        spans.append((begin, len(wanted)))
    out = target(prompts, meta, pool, feature_layers,
                 logit_rows=device_ints(wanted, device))
    return out, spans


def choose_token(logits: Tensor, params: RowParams, seed: int) -> Tensor:
    """logits (1, V) -> (1,) the target's token: argmax, or a sample of the same
    distribution every round uses, from the row's own counter-based stream."""
    if params.temperature == 0:
        return logits.argmax(-1)
    device = logits.device
    sampling = SamplingParams(params.temperature, params.top_k, params.top_p)
    rows = RowSampling.of(sampling, 1, device, device_ints([seed_to_int64(seed)], device))
    probs = row_target_probs(logits[None], rows)[0]  # (1, V)
    counter = torch.zeros(1, dtype=torch.long, device=device)
    return sample_race(probs, counter_uniform(rows.seed, counter, STREAM_FIRST, probs.shape[-1]))
