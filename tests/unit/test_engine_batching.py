"""The batched engine core: many generations of mixed modes, budgets and sampling share
every round (one target forward per round), and each still gets exactly what it gets
alone; admission queues what does not fit; abort frees rows; shadow commits what linear
commits."""

from __future__ import annotations

import pytest
import torch

from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams, generate
from ddtree.engine.generate import build_engine
from ddtree.errors import CapacityError
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair
from ddtree.sampling import SamplingParams

SPECS = [SpecParams("ar"), SpecParams("linear"), SpecParams("tree", 16),
         SpecParams("shadow", 16), SpecParams("tree", 32, 4), SpecParams("tree", 5)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tiny-batching")
    make_tiny_pair(root, family="qwen3")
    return load_pair(root / "target", root / "drafter", torch.device("cpu"), torch.float32)


def requests(vocab: int, sampled: bool) -> list[GenerationRequest]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i, spec in enumerate(SPECS):
        prompt = torch.randint(3, vocab, (4 + 3 * i,), generator=gen).tolist()
        sampling = SamplingParams(0.9, top_k=20 if i % 3 else 0, seed=i) if sampled and i % 2 \
            else SamplingParams()
        out.append(GenerationRequest(prompt, 18 + i, sampling, spec, ignore_eos=True))
    return out


def alone(target, drafter, request: GenerationRequest) -> list[int]:
    return [t for result, _ in generate(target, drafter, request) for t in result.new_tokens]


def run_all(engine: Engine, reqs: list[GenerationRequest]) -> dict[str, list[int]]:
    for i, request in enumerate(reqs):
        engine.add_request(f"r{i}", request)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(reqs))}
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
    return tokens


@pytest.mark.parametrize("sampled", [False, True])
def test_concurrent_generations_equal_their_single_request_runs(pair, sampled: bool) -> None:
    target, drafter = pair
    reqs = requests(target.config.vocab_size, sampled)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=8, max_model_len=96))
    together = run_all(engine, reqs)
    for i, request in enumerate(reqs):
        assert together[f"r{i}"] == alone(target, drafter, request), SPECS[i]
    assert engine.slots.num_used == 0 and not engine.running


def test_one_target_forward_per_round_carries_every_running_generation(pair) -> None:
    target, drafter = pair
    reqs = requests(target.config.vocab_size, sampled=False)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=8, max_model_len=96))
    for i, request in enumerate(reqs):
        engine.add_request(f"r{i}", request)
    engine.step()  # admits all six (ONE batched prefill), then the first round carries all six
    assert engine.counters.num_rounds == 1
    assert engine.counters.num_target_forwards == 1 + 1
    assert engine.counters.batch_sizes is not None and engine.counters.batch_sizes[6] == 1
    forwards = engine.counters.num_target_forwards
    engine.step()
    assert engine.counters.num_target_forwards == forwards + 1
    assert engine.counters.batch_sizes[6] == 2


def test_requests_beyond_the_rows_wait_in_the_queue_and_all_complete(pair) -> None:
    target, drafter = pair
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=2, max_queue=10,
                                                        max_model_len=64))
    prompt = [5, 6, 7, 8]
    reqs = [GenerationRequest(prompt, 6, spec=SpecParams("tree", 8), ignore_eos=True)] * 12
    tokens = run_all(engine, reqs)
    assert all(len(t) == 6 for t in tokens.values()) and len(set(map(tuple, tokens.values()))) == 1
    assert max(i for i, c in enumerate(engine.counters.batch_sizes or []) if c) == 2
    for i in range(12):
        engine.add_request(f"again{i}", reqs[0])
    with pytest.raises(CapacityError):
        engine.add_request("one-too-many", reqs[0])
    assert engine.counters.num_rejected == 1


