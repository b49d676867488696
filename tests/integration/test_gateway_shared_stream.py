"""The gateway's verifier client against a real verifier: generations share one GenerateMany
stream (over the verifier's Unix socket, "unix", or gRPC), a consumer that stops early
aborts its generation on that stream (which stays open for the others), verifier errors
keep their status, the stream is read while the gateway's event loop is busy, and the
per-call path (`shared_stream` off, "calls") serves the same tokens."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

import grpc
import pytest

from ddtree.models.target import TargetModel
from ddtree.v1 import common_pb2, verifier_pb2
from gateway.verifier_client import SharedStream, VerifierClient, _SharedBase
from tests.integration.conftest import Verifier, engine_idle, greedy_tokens, make_prompt

AR = common_pb2.SpecParams(mode=common_pb2.MODE_AR)
SHARED = ["unix", "grpc"]  # the shared stream's transports


def client_of(port: int, transport: str) -> VerifierClient:
    """A client whose generations go over `transport` (SHARED, or "calls": a Generate
    call each)."""
    return VerifierClient(f"127.0.0.1:{port}", shared_stream=transport != "calls",
                          verifier_socket=transport == "unix")


def assert_transport(client: VerifierClient, transport: str) -> None:
    """The stream the generations went over (checked while it is open)."""
    assert client.transport == ("" if transport == "calls" else transport)


def request(request_id: str, prompt: list[int], max_tokens: int) -> verifier_pb2.GenerateRequest:
    return verifier_pb2.GenerateRequest(request_id=request_id, prompt_ids=prompt,
                                        max_tokens=max_tokens, ignore_eos=True, spec=AR)


async def tokens_of(client: VerifierClient, message: verifier_pb2.GenerateRequest) -> list[int]:
    tokens: list[int] = []
    async with aclosing(client.generate(message)) as messages:
        async for response in messages:
            tokens += response.token_ids
    return tokens


@pytest.mark.parametrize("transport", [*SHARED, "calls"])
def test_concurrent_generations_get_their_own_tokens(
        verifier: Verifier, target: TargetModel, transport: str) -> None:
    prompts = [make_prompt(target, 4 + i, seed=500 + i) for i in range(4)]

    async def main() -> list[list[int]]:
        client = client_of(verifier.port, transport)
        await client.start()
        try:
            tokens = list(await asyncio.gather(*(
                tokens_of(client, request(f"shared-{transport}-{i}", p, 10))
                for i, p in enumerate(prompts))))
            assert_transport(client, transport)
            return tokens
        finally:
            await client.close()

    assert asyncio.run(main()) == [greedy_tokens(target, p, 10) for p in prompts]


@pytest.mark.parametrize("transport", SHARED)
def test_an_early_stop_aborts_on_the_stream_and_the_stream_serves_on(
        verifier: Verifier, target: TargetModel, transport: str) -> None:
    prompt = make_prompt(target, 5, seed=77)

    async def main() -> tuple[bool, list[int], bool]:
        client = client_of(verifier.port, transport)
        await client.start()
        try:
            async with aclosing(client.generate(request("stopped", prompt, 1000))) as messages:
                async for _ in messages:
                    break  # the consumer leaves (a stop string, a client gone)
            stream = client._shared
            freed = await engine_idle(client)  # the abort went over the open stream
            tokens = await tokens_of(client, request("after", prompt, 6))
            assert_transport(client, transport)
            return freed, tokens, client._shared is stream
        finally:
            await client.close()

    freed, tokens, same_stream = asyncio.run(main())
    assert freed, "the stopped generation still runs"
    assert tokens == greedy_tokens(target, prompt, 6) and same_stream


@pytest.mark.parametrize("transport", SHARED)
def test_a_refused_generation_raises_its_status_and_others_run_on(
        verifier: Verifier, target: TargetModel, transport: str) -> None:
    prompt = make_prompt(target, 5, seed=78)

    async def main() -> tuple[grpc.StatusCode, str, list[int]]:
        client = client_of(verifier.port, transport)
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


@pytest.mark.parametrize("transport", SHARED)
def test_a_generation_past_its_deadline_ends_mid_stream_and_is_aborted(
        verifier: Verifier, target: TargetModel, transport: str) -> None:
    # The deadline is one timer a generation (not a timeout around each message's wait):
    # past it, DEADLINE_EXCEEDED comes after the messages that arrived before it, the
    # generation is aborted on the verifier and the stream serves on.
    prompt = make_prompt(target, 5, seed=79)

    async def main() -> tuple[int, grpc.StatusCode, bool, list[int]]:
        client = client_of(verifier.port, transport)
        client.request_timeout_s = 0.3
        await client.start()
        got = 0
        try:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async with aclosing(client.generate(request("late", prompt, 0))) as messages:
                    async for response in messages:
                        got += len(response.token_ids)
            freed = await engine_idle(client)
            client.request_timeout_s = 600.0
            return got, raised.value.code(), freed, await tokens_of(
                client, request("in-time", prompt, 5))
        finally:
            await client.close()

    got, code, freed, tokens = asyncio.run(main())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and got > 0
    assert freed, "the generation past its deadline still runs"
    assert tokens == greedy_tokens(target, prompt, 5)


def has_read_the_end(stream: _SharedBase) -> bool:
    """The stream's thread holds a finished update the gateway's loop has not taken yet."""
    with stream._lock:
        return any(update.response.finish_reason
                   for response in stream._arrived for update in response.updates)


@pytest.mark.parametrize("transport", SHARED)
def test_a_busy_gateway_loop_takes_every_message_that_came_meanwhile_at_once(
        verifier: Verifier, target: TargetModel, transport: str) -> None:
    # ar: the verifier sends a message per round. The gateway's loop is blocked (busy with
    # other streams) after the first batch until the stream's thread has read the last
    # message; then one batch holds all of them (read on the loop, they stayed in gRPC's
    # buffers and came one a turn)
    prompt, max_tokens = make_prompt(target, 5, seed=79), 16

    async def main() -> list[list[verifier_pb2.GenerateResponse]]:
        client = client_of(verifier.port, transport)
        await client.start()
        try:
            batches = []
            async with aclosing(client.generate_batches(
                    request("blocked", prompt, max_tokens))) as messages:
                async for batch in messages:
                    batches.append(batch)
                    deadline = time.monotonic() + 60
                    while (len(batches) == 1 and client._shared is not None
                           and not has_read_the_end(client._shared)
                           and time.monotonic() < deadline):
                        time.sleep(0.005)  # blocks the loop: nothing runs on it
            return batches
        finally:
            await client.close()

    batches = asyncio.run(main())
    assert [t for batch in batches for m in batch for t in m.token_ids] == greedy_tokens(
        target, prompt, max_tokens)
    assert len(batches) <= 2 and batches[-1][-1].finish_reason == "length"
    assert sum(len(batch) for batch in batches) > 2  # the verifier sent several messages


def test_a_start_whose_write_fails_hands_the_error_to_its_queue() -> None:
    """The start is written without waiting for gRPC's confirmation (its first message may
    come back first); a write that fails must still reach the generation's queue (or, once
    the stream is known dead, raise at once), never leave the generation waiting."""
    from ddtree.service import GrpcSecurity
    from gateway.verifier_client import StreamThread
    from tests.integration.conftest import free_port

    async def main() -> grpc.aio.AioRpcError | verifier_pb2.GenerationUpdate:
        thread = await asyncio.to_thread(StreamThread, f"127.0.0.1:{free_port()}",
                                         GrpcSecurity())  # nothing listens there
        stream = SharedStream(thread, None)
        queue: asyncio.Queue = asyncio.Queue()  # not among stream.queues: only the write
        try:                                     # can put the error there
            stream.start(verifier_pb2.GenerateManyRequest(start=request("x", [1, 2], 4)),
                         queue)
            return await asyncio.wait_for(queue.get(), timeout=20)
        except grpc.aio.AioRpcError as exc:
            return exc
        finally:
            await stream.close()
            await thread.close()

    error = asyncio.run(main())
    assert isinstance(error, grpc.aio.AioRpcError)
    assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


@pytest.mark.parametrize("transport", [*SHARED, "calls"])
def test_every_message_says_when_the_verifier_read_the_request(
        verifier: Verifier, target: TargetModel, transport: str) -> None:
    """received_unix_s (the gateway's verifier_start / verifier_first_token timings): one
    value for the whole generation, after the client started it, before each message."""
    async def main() -> tuple[float, float, list[verifier_pb2.GenerateResponse]]:
        client = client_of(verifier.port, transport)
        await client.start()
        try:
            started = time.time()
            async with aclosing(client.generate(request(f"read-{transport}",
                                                        make_prompt(target, 4, seed=9), 5))
                                ) as messages:
                read = [m async for m in messages]
            return started, time.time(), read
        finally:
            await client.close()

    started, ended, messages = asyncio.run(main())
    assert len({m.received_unix_s for m in messages}) == 1
    received = messages[0].received_unix_s
    assert started <= received <= messages[0].sent_unix_s <= ended
