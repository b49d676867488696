"""The Draft stream over the drafter's Unix socket (ddtree/draft_socket.py), the drafter
link's same-host transport, against the real drafter service (the tiny pair): a verifier
takes the socket the drafter advertises and serves exactly what it serves over the gRPC
stream; a socket of another drafter, a hello without the token, a broken frame or one
stream too many is refused while the drafter keeps serving; a socket that goes away
mid-stream fails the round, and the client reconnects over gRPC."""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree import draft_socket
from ddtree.engine import Engine, EngineConfig, GenerationRequest
from ddtree.models.target import TargetModel
from ddtree.service import GrpcSecurity
from ddtree.v1 import drafter_pb2
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.local_socket import LocalDraftServer
from drafter_svc.server import DrafterServer, build_server
from tests.integration.conftest import MAX_BUDGET, greedy_tokens
from tests.integration.test_remote_ahead import requests, run_all
from verifier_svc.drafter_client import DrafterClient, DrafterUnavailable, _SocketDraftStream
from verifier_svc.remote_drafter import RemoteDrafter

TOKEN = "socket-secret-token"


def drafter_config(tiny_pair: Path, **overrides: object) -> DrafterServiceConfig:
    settings: dict[str, object] = {"host": "127.0.0.1", "port": 0, "device": "cpu",
                                   "dtype": "float32", "max_budget": MAX_BUDGET, **overrides}
    return DrafterServiceConfig(drafter=str(tiny_pair / "drafter"),
                                target=str(tiny_pair / "target"),
                                **settings)  # type: ignore[arg-type]


@pytest.fixture()
def own_drafter(tiny_pair: Path) -> Iterator[tuple[DrafterServer, int]]:
    """A drafter service of the test's own (its socket may be stopped)."""
    server, port = build_server(drafter_config(tiny_pair))
    yield server, port
    server.stop(None)


def client_of(port: int, target: TargetModel, use_socket: bool = True,
              security: GrpcSecurity | None = None) -> DrafterClient:
    client = DrafterClient(f"127.0.0.1:{port}", 20.0, 20.0, target.config, security,
                           use_socket=use_socket)
    client.connect(wait=True)
    assert client.info is not None, "the drafter service did not answer"
    return client


def round_trip(client: DrafterClient) -> drafter_pb2.DraftTrees:
    """A round without rows: the drafter answers it with no trees."""
    return client.receive(client.send(drafter_pb2.DraftRequest()), 10.0)


