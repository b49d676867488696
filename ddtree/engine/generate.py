"""Building an in-process engine (target + local drafter) and running one generation
through it: what `ddtree generate` and the tests call."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from ddtree.engine.config import EngineConfig, plan_pool
from ddtree.engine.core import Engine
from ddtree.engine.drafting import LocalDrafter
from ddtree.engine.request import GenerationRequest, RoundResult
from ddtree.errors import InvalidArgumentError
from ddtree.models.drafter import DFlashDrafter
from ddtree.models.kv_pool import KVPool
from ddtree.models.target import TargetModel
from ddtree.stats import GenerationStats

_request_ids = itertools.count()


def build_engine(target: TargetModel, drafter: DFlashDrafter | None,
                 config: EngineConfig | None = None) -> Engine:
    """An engine whose drafting (if any) runs on this process's device, captured in the
    same graphs as the target's work."""
    config = config or EngineConfig()
    weight = target.embeddings.embed_tokens.weight
    depth = drafter.config.block_size - 1 if drafter is not None else 0
    draft_bytes = 0
    if drafter is not None:
        c = drafter.config
        draft_bytes = KVPool.bytes_per_token(c.num_hidden_layers, c.num_key_value_heads,
                                             c.head_dim, weight.dtype)
    plan = plan_pool(config, target.config, weight.device, weight.dtype, draft_bytes, depth)
    local = None
    if drafter is not None:
        local = LocalDrafter(drafter, target.embeddings, plan.num_slots, plan.max_model_len)
    return Engine(target, local, config, plan)


def generate(
    target: TargetModel, drafter: DFlashDrafter | None, request: GenerationRequest,
    engine: Engine | None = None, config: EngineConfig | None = None,
) -> Iterator[tuple[RoundResult, GenerationStats]]:
    """One generation, alone; yields each step's result with the live stats (the prefill's
    first). Without an `engine`, builds a one-row engine sized for this request."""
    if request.spec.mode != "ar" and drafter is None and (engine is None or not engine.drafting):
        raise InvalidArgumentError(f"mode {request.spec.mode!r} needs a drafter")
    if engine is None:
        base = config or EngineConfig()
        needed = len(request.prompt_ids) + request.max_tokens
        engine = build_engine(target, drafter, replace(
            base, max_num_seqs=1, max_queue=0, max_model_len=base.max_model_len or needed))
    request_id = f"generate-{next(_request_ids)}"
    engine.add_request(request_id, request)
    finished = False
    try:
        while not finished:
            for rid, result in engine.step():
                if rid == request_id:
                    finished = result.finished
                    assert result.stats is not None
                    yield result, result.stats
    finally:
        if not finished:
            engine.abort(request_id)
