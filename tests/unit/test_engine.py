"""The round's top-level spec: at temperature 0 every mode serves exactly the target's own
greedy tokens (the engine's `ar` mode AND transformers' `generate`), for both families and
several budgets; stop / max-token trimming; seeded sampling is reproducible."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddtree.engine import EngineConfig, GenerationRequest, SpecParams, generate
from ddtree.engine.generate import build_engine
from ddtree.engine.rows import Row
from ddtree.engine.sessions import ClientSessions
from ddtree.errors import InvalidArgumentError
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair
from ddtree.sampling import SamplingParams
from ddtree.stats import GenerationStats
from ddtree.tree import DraftTree

FAMILIES = ("llama", "qwen3")
MAX_TOKENS = 20


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"tiny-{request.param}")
    make_tiny_pair(root, family=request.param)
    target, drafter = load_pair(root / "target", root / "drafter", torch.device("cpu"),
                                torch.float32)
    return root, target, drafter


def prompts(vocab_size: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab_size, (n,), generator=gen).tolist() for n in (5, 12, 1)]


def run(target, drafter, prompt: list[int], spec: SpecParams, max_tokens: int = MAX_TOKENS,
        **kwargs) -> tuple[list[int], str | None]:
    request = GenerationRequest(prompt, max_tokens, spec=spec, ignore_eos=True, **kwargs)
    tokens: list[int] = []
    reason = None
    for result, _ in generate(target, drafter, request):
        tokens += result.new_tokens
        reason = result.finish_reason
    return tokens, reason


def hf_greedy(target_dir: Path, prompt: list[int], max_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return out[0, len(prompt):].tolist()


SPECS = [SpecParams("linear")] + [
    SpecParams(mode, budget, topk)
    for mode in ("tree", "shadow")
    for budget, topk in ((1, None), (4, None), (16, 4), (48, None))
]


def test_every_mode_serves_the_targets_greedy_tokens(pair) -> None:
    root, target, drafter = pair
    for prompt in prompts(target.config.vocab_size):
        reference, reason = run(target, drafter, prompt, SpecParams("ar"))
        assert reason == "length" and len(reference) == MAX_TOKENS
        assert reference == hf_greedy(root / "target", prompt, MAX_TOKENS)
        for spec in SPECS:
            tokens, _ = run(target, drafter, prompt, spec)
            assert tokens == reference, f"{spec} diverged from the target's greedy decode"


def oracle_tree(greedy: list[int], bonus: int, depth: int, noise: int, vocab: int) -> DraftTree:
    """The target's own continuation as a chain, plus wrong siblings hanging off it."""
    tokens, parents, depths = [bonus], [-1], [0]
    chain_node = 0
    for d in range(depth):
        for k in range(noise):  # wrong siblings first, so the walk must skip them
            tokens.append((greedy[d] + 1 + k) % vocab)
            parents.append(chain_node)
            depths.append(d + 1)
        tokens.append(greedy[d])
        parents.append(chain_node)
        depths.append(d + 1)
        chain_node = len(tokens) - 1
    return DraftTree(tokens=torch.tensor([tokens]), parents=torch.tensor([parents]),
                     depth=torch.tensor([depths]))


def test_multi_token_acceptance_commits_and_compacts_exactly(pair) -> None:
    """Trees that contain the true continuation: long accepted paths, exact KV compaction
    (the engine's verify half, driven with a client's trees)."""
    _, target, _ = pair
    vocab = target.config.vocab_size
    prompt = prompts(vocab)[0]
    reference, _ = run(target, None, prompt, SpecParams("ar"), max_tokens=40)
    engine = build_engine(target, None, EngineConfig(max_num_seqs=1, max_model_len=128,
                                                     max_budget=32))
    sessions = ClientSessions(engine, max_budget=32)
    opened = sessions.open(prompt, SamplingParams(), return_features=False)
    out, bonus = [opened.bonus_token], opened.bonus_token
    while len(out) < 40:
        future = reference[len(out):] + [0] * 8
        tree = oracle_tree(future, bonus, 5, 2, vocab)
        outcome = sessions.verify(opened.session_id, tree.tokens[0], tree.parents[0], 0, False)
        assert len(outcome.committed_tokens) == 6 or len(out) + 5 > len(reference)
        assert outcome.committed_tokens[0] == bonus
        bonus = outcome.bonus_token
        out += outcome.committed_tokens[1:] + [bonus]
    assert out[:40] == reference
    assert sessions.close(opened.session_id) and engine.slots.num_used == 0


def test_stop_token_and_max_tokens_are_trimmed_inside_an_accepted_block(pair) -> None:
    _, target, drafter = pair
    prompt = prompts(target.config.vocab_size)[1]
    reference, _ = run(target, None, prompt, SpecParams("ar"))
    stop = reference[7]
    first = reference.index(stop)
    for spec in (SpecParams("ar"), SpecParams("tree", 16)):
        tokens, reason = run(target, drafter, prompt, spec, stop_token_ids=(stop,))
        assert (tokens, reason) == (reference[:first], "stop")
        tokens, reason = run(target, drafter, prompt, spec, max_tokens=5)
        assert (tokens, reason) == (reference[:5], "length")


