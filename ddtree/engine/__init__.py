"""The batched engine core: one round for every active generation (round.py), a KV pool
and per-row device state (state.py), admission and the step (core.py), the drafting
interface (drafting.py), CUDA graphs per bucket (graphs.py), and the one-request
convenience `generate` (generate.py)."""

from ddtree.engine.config import EngineConfig
from ddtree.engine.core import Engine
from ddtree.engine.drafting import LocalDrafter
from ddtree.engine.generate import generate
from ddtree.engine.request import (
    MAX_BUDGET,
    MODE_RULES,
    MODES,
    GenerationRequest,
    Mode,
    RoundResult,
    SpecParams,
    TokenLogprob,
)

__all__ = [
    "MAX_BUDGET", "MODES", "MODE_RULES", "Engine", "EngineConfig", "GenerationRequest",
    "LocalDrafter", "Mode", "RoundResult", "SpecParams", "TokenLogprob", "generate",
]