def test_abort_frees_the_row_at_once_and_the_others_go_on(pair) -> None:
    target, drafter = pair
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=4, max_model_len=96))
    reqs = requests(target.config.vocab_size, sampled=False)[:3]
    for i, request in enumerate(reqs):
        engine.add_request(f"r{i}", request)
    engine.add_request("waiting", reqs[0])
    tokens: dict[str, list[int]] = {"r0": [], "r1": [], "r2": [], "waiting": []}
    for request_id, result in engine.step():
        tokens[request_id] += result.new_tokens
    assert engine.slots.num_used == 4
    assert engine.abort("r1") and engine.abort("waiting") and not engine.abort("nobody")
    assert engine.slots.num_used == 2
    while engine.has_work:
        for request_id, result in engine.step():
            assert request_id in ("r0", "r2")
            tokens[request_id] += result.new_tokens
    assert engine.slots.num_used == 0
    assert tokens["r0"] == alone(target, drafter, reqs[0])
    assert tokens["r2"] == alone(target, drafter, reqs[2])


def test_shadow_commits_exactly_what_linear_commits(pair) -> None:
    target, drafter = pair
    prompt = torch.randint(3, target.config.vocab_size, (9,),
                           generator=torch.Generator().manual_seed(11)).tolist()
    runs = {}
    for spec in (SpecParams("linear"), SpecParams("shadow", 4), SpecParams("shadow", 48)):
        request = GenerationRequest(prompt, 40, spec=spec, ignore_eos=True)
        results = list(generate(target, drafter, request))
        stats = results[-1][1]
        runs[(spec.mode, spec.budget)] = ([t for r, _ in results for t in r.new_tokens],
                                          stats.acceptance_lengths, stats.num_drafted_nodes)
    linear = runs[("linear", 32)]
    for key in (("shadow", 4), ("shadow", 48)):
        assert runs[key][:2] == linear[:2], key  # tokens and per-round acceptance lengths
    # shadow verifies the chain plus more: at least the chain (7 nodes) per round
    assert runs[("shadow", 48)][2] == 48 * len(linear[1])
    assert runs[("shadow", 4)][2] == 7 * len(linear[1])


def test_pipelined_steps_give_the_same_tokens_as_synchronous_ones(pair) -> None:
    """Rounds launched before the previous one is read (rows that finished ride one more
    round, their rows are reused by queued requests) change nothing in what is served."""
    target, drafter = pair
    reqs = requests(target.config.vocab_size, sampled=True) * 2
    served = []
    for pipeline in (True, False):
        engine = build_engine(target, drafter, EngineConfig(
            max_num_seqs=3, max_model_len=96, pipeline=pipeline))
        served.append(run_all(engine, reqs))
        assert engine.slots.num_used == 0 and not engine.has_work
    assert served[0] == served[1]


def test_rows_that_their_first_token_ends_leave_while_the_others_run(pair) -> None:
    """A step's round carries the rows it admits before their first tokens are read: a
    row that its first token ends (max_tokens 1, or a stop token) rides that round, its
    output dropped, and its pool row serves the queue after; the others are unchanged."""
    target, drafter = pair
    reqs = requests(target.config.vocab_size, sampled=False)[:3]
    first = alone(target, drafter, reqs[0])[0]
    short = GenerationRequest(reqs[0].prompt_ids, 1, spec=SpecParams("tree", 16),
                              ignore_eos=True)
    stopped = GenerationRequest(reqs[0].prompt_ids, 12, spec=SpecParams("linear"),
                                stop_token_ids=(first,))
    mixed = [reqs[0], short, reqs[1], stopped, reqs[2], short, stopped]
    served = []
    for pipeline in (True, False):
        engine = build_engine(target, drafter, EngineConfig(
            max_num_seqs=3, max_model_len=96, pipeline=pipeline))
        tokens = run_all(engine, mixed)
        assert engine.slots.num_used == 0 and not engine.has_work
        served.append(tokens)
    assert served[0] == served[1]
    assert served[0]["r1"] == served[0]["r5"] == [first]
    assert served[0]["r3"] == served[0]["r6"] == []
    for i in (0, 2, 4):
        assert served[0][f"r{i}"] == alone(target, drafter, mixed[i])