def test_a_stop_token_past_max_tokens_in_one_block_ends_at_the_length() -> None:
    """Lease 16 (H200): a tree round accepted the 256th token and, after it, the stop token;
    the stop was trimmed first and max_tokens never, so 257 tokens came out where ar gave
    256 ("length"). max_tokens bounds the output before a stop token is looked for."""
    def emit(max_tokens: int, tokens: list[int], done: int = 0) -> tuple[list[int], str | None]:
        row = Row("r", GenerationRequest([1], max_tokens), 3, frozenset({9}), 0,
                  GenerationStats("tree", 3, num_completion_tokens=done))
        result = row.emit(tokens, len(tokens), None)
        assert row.finished == (result.finish_reason is not None)
        return result.new_tokens, result.finish_reason

    assert emit(3, [5, 6, 7, 8, 9]) == ([5, 6, 7], "length")  # the stop past the budget
    assert emit(4, [5, 6, 7, 8, 9]) == ([5, 6, 7, 8], "length")  # the stop just past it
    assert emit(5, [5, 6, 7, 8, 9]) == ([5, 6, 7, 8], "stop")  # the stop within it
    assert emit(9, [5, 6, 9, 8, 9]) == ([5, 6], "stop")
    assert emit(10, [5, 6, 7], done=8) == ([5, 6], "length")
    assert emit(10, [5, 6, 7]) == ([5, 6, 7], None)


def test_every_mode_ends_where_ar_ends_when_max_tokens_meets_a_stop_token(pair) -> None:
    """End to end around the boundary (the tiny pair's drafter rarely gets a round past it:
    the emit test above pins the rule itself)."""
    _, target, drafter = pair
    prompt = prompts(target.config.vocab_size)[1]
    reference, _ = run(target, None, prompt, SpecParams("ar"))
    stop = reference[7]
    first = reference.index(stop)
    for max_tokens in [n for n in (first - 1, first, first + 1) if n >= 1]:
        expected = run(target, None, prompt, SpecParams("ar"), max_tokens=max_tokens,
                       stop_token_ids=(stop,))
        assert expected[1] == ("length" if max_tokens <= first else "stop")
        for spec in (SpecParams("linear"), SpecParams("tree", 16), SpecParams("tree", 64)):
            got = run(target, drafter, prompt, spec, max_tokens=max_tokens,
                      stop_token_ids=(stop,))
            assert got == expected, (spec, max_tokens)


def test_seeded_sampling_is_reproducible_and_seed_dependent(pair) -> None:
    _, target, drafter = pair
    prompt = prompts(target.config.vocab_size)[0]
    results = {}
    for seed in (1, 1, 2):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        results.setdefault(seed, []).append(
            run(target, drafter, prompt, SpecParams("tree", 8), sampling=sampling)[0])
    assert results[1][0] == results[1][1]
    assert results[1][0] != results[2][0]


def test_stats_count_rounds_nodes_and_acceptance(pair) -> None:
    _, target, drafter = pair
    request = GenerationRequest(prompts(target.config.vocab_size)[0], MAX_TOKENS,
                                spec=SpecParams("tree", 8), ignore_eos=True)
    stats = None
    for _, stats in generate(target, drafter, request):  # noqa: B007 (keeps the last)
        pass
    assert stats is not None
    assert stats.num_drafted_nodes == 8 * stats.num_rounds
    assert sum(stats.acceptance_lengths) >= MAX_TOKENS - 1
    assert stats.num_accepted_draft_tokens == sum(stats.acceptance_lengths) - stats.num_rounds
    assert sum(stats.acceptance_histogram()) == stats.num_rounds
    assert {"prefill", "draft", "verify"} <= set(stats.stage_seconds)


@pytest.mark.parametrize("bad", [
    dict(prompt_ids=[], max_tokens=4),
    dict(prompt_ids=[1, 2], max_tokens=0),
    dict(prompt_ids=[10**9], max_tokens=4),
    dict(prompt_ids=[1], max_tokens=4, spec=SpecParams("tree", 0)),
    dict(prompt_ids=[1], max_tokens=4, spec=SpecParams("tree", 10**6)),
    dict(prompt_ids=[1], max_tokens=4, spec=SpecParams("beam")),  # type: ignore[arg-type]
    dict(prompt_ids=[1], max_tokens=4, sampling=SamplingParams(temperature=-1.0)),
    dict(prompt_ids=[1], max_tokens=10**7),
])
def test_bad_requests_raise_a_typed_error(pair, bad: dict) -> None:
    _, target, drafter = pair
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=1, max_model_len=256))
    with pytest.raises(InvalidArgumentError):
        engine.add_request("bad", GenerationRequest(**bad))
    assert not engine.has_work and engine.counters.num_rejected == 1


def test_modes_other_than_ar_need_a_drafter(pair) -> None:
    _, target, _ = pair
    with pytest.raises(InvalidArgumentError, match="needs a drafter"):
        next(generate(target, None, GenerationRequest([1, 2], 4, spec=SpecParams("tree"))))

