"""The speculative round, top to bottom: draft -> build tree -> verify -> walk -> commit.

`DraftSession` is the drafter's half of one request (it lives in drafter_svc),
`VerifySession` the target's half (it lives in verifier_svc and is the source of truth);
`generate` composes the two in one process so the cost of the split stays measurable.

Per round the only host sync is reading the committed tokens (needed to stream them):
the walk result is fetched in ONE transfer, and stage timers are read after it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
from torch import Tensor

from ddtree.acceptance import walk
from ddtree.errors import CapacityError, InvalidArgumentError
from ddtree.models.drafter import DFlashDrafter
from ddtree.models.target import TargetEmbeddings, TargetModel
from ddtree.sampling import SamplingParams, make_generator, target_probs
from ddtree.stats import GenerationStats, StageTimer
from ddtree.tree import DraftTree, ancestor_mask, build_tree, chain_tree

Mode = Literal["ar", "linear", "tree", "shadow"]
MODES: tuple[str, ...] = get_args(Mode)
MAX_BUDGET = 1024


@dataclass(frozen=True)
class SpecParams:
    """How to speculate for one request (server default, overridable per request)."""

    mode: Mode = "tree"
    budget: int = 32
    max_topk: int | None = None

    def validate(self, max_budget: int = MAX_BUDGET) -> None:
        if self.mode not in MODES:
            raise InvalidArgumentError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not 1 <= self.budget <= max_budget:
            raise InvalidArgumentError(f"budget must be in [1, {max_budget}], got {self.budget}")
        if self.max_topk is not None and self.max_topk < 1:
            raise InvalidArgumentError(f"max_topk must be >= 1, got {self.max_topk}")


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    spec: SpecParams = SpecParams()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    top_logprobs: int = -1  # -1: no logprobs; 0: the chosen token's; n: n alternatives too
    prompt_logprobs: bool = False  # the target's logprob of each prompt token after the first

    def validate(self, vocab_size: int, max_model_len: int) -> None:
        if not self.prompt_ids:
            raise InvalidArgumentError("the prompt is empty")
        bad = [t for t in self.prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidArgumentError(f"prompt token ids out of [0, {vocab_size}): {bad[:5]}")
        if self.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if len(self.prompt_ids) + self.max_tokens > max_model_len:
            raise InvalidArgumentError(
                f"prompt ({len(self.prompt_ids)} tokens) + max_tokens ({self.max_tokens}) "
                f"exceeds the maximum model length {max_model_len}"
            )
        if not -1 <= self.top_logprobs <= 20:
            raise InvalidArgumentError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        self.sampling.validate()
        self.spec.validate()


TokenLogprob = tuple[int, float, list[tuple[int, float]]]  # (token, logprob, top alternatives)


@dataclass
class RoundResult:
    new_tokens: list[int]  # to stream: trimmed at EOS / stop token / max_tokens
    features: Tensor | None  # (1, A, k*H) features of the rows just put in the target KV
    acceptance_length: int
    finished: bool
    finish_reason: str | None  # "stop" | "length" | None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # the prefill's result only, on request
    path: list[int] = field(default_factory=list)  # accepted node indices, root first
    committed_tokens: list[int] = field(default_factory=list)  # the path's tokens (in the KV)
    num_drafted_nodes: int = 0  # nodes of the verified tree (root excluded)


def _stop_set(request: GenerationRequest, eos_token_ids: Sequence[int]) -> frozenset[int]:
    stops = set(request.stop_token_ids)
    if not request.ignore_eos:
        stops.update(eos_token_ids)
    return frozenset(stops)


def single_node_tree(bonus_token: int, device: torch.device) -> DraftTree:
    """The root alone: one plain autoregressive step (`ar` mode, drafter fallback)."""
    zero = torch.zeros(1, 1, dtype=torch.long, device=device)
    return DraftTree(tokens=zero + bonus_token, parents=zero - 1, depth=zero)


class VerifySession:
    """The target's half of one generation: prefill, then one `verify` per round."""

    def __init__(
        self,
        target: TargetModel,
        request: GenerationRequest,
        feature_layers: Sequence[int] = (),
        max_model_len: int | None = None,
        max_tree_nodes: int = MAX_BUDGET,
    ) -> None:
        config = target.config
        max_model_len = max_model_len or config.max_position_embeddings
        request.validate(config.vocab_size, max_model_len)
        self.target, self.request = target, request
        self.feature_layers = tuple(feature_layers)
        self.device = target.embeddings.embed_tokens.weight.device
        # Room for the whole generation plus one unverified tree beyond it.
        self.max_len = len(request.prompt_ids) + request.max_tokens + max_tree_nodes + 1
        self.cache = target.new_cache(1, self.max_len)
        self.cache_lens = torch.zeros(1, dtype=torch.long, device=self.device)
        self.committed_len = 0
        self.bonus_token = -1
        self.finished = False
        self.stops = _stop_set(request, config.eos_token_ids)
        self.generator = make_generator(request.sampling.seed, self.device)
        self.stats = GenerationStats(request.spec.mode, request.spec.budget)
        self.stats.num_prompt_tokens = len(request.prompt_ids)
        self.timer = StageTimer(self.device)

    def _choose(self, logits: Tensor) -> Tensor:
        """logits (1, V) -> (1,) the target's token: argmax, or a seeded sample."""
        if self.request.sampling.is_greedy:
            return logits.argmax(-1)
        probs = target_probs(logits[:, None], self.request.sampling)[:, 0]
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]

    @torch.inference_mode()
    def prefill(self) -> RoundResult:
        """Runs the prompt; the first token becomes the bonus (chosen, not yet in the KV)."""
        self.timer.start()
        prompt = torch.tensor([self.request.prompt_ids], dtype=torch.long, device=self.device)
        num_prompt = prompt.shape[1]
        positions = torch.arange(num_prompt, device=self.device)[None]  # (1, P)
        want_prompt = self.request.prompt_logprobs
        out = self.target(
            prompt, positions, self.cache, self.cache_lens, kv_len=num_prompt,
            feature_layers=self.feature_layers, last_only=not want_prompt,
        )
        first = self._choose(out.logits[:, -1])
        prompt_logprobs = None
        if want_prompt:
            prompt_logprobs = self._logprobs(out.logits[0, :-1], prompt[0, 1:])
        self.cache_lens += num_prompt
        self.committed_len = num_prompt
        self.timer.mark("prefill")
        logprobs = None
        if self.request.top_logprobs >= 0:
            logprobs = self._logprobs(out.logits[0, -1:], first)
        self.bonus_token = int(first.item())
        self.timer.flush(self.stats)
        result = self._emit([self.bonus_token], out.features, 1, logprobs)
        result.prompt_logprobs = prompt_logprobs
        return result

    @torch.inference_mode()
    def verify(self, tree: DraftTree | None, first_child_only: bool = False,
               max_depth: int | None = None) -> RoundResult:
        """One target pass over `tree` (None = a plain ar step), walk, compact, commit.

        `first_child_only` commits with the linear rule on each node's rank-0 child
        (shadow mode; a chain tree gives the same result either way). `max_depth` bounds
        the walk (the drafter's block size - 1; None = the node count).
        """
        assert not self.finished, "verify after the generation finished"
        self.timer.start()
        tree = tree if tree is not None else single_node_tree(self.bonus_token, self.device)
        num_rows = tree.tokens.shape[1]  # 1 + N
        if self.committed_len + num_rows > self.max_len:
            raise CapacityError(f"tree of {num_rows} rows does not fit the KV cache")
        positions = self.committed_len + tree.depth  # (1, 1+N)
        out = self.target(
            tree.tokens, positions, self.cache, self.cache_lens,
            kv_len=self.committed_len + num_rows, tree_mask=ancestor_mask(tree.parents),
            feature_layers=self.feature_layers,
        )
        self.timer.mark("verify")
        walked = walk(tree, out.logits, self.request.sampling, self.generator,
                      first_child_only=first_child_only,
                      max_depth=min(max_depth or num_rows - 1, num_rows - 1))
        self.timer.mark("walk")
        # The round's single host sync: acceptance length, path and next token together.
        path_tokens = tree.tokens.gather(1, walked.path)  # (1, D+1)
        fetched = torch.cat([walked.acceptance_length, walked.next_token,
                             walked.path[0], path_tokens[0]]).tolist()
        accepted = fetched[0]
        width = walked.path.shape[1]
        path = walked.path[:, :accepted]  # (1, A)
        path_nodes = fetched[2: 2 + accepted]
        tokens = fetched[2 + width: 2 + width + accepted]
        self.cache.compact(self.committed_len, path)
        self.cache_lens += accepted
        self.committed_len += accepted
        self.bonus_token = fetched[1]
        features = out.features.index_select(1, path[0]) if out.features is not None else None
        self.timer.mark("commit")
        self.timer.flush(self.stats)
        self.stats.record_round(accepted, num_rows - 1)
        logprobs = None
        if self.request.top_logprobs >= 0:
            chosen = torch.tensor(tokens[1:] + [self.bonus_token], device=self.device)
            logprobs = self._logprobs(out.logits[0].index_select(0, path[0]), chosen)
        result = self._emit(tokens[1:] + [self.bonus_token], features, accepted, logprobs)
        result.path, result.committed_tokens = path_nodes, tokens
        result.num_drafted_nodes = num_rows - 1
        return result

    def _logprobs(self, logits: Tensor, chosen: Tensor) -> list[TokenLogprob]:
        """logits (A, V) at the nodes that predicted `chosen` (A,) -> the target's logprobs."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        picked = logp.gather(1, chosen[:, None])[:, 0].tolist()
        top_n = self.request.top_logprobs
        top_v, top_i = logp.topk(max(top_n, 1), dim=-1)
        tops = [list(zip(i, v, strict=True))[:top_n] for i, v in zip(
            top_i.tolist(), top_v.tolist(), strict=True)]
        return list(zip(chosen.tolist(), picked, tops, strict=True))

    def _emit(self, tokens: list[int], features: Tensor | None, accepted: int,
              logprobs: list[TokenLogprob] | None) -> RoundResult:
        """Trims at the first stop token (excluded from the output) or at max_tokens."""
        reason = None
        for i, token in enumerate(tokens):
            if token in self.stops:
                tokens, reason = tokens[:i], "stop"
                break
        room = self.request.max_tokens - self.stats.num_completion_tokens
        if reason is None and len(tokens) >= room:
            tokens, reason = tokens[:room], "length"
        self.stats.num_completion_tokens += len(tokens)
        self.finished = reason is not None
        if self.finished:
            self.timer.close(self.stats)  # the generation is over: waiting costs nothing
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]
        return RoundResult(tokens, features, accepted, self.finished, reason, logprobs)


class DraftSession:
    """The drafter's half of one generation: append-only draft KV, one block per round."""

    def __init__(self, drafter: DFlashDrafter, embeddings: TargetEmbeddings, max_len: int) -> None:
        self.drafter, self.embeddings = drafter, embeddings
        self.device = embeddings.embed_tokens.weight.device
        self.block_size = drafter.config.block_size
        self.max_len = max_len
        self.cache = drafter.new_cache(1, max_len)
        self.cache_lens = torch.zeros(1, dtype=torch.long, device=self.device)
        self.context_len = 0

    @torch.inference_mode()
    def propose(self, features: Tensor, bonus_token: int, committed_len: int,
                spec: SpecParams) -> DraftTree:
        """features (1, C, k*H) of the C rows newly committed to the target KV (positions
        committed_len - C .. committed_len - 1). Returns a chain (linear) or a DDTree."""
        num_new = features.shape[1]
        if self.context_len + num_new != committed_len:
            raise InvalidArgumentError(
                f"draft context holds {self.context_len} tokens; {num_new} new rows do not "
                f"end at committed length {committed_len}"
            )
        if committed_len + self.block_size > self.max_len:
            raise CapacityError(f"draft KV of {self.max_len} rows is full")
        if num_new:
            positions = torch.arange(self.context_len, committed_len, device=self.device)[None]
            fused = self.drafter.fuse(features.to(self.embeddings.embed_tokens.weight.dtype))
            self.drafter.append_context(self.cache, self.cache_lens, fused, positions)
            self.cache_lens += num_new
            self.context_len = committed_len
        bonus = torch.tensor([bonus_token], dtype=torch.long, device=self.device)
        logits = self.drafter.draft(
            self.cache, self.cache_lens, committed_len + self.block_size, bonus,
            self.embeddings, self.block_size,
        )  # (1, L, V)
        if spec.mode == "linear":
            return chain_tree(logits.argmax(-1), bonus)
        return build_tree(logits, bonus, spec.budget, spec.max_topk)