@pytest.mark.parametrize("pipeline", [True, False])
def test_first_tokens_go_out_early_and_nothing_else_changes(pair, pipeline: bool) -> None:
    """step(early=...) hands each admitted row's first token to `early` as soon as it is
    read, before the step returns its round's results; every generation's tokens are
    those of steps without it, and each ends exactly once (rows that their first token
    ends included)."""
    target, drafter = pair
    reqs = requests(target.config.vocab_size, sampled=True)
    reqs += [GenerationRequest(reqs[0].prompt_ids, 1, spec=SpecParams("tree", 16),
                               ignore_eos=True)]
    plain = run_all(build_engine(target, drafter, EngineConfig(
        max_num_seqs=3, max_model_len=96, pipeline=pipeline)), reqs)
    engine = build_engine(target, drafter, EngineConfig(
        max_num_seqs=3, max_model_len=96, pipeline=pipeline))
    for i, request in enumerate(reqs):
        engine.add_request(f"r{i}", request)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(reqs))}
    finished: list[str] = []
    early_ids: list[str] = []

    def take(outputs) -> None:
        for request_id, result in outputs:
            assert request_id not in finished  # nothing after a generation's end
            tokens[request_id] += result.new_tokens
            if result.finished:
                finished.append(request_id)

    def early(outputs) -> None:
        for request_id, result in outputs:
            assert not tokens[request_id], "a first token comes first"
            assert len(result.new_tokens) == 1
            early_ids.append(request_id)
        take(outputs)

    while engine.has_work:
        returned = engine.step(early=early)
        assert not any(not tokens[rid] for rid, _ in returned)  # first tokens went early
        take(returned)
    assert tokens == plain
    assert sorted(early_ids) == sorted(tokens) and sorted(finished) == sorted(tokens)
    assert engine.slots.num_used == 0


def test_greedy_ar_rounds_take_the_short_path_and_match_the_tree_walk(pair, monkeypatch) -> None:
    """A round of greedy ar rows skips the one-node tree walk and the compaction
    (`round._verify_greedy_ar`): same tokens, same pool, same state as the generic path."""
    from ddtree.engine import round as round_module

    target, drafter = pair
    gen = torch.Generator().manual_seed(5)
    reqs = [GenerationRequest(torch.randint(3, target.config.vocab_size, (3 + 4 * i,),
                                            generator=gen).tolist(), 9 + 5 * i,
                              spec=SpecParams("ar"), ignore_eos=True) for i in range(3)]
    short_calls = []
    original = round_module._verify_greedy_ar

    def counted(*args, **kwargs):
        short_calls.append(1)
        return original(*args, **kwargs)

    def run(fast: bool) -> tuple[dict[str, list[int]], Engine]:
        with monkeypatch.context() as patch:
            patch.setattr(round_module, "_verify_greedy_ar", counted)
            engine = build_engine(target, drafter, EngineConfig(
                max_num_seqs=4, max_model_len=64, fast_ar=fast))
            return run_all(engine, reqs), engine

    fast_tokens, fast_engine = run(True)
    assert short_calls, "the greedy ar rounds did not take the short path"
    calls = len(short_calls)
    slow_tokens, slow_engine = run(False)
    assert len(short_calls) == calls, "fast_ar=False must walk the one-node trees"
    assert fast_tokens == slow_tokens
    for i, request in enumerate(reqs):
        assert fast_tokens[f"r{i}"] == alone(target, None, request)
    assert torch.equal(fast_engine.pool.k, slow_engine.pool.k)
    assert torch.equal(fast_engine.pool.v, slow_engine.pool.v)
    from ddtree.engine.state import SEED  # unseeded rows draw a random seed each run
    keep = [c for c in range(fast_engine.state.ints.shape[1]) if c != SEED]
    assert torch.equal(fast_engine.state.ints[:, keep], slow_engine.state.ints[:, keep])
