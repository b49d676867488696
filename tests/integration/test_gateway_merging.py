"""A busy gateway merges the verifier messages that arrived while it was sending the last
event (round granularity), over real gRPC to a real verifier: the same tokens and text in
fewer events; token granularity never merges; a stop string still ends the choice at its
token and aborts the generation the reader ran ahead on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ddtree.v1 import common_pb2, verifier_pb2
from gateway.generation import ChoiceDelta, ChoiceRun
from gateway.metrics import Metrics
from gateway.params import OutputOptions
from gateway.verifier_client import VerifierClient
from tests.integration.conftest import Verifier, engine_idle

MAX_TOKENS = 24
AR = common_pb2.SpecParams(mode=common_pb2.MODE_AR)  # one token per verifier message


def run_choice(verifier: Verifier, tiny_pair: Path, output: OutputOptions,
               pause_s: float, request_id: str, shared_stream: bool = True,
               ) -> tuple[list[ChoiceDelta], ChoiceRun]:
    """One choice through a real VerifierClient; the caller sleeps `pause_s` after each
    event (a gateway busy with other streams)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair / "target")

    async def main() -> tuple[list[ChoiceDelta], ChoiceRun]:
        client = VerifierClient(f"127.0.0.1:{verifier.port}", shared_stream=shared_stream)
        await client.start()
        try:
            request = verifier_pb2.GenerateRequest(
                request_id=request_id, prompt_ids=[5, 6, 7], max_tokens=MAX_TOKENS,
                ignore_eos=True, spec=AR)
            run = ChoiceRun(0, request, client, tokenizer, output, Metrics("tiny"), 0.0)
            deltas = []
            async for delta in run.deltas():
                deltas.append(delta)
                await asyncio.sleep(pause_s)
            return deltas, run
        finally:
            await client.close()

    return asyncio.run(main())


@pytest.mark.parametrize("shared_stream", [True, False])
def test_a_slow_consumer_gets_the_same_tokens_in_fewer_events(
        verifier: Verifier, tiny_pair: Path, shared_stream: bool) -> None:
    # token ids in the events (else a round whose text is held back sends no event);
    # over the shared stream the messages wait in the generation's queue, over a call of
    # its own a reader task keeps reading (`as_available`)
    output = OutputOptions(return_token_ids=True)
    fast, fast_run = run_choice(verifier, tiny_pair, output, 0.0, f"merge-fast-{shared_stream}",
                                shared_stream)
    slow, slow_run = run_choice(verifier, tiny_pair, output, 0.05,
                                f"merge-slow-{shared_stream}", shared_stream)
    tokens = fast_run.result.token_ids
    assert len(tokens) == MAX_TOKENS and slow_run.result.token_ids == tokens
    assert [t for d in slow for t in d.token_ids] == tokens
    assert [t for d in fast for t in d.token_ids] == tokens
    assert "".join(d.content for d in slow) == "".join(d.content for d in fast)
    assert len(slow_run.rounds) == MAX_TOKENS - 1  # ar: a round per token after the prefill
    # the verifier merges rounds its servicer had not sent yet; the gateway now also
    # merges the messages that came while its consumer slept (50 ms, ~ms per round)
    assert len(slow) < MAX_TOKENS // 2 < len(fast)
    assert slow[-1].finish_reason == fast[-1].finish_reason == "length"


def test_token_granularity_never_merges(verifier: Verifier, tiny_pair: Path) -> None:
    deltas, run = run_choice(verifier, tiny_pair, OutputOptions(granularity="token"), 0.02,
                             "merge-token")
    assert [d.token_ids for d in deltas] == [[t] for t in run.result.token_ids]
    assert len(deltas) == MAX_TOKENS


def test_a_stop_string_ends_the_choice_at_its_token_when_merged(
        verifier: Verifier, tiny_pair: Path) -> None:
    reference, _ = run_choice(verifier, tiny_pair, OutputOptions(), 0.0, "merge-ref")
    text = "".join(d.content for d in reference)
    stop = text[len(text) // 2:len(text) // 2 + 3]  # somewhere in the middle
    cut = text.index(stop)
    deltas, run = run_choice(verifier, tiny_pair, OutputOptions(stops=(stop,)), 0.05,
                             "merge-stop")
    assert "".join(d.content for d in deltas) == text[:cut]
    assert deltas[-1].finish_reason == "stop"
    assert len(run.result.token_ids) < MAX_TOKENS
    # the generation the reader ran ahead on was aborted: the pool is free again
    assert asyncio.run(_wait_idle(verifier)), "the verifier still runs the stopped generation"


async def _wait_idle(verifier: Verifier) -> bool:
    client = VerifierClient(f"127.0.0.1:{verifier.port}")
    await client.start()
    try:
        return await engine_idle(client, tries=100)
    finally:
        await client.close()


def test_without_merging_a_slow_consumer_gets_every_message(
        verifier: Verifier, tiny_pair: Path) -> None:
    output = OutputOptions(return_token_ids=True, merge_when_behind=False)
    deltas, run = run_choice(verifier, tiny_pair, output, 0.02, "merge-off")
    assert [t for d in deltas for t in d.token_ids] == run.result.token_ids
    assert len(deltas) > MAX_TOKENS // 2  # one per verifier message (it merges a few)