def wait_for(predicate: object, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def serve(engine: Engine, reqs: list[GenerationRequest]) -> tuple[dict[str, list[int]], int]:
    """-> each request's tokens, and the tree nodes its rounds verified (drafted ones)."""
    drafted: list[int] = []
    tokens = run_all(engine, reqs, on_result=lambda result: drafted.append(
        result.num_drafted_nodes))
    return tokens, sum(drafted)


@pytest.mark.parametrize("sampled", [False, True])
def test_the_socket_is_taken_and_serves_what_the_grpc_stream_serves(
        fp32_target: TargetModel, drafter_port: int, sampled: bool) -> None:
    served = {}
    for use_socket in (True, False):
        client = client_of(drafter_port, fp32_target, use_socket)
        try:
            assert client.transport == ("unix" if use_socket else "grpc")
            assert client.info is not None and client.info.local_socket
            engine = Engine(fp32_target, RemoteDrafter(client, client.info, 20.0),
                            EngineConfig(max_num_seqs=6, max_queue=8, max_budget=MAX_BUDGET))
            served[use_socket] = serve(engine, requests(fp32_target, sampled))
        finally:
            client.close()
    assert served[True] == served[False]  # the same tokens from the same trees
    assert served[True][1] > 0  # trees were drafted (not ar after a lost drafter)
    if not sampled:
        for i, request in enumerate(requests(fp32_target, False)):
            assert served[True][0][f"r{i}"] == greedy_tokens(
                fp32_target, request.prompt_ids, request.max_tokens)


def test_a_socket_of_another_drafter_or_without_the_token_is_refused(
        tiny_pair: Path, fp32_target: TargetModel, drafter_port: int) -> None:
    server, port = build_server(drafter_config(tiny_pair, grpc_token=TOKEN))
    try:
        guarded = client_of(port, fp32_target, security=GrpcSecurity(token=TOKEN))
        assert guarded.transport == "unix"  # the token goes in the hello
        assert guarded.info is not None
        path, instance_id = guarded.info.local_socket, guarded.info.instance_id
        guarded.close()
        with pytest.raises(OSError, match="refused|closed"):  # no token
            _SocketDraftStream(path, draft_socket.hello(instance_id), 5.0, 5.0)
        with pytest.raises(OSError, match="refused|closed"):  # another drafter's id
            _SocketDraftStream(path, draft_socket.hello("0" * 32, TOKEN), 5.0, 5.0)
        # the drafter still serves a proper hello after the refusals
        stream = _SocketDraftStream(path, draft_socket.hello(instance_id, TOKEN), 5.0, 5.0)
        stream.send(drafter_pb2.DraftRequest(round_id=7), awaited=True)
        assert stream.receive(7, 10.0).round_id == 7
        stream.close()
    finally:
        server.stop(None)


def test_a_broken_frame_ends_only_its_connection(
        fp32_target: TargetModel, drafter_port: int) -> None:
    client = client_of(drafter_port, fp32_target)
    assert client.info is not None
    path, instance_id = client.info.local_socket, client.info.instance_id
    try:
        for garbage in (struct.pack("<I", draft_socket.MAX_FRAME_BYTES + 1),  # too long
                        struct.pack("<I", 3) + b"\xff\xff\xff"):  # not a DraftRequest
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.connect(path)
            draft_socket.send_frame(raw, draft_socket.hello(instance_id))
            assert draft_socket.recv_frame(raw, time.monotonic() + 5.0) == draft_socket.HELLO_OK
            raw.sendall(garbage)
            with pytest.raises(draft_socket.FrameError):  # the drafter closed it
                draft_socket.recv_frame(raw, time.monotonic() + 5.0)
            raw.close()
        assert round_trip(client).committed_len == []  # the other connection lives on
    finally:
        client.close()


def test_streams_past_the_bound_are_refused(tiny_pair: Path, fp32_target: TargetModel) -> None:
    server, port = build_server(drafter_config(tiny_pair, max_streams=1))
    try:
        first = client_of(port, fp32_target)
        assert first.transport == "unix" and first.info is not None
        path, hello = first.info.local_socket, draft_socket.hello(first.info.instance_id)
        with pytest.raises(OSError, match="refused|closed"):
            _SocketDraftStream(path, hello, 5.0, 5.0)
        first.close()
        assert wait_for(lambda: _opens(path, hello))  # the slot frees when its stream ends
    finally:
        server.stop(None)


def _opens(path: str, hello: bytes) -> bool:
    try:
        _SocketDraftStream(path, hello, 5.0, 5.0).close()
    except OSError:
        return False
    return True


def test_a_socket_that_goes_away_fails_the_round_and_the_client_reconnects_over_grpc(
        own_drafter: tuple[DrafterServer, int], fp32_target: TargetModel) -> None:
    server, port = own_drafter
    client = client_of(port, fp32_target)
    try:
        assert client.transport == "unix"
        assert round_trip(client).committed_len == []
        assert server.local is not None
        server.local.stop()  # the socket's connections are shut, its file removed
        with pytest.raises(DrafterUnavailable):
            round_trip(client)
        assert wait_for(lambda: client.transport == "grpc")  # reconnected, without the socket
        assert round_trip(client).committed_len == []
    finally:
        client.close()


def test_the_socket_file_of_a_dead_drafter_is_replaced_and_a_live_one_kept(
        own_drafter: tuple[DrafterServer, int]) -> None:
    server, _ = own_drafter
    assert server.local is not None
    servicer = server.local.servicer
    path = os.path.join(tempfile.mkdtemp(prefix="ddt"), "d.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)  # bound, never listening: what a killed drafter leaves
    dead.close()
    first = LocalDraftServer(path, servicer, "a" * 32, "", 2)
    first.start()
    second = LocalDraftServer(path, servicer, "b" * 32, "", 2)
    with pytest.raises(OSError, match="another process listens"):
        second.start()
    first.stop()
    assert not os.path.exists(path)
    Path(path).write_text("not a socket")
    with pytest.raises(OSError, match="not a socket"):
        second.start()
    with pytest.raises(ValueError, match="longer than"):
        LocalDraftServer("/" + "s" * 120, servicer, "c" * 32, "", 2)


def test_a_drafter_whose_socket_cannot_be_bound_serves_grpc_alone(
        tiny_pair: Path, fp32_target: TargetModel, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # `auto` would be longer than an address holds
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    server, port = build_server(drafter_config(tiny_pair))
    try:
        assert server.local is None
        client = client_of(port, fp32_target)
        assert client.info is not None and client.info.local_socket == ""
        assert client.transport == "grpc"
        assert round_trip(client).committed_len == []
        client.close()
    finally:
        server.stop(None)
