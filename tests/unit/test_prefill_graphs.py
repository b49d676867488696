"""Static-shape prefill (the shape a CUDA graph replays): prompts padded to a token bucket
into the scratch row serve exactly what the exact-shape prefill serves, in every mode and
with seeded sampling, and the LM head reads each prompt's last token."""

from __future__ import annotations

import pytest
import torch

from ddtree.engine import EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.generate import build_engine
from ddtree.engine.graphs import GraphRunner
from ddtree.engine.prefill_graphs import PrefillBuffers, PrefillGraphs
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair
from ddtree.sampling import SamplingParams
from tests.unit.test_engine_batching import SPECS, requests, run_all


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tiny-static-prefill")
    make_tiny_pair(root, family="llama")
    return load_pair(root / "target", root / "drafter", torch.device("cpu"), torch.float32)


def test_padding_tokens_write_the_scratch_row_and_the_lm_head_reads_each_last_token() -> None:
    buffers = PrefillBuffers(16, 4, 16, torch.device("cpu"))
    buffers.fill([[7, 8, 9], [4], [5, 6]], [2, 0, 5], scratch=9)
    meta = buffers.meta
    assert buffers.ids.tolist()[:6] == [7, 8, 9, 4, 5, 6] and set(buffers.ids.tolist()[6:]) == {0}
    assert meta.positions.tolist()[:6] == [0, 1, 2, 0, 0, 1]
    assert meta.write_slot.tolist() == [2, 2, 2, 0, 5, 5] + [9] * 10
    assert meta.prefix_len.tolist() == [1, 2, 3, 1, 1, 2] + [1] * 10
    assert buffers.logit_rows.tolist() == [2, 3, 5, 0]
    buffers.fill([[1, 2]], [3], scratch=9)  # a refill leaves nothing of the last step
    assert meta.write_slot.tolist() == [3, 3] + [9] * 14
    assert buffers.logit_rows.tolist() == [1, 0, 0, 0]


def test_token_buckets_are_powers_of_two_up_to_the_step_budget() -> None:
    graphs = GraphRunner(torch.device("cpu"), enabled=False)
    static = PrefillGraphs(graphs, 4, 256, 4, 100, torch.device("cpu"))
    assert static.buckets == (16, 32, 64, 128)
    assert static.fits(128, 4) and not static.fits(129, 1) and not static.fits(10, 5)
    assert PrefillGraphs(graphs, 4, 256, 4, 1 << 20, torch.device("cpu")).buckets[-1] == 2048


@pytest.mark.parametrize("sampled", [False, True])
def test_static_prefill_serves_what_the_exact_shape_prefill_serves(pair, sampled: bool) -> None:
    target, drafter = pair
    reqs = requests(target.config.vocab_size, sampled)
    served = {}
    for static in (True, False):
        engine = build_engine(target, drafter, EngineConfig(
            max_num_seqs=8, max_model_len=96, static_prefill=static))
        assert (engine._static_prefill is not None) == static
        served[static] = run_all(engine, reqs)
        assert engine.slots.num_used == 0
    assert served[True] == served[False], SPECS


def test_requests_arriving_between_rounds_get_static_prefills_too(pair) -> None:
    """Rows admitted one at a time while others decode (each its own padded prefill)."""
    target, drafter = pair
    prompt = [5, 6, 7, 8, 9]
    served = {}
    for static in (True, False):
        engine = build_engine(target, drafter, EngineConfig(
            max_num_seqs=4, max_model_len=96, static_prefill=static))
        tokens: dict[str, list[int]] = {}
        for i, spec in enumerate([SpecParams("tree", 8), SpecParams("ar"), SpecParams("linear")]):
            engine.add_request(f"r{i}", GenerationRequest(
                prompt[: 2 + i], 12, SamplingParams(0.8, seed=i), spec, ignore_eos=True))
            for request_id, result in engine.step():
                tokens.setdefault(request_id, []).extend(result.new_tokens)
        while engine.has_work:
            for request_id, result in engine.step():
                tokens.setdefault(request_id, []).extend(result.new_tokens)
        served[static] = tokens
    assert served[True] == served[False]
    assert all(len(t) == 12 for t in served[True].values())
