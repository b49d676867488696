"""The gateway's verifier client over real gRPC: generations share one GenerateMany stream,
a consumer that stops early aborts its generation on that stream (which stays open for the
others), verifier errors keep their status, and the per-call path (`shared_stream` off)
serves the same tokens."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import grpc
import pytest

from ddtree.models.target import TargetModel
from ddtree.v1 import common_pb2, verifier_pb2
from gateway.verifier_client import VerifierClient
from tests.integration.conftest import Verifier, engine_idle, greedy_tokens, make_prompt

AR = common_pb2.SpecParams(mode=common_pb2.MODE_AR)


def request(request_id: str, prompt: list[int], max_tokens: int) -> verifier_pb2.GenerateRequest:
    return verifier_pb2.GenerateRequest(request_id=request_id, prompt_ids=prompt,
                                        max_tokens=max_tokens, ignore_eos=True, spec=AR)


async def tokens_of(client: VerifierClient, message: verifier_pb2.GenerateRequest) -> list[int]:
    tokens: list[int] = []
    async with aclosing(client.generate(message)) as messages:
        async for response in messages:
            tokens += response.token_ids
    return tokens


@pytest.mark.parametrize("shared_stream", [True, False])
def test_concurrent_generations_get_their_own_tokens(
        verifier: Verifier, target: TargetModel, shared_stream: bool) -> None:
    prompts = [make_prompt(target, 4 + i, seed=500 + i) for i in range(4)]

    async def main() -> list[list[int]]:
        client = VerifierClient(f"127.0.0.1:{verifier.port}", shared_stream=shared_stream)
        await client.start()
        try:
            return list(await asyncio.gather(*(
                tokens_of(client, request(f"shared-{shared_stream}-{i}", p, 10))
                for i, p in enumerate(prompts))))
        finally:
            await client.close()

    assert asyncio.run(main()) == [greedy_tokens(target, p, 10) for p in prompts]


def test_an_early_stop_aborts_on_the_stream_and_the_stream_serves_on(
        verifier: Verifier, target: TargetModel) -> None:
    prompt = make_prompt(target, 5, seed=77)

    async def main() -> tuple[bool, list[int], bool]:
        client = VerifierClient(f"127.0.0.1:{verifier.port}")
        await client.start()
        try:
            async with aclosing(client.generate(request("stopped", prompt, 1000))) as messages:
                async for _ in messages:
                    break  # the consumer leaves (a stop string, a client gone)
            stream = client._shared
            freed = await engine_idle(client)  # the abort went over the open stream
            tokens = await tokens_of(client, request("after", prompt, 6))
            return freed, tokens, client._shared is stream
        finally:
            await client.close()

    freed, tokens, same_stream = asyncio.run(main())
    assert freed, "the stopped generation still runs"
    assert tokens == greedy_tokens(target, prompt, 6) and same_stream


def test_a_refused_generation_raises_its_status_and_others_run_on(
        verifier: Verifier, target: TargetModel) -> None:
    prompt = make_prompt(target, 5, seed=78)

    async def main() -> tuple[grpc.StatusCode, str, list[int]]:
        client = VerifierClient(f"127.0.0.1:{verifier.port}")
        await client.start()
        try:
            bad = request("refused", [target.config.vocab_size + 1], 4)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await tokens_of(client, bad)
            return raised.value.code(), str(raised.value.details()), await tokens_of(
                client, request("fine", prompt, 5))
        finally:
            await client.close()

    code, details, tokens = asyncio.run(main())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "out of" in details
    assert tokens == greedy_tokens(target, prompt, 5)