def generate(
    target: TargetModel,
    drafter: DFlashDrafter | None,
    request: GenerationRequest,
    max_model_len: int | None = None,
) -> Iterator[tuple[RoundResult, GenerationStats]]:
    """The whole generation in one process; yields each round's result with live stats."""
    mode = request.spec.mode
    if mode != "ar" and drafter is None:
        raise InvalidArgumentError(f"mode {mode!r} needs a drafter")
    layers = drafter.config.target_layer_ids if drafter is not None and mode != "ar" else ()
    verifier = VerifySession(target, request, layers, max_model_len)
    result = verifier.prefill()
    yield result, verifier.stats
    drafts = None
    if drafter is not None and mode != "ar":
        drafts = DraftSession(drafter, target.embeddings, verifier.max_len)
    while not verifier.finished:
        tree = None
        if drafts is not None:
            # Timed on the verifier's own timer: its flush / close after the round pick it up.
            verifier.timer.start()
            assert result.features is not None
            tree = drafts.propose(result.features, verifier.bonus_token,
                                  verifier.committed_len, request.spec)
            verifier.timer.mark("draft")
        result = verifier.verify(tree, first_child_only=mode in ("linear", "shadow"),
                                 max_depth=drafter.config.block_size - 1 if drafter else None)
        yield result, verifier.stats
