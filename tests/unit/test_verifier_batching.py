"""A generation's rounds reach its stream in batches: one message per round while the
reader keeps up, every waiting round in one message when it falls behind."""

from __future__ import annotations

import pytest

from ddtree.engine import GenerationRequest, RoundResult
from ddtree.stats import GenerationStats
from verifier_svc.scheduler import Generation, GenerationAborted
from verifier_svc.servicer import VerifierServicer


def round_result(tokens: list[int], accepted: int, nodes: int = 4,
                 finished: bool = False) -> RoundResult:
    result = RoundResult(tokens, accepted, finished, "length" if finished else None,
                         stats=GenerationStats("tree", 4))
    result.num_drafted_nodes = nodes
    result.committed_tokens = [0] * accepted
    return result


def generation() -> Generation:
    return Generation("r", GenerationRequest(prompt_ids=[1], max_tokens=8))


def test_a_reader_that_keeps_up_gets_one_round_per_message() -> None:
    gen = generation()
    batches = []
    gen.out.put(round_result([5], 0, nodes=0))
    results = gen.results(lambda: True)
    batches.append(next(results))
    gen.out.put(round_result([6, 7], 2))
    batches.append(next(results))
    gen.out.put(round_result([8], 1, finished=True))
    batches.append(next(results))
    assert [[r.new_tokens for r in b] for b in batches] == [[[5]], [[6, 7]], [[8]]]
    assert list(results) == []  # finished: the iterator ends


def test_waiting_rounds_go_out_together_and_stop_at_the_finish() -> None:
    gen = generation()
    for result in (round_result([5], 0, nodes=0), round_result([6, 7], 2),
                   round_result([8], 1, finished=True)):
        gen.out.put(result)
    (batch,) = list(gen.results(lambda: True))
    response = VerifierServicer._response(batch, batch[-1].stats)
    assert list(response.token_ids) == [5, 6, 7, 8]
    assert list(response.acceptance_lengths) == [2, 1]  # the prefill's result has none
    assert list(response.drafted_nodes) == [4, 4]
    assert response.finish_reason == "length" and response.HasField("stats")


def test_an_error_after_waiting_rounds_comes_after_them() -> None:
    gen = generation()
    gen.out.put(round_result([5], 0, nodes=0))
    gen.out.put(GenerationAborted("aborted"))
    results = gen.results(lambda: True)
    assert [r.new_tokens for r in next(results)] == [[5]]
    with pytest.raises(GenerationAborted):
        next(results)
