"""GenerateMany over the verifier's Unix socket (verifier_svc/local_socket.py): the hello
names the verifier process, a gateway that goes away frees its generations' rows, bad
frames end only their own connection, and a gateway whose socket is gone falls back to
the gRPC stream."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from contextlib import aclosing
from pathlib import Path

import grpc
import pytest

from ddtree import draft_socket
from ddtree.models.target import TargetModel
from ddtree.v1 import verifier_pb2
from gateway.verifier_client import VerifierClient
from tests.integration.conftest import (
    MAX_BUDGET,
    Verifier,
    engine_idle,
    greedy_tokens,
    make_prompt,
)
from tests.integration.test_gateway_shared_stream import request, tokens_of
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.server import build_server


def model_info(verifier: Verifier) -> verifier_pb2.ModelInfo:
    info = verifier.stub.GetModelInfo(verifier_pb2.ModelInfoRequest(), timeout=10)
    assert isinstance(info, verifier_pb2.ModelInfo)
    return info


def connect(info: verifier_pb2.ModelInfo) -> socket.socket:
    return draft_socket.connect(
        info.local_socket, draft_socket.hello(info.instance_id, "", draft_socket.MANY_PREFIX),
        5.0)


def test_the_verifier_advertises_its_socket_and_checks_the_hello(verifier: Verifier) -> None:
    info = model_info(verifier)
    assert info.local_socket.endswith(f"ddtree-verifier-{verifier.port}.sock")
    assert len(info.instance_id) == 32
    with pytest.raises(OSError, match="refused|closed"):  # another process's id
        draft_socket.connect(info.local_socket, draft_socket.hello(
            "0" * 32, "", draft_socket.MANY_PREFIX), 5.0)
    with pytest.raises(OSError, match="refused|closed"):  # the drafter link's hello
        draft_socket.connect(info.local_socket, draft_socket.hello(info.instance_id), 5.0)
    connect(info).close()


def test_a_generation_over_the_raw_socket_then_the_gateway_goes_away(
        verifier: Verifier, target: TargetModel) -> None:
    """A client speaking the framing by hand gets its greedy tokens; one that closes its
    connection mid-generation has it cancelled (its KV row is freed)."""
    prompt = make_prompt(target, 5, seed=91)
    sock = connect(model_info(verifier))
    tokens: list[int] = []
    with sock:
        start = verifier_pb2.GenerateManyRequest(start=request("raw", prompt, 6))
        draft_socket.send_frame(sock, start.SerializeToString())
        while True:
            frame = draft_socket.recv_frame(sock, time.monotonic() + 30)
            update = verifier_pb2.GenerateManyResponse.FromString(frame).updates[0]
            assert update.request_id == "raw" and not update.error_code
            tokens += update.response.token_ids
            if update.response.finish_reason:
                break
        long = verifier_pb2.GenerateManyRequest(start=request("left", prompt, 900))
        draft_socket.send_frame(sock, long.SerializeToString())
        running = verifier_pb2.GenerateManyResponse.FromString(
            draft_socket.recv_frame(sock, time.monotonic() + 30)).updates[0]
        assert running.request_id == "left" and not running.error_code
        assert not running.response.finish_reason
    assert tokens == greedy_tokens(target, prompt, 6)

    async def idle() -> bool:
        client = VerifierClient(f"127.0.0.1:{verifier.port}", shared_stream=False)
        await client.start()
        try:
            return await engine_idle(client)
        finally:
            await client.close()

    assert asyncio.run(idle()), "the abandoned generation still runs"


def test_bad_frames_end_only_their_connection(verifier: Verifier, target: TargetModel) -> None:
    info = model_info(verifier)
    for garbage in (struct.pack("<I", draft_socket.MAX_FRAME_BYTES + 1),  # too long
                    struct.pack("<I", 3) + b"\xff\xff\xff"):  # not a message
        with connect(info) as sock:
            sock.sendall(garbage)
            with pytest.raises(draft_socket.FrameError):  # the verifier closed it
                draft_socket.recv_frame(sock, time.monotonic() + 10)
    prompt = make_prompt(target, 4, seed=92)

    async def main() -> list[int]:
        client = VerifierClient(f"127.0.0.1:{verifier.port}")
        await client.start()
        try:
            tokens = await tokens_of(client, request("after-garbage", prompt, 5))
            assert client.transport == "unix"
            return tokens
        finally:
            await client.close()

    assert asyncio.run(main()) == greedy_tokens(target, prompt, 5)


def test_a_closed_socket_ends_its_generations_and_the_gateway_falls_back_to_grpc(
        tiny_pair: Path, drafter_port: int, target: TargetModel) -> None:
    """The socket's listener stops mid-generation: the generation ends UNAVAILABLE (its
    tokens already reached the client: never replayed), and the next one opens the
    stream anew over gRPC (the advertised socket no longer answers)."""
    server, port = build_server(VerifierServiceConfig(
        target=str(tiny_pair / "target"), drafter_addr=f"127.0.0.1:{drafter_port}",
        port=0, device="cpu", dtype="float32", mode="tree", budget=8,
        max_budget=MAX_BUDGET))
    prompt = make_prompt(target, 5, seed=93)

    async def main() -> tuple[grpc.StatusCode, list[int], str]:
        client = VerifierClient(f"127.0.0.1:{port}")
        await client.start()
        try:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async with aclosing(client.generate(request("cut", prompt, 900))) as messages:
                    async for _ in messages:
                        assert client.transport == "unix"
                        assert server.local is not None
                        server.local.stop()  # the connection is shut down
            tokens = await tokens_of(client, request("after-cut", prompt, 5))
            return raised.value.code(), tokens, client.transport
        finally:
            await client.close()

    try:
        code, tokens, transport = asyncio.run(main())
    finally:
        server.stop(None)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert tokens == greedy_tokens(target, prompt, 5) and transport == "grpc"


def test_a_graceful_stop_lets_the_sockets_generations_finish(
        tiny_pair: Path, drafter_port: int, target: TargetModel) -> None:
    """The verifier stopping with a grace: its socket takes no new connection (the file
    is gone at once), and a generation running on an open stream finishes within the
    grace, every token there, as a gRPC GenerateMany call's would."""
    import threading

    server, port = build_server(VerifierServiceConfig(
        target=str(tiny_pair / "target"), drafter_addr=f"127.0.0.1:{drafter_port}",
        port=0, device="cpu", dtype="float32", mode="ar", max_budget=MAX_BUDGET))
    prompt, max_tokens = make_prompt(target, 5, seed=94), 300
    assert server.local is not None
    path = server.local.path

    async def main() -> tuple[list[int], str, bool]:
        client = VerifierClient(f"127.0.0.1:{port}")
        await client.start()
        stopper = None
        try:
            tokens, finish = [], ""
            async with aclosing(client.generate(request("drained", prompt, max_tokens))
                                ) as messages:
                async for message in messages:
                    tokens += message.token_ids
                    finish = message.finish_reason
                    if stopper is None:
                        assert client.transport == "unix"
                        stopper = threading.Thread(target=server.stop, args=(30.0,))
                        stopper.start()
                        while os.path.exists(path):  # stop_accepting ran
                            await asyncio.sleep(0.01)
            return tokens, finish, bool(stopper.is_alive()) if stopper else False
        finally:
            await client.close()
            if stopper is not None:
                await asyncio.to_thread(stopper.join, 60)

    tokens, finish, _ = asyncio.run(main())
    assert finish == "length" and tokens == greedy_tokens(target, prompt, max_tokens)
    assert not os.path.exists(path)
