"""OpenSession sessions that their client abandons expire after the idle timeout: their KV
row is free again, the expiry is counted, and the session id answers NOT_FOUND."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.integration.conftest import RPC_TIMEOUT_S
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.server import build_server

IDLE_TIMEOUT_S = 1.5


@pytest.fixture()
def stub(tiny_pair: Path) -> Iterator[verifier_pb2_grpc.VerifierStub]:
    config = VerifierServiceConfig(
        target=str(tiny_pair / "target"), host="127.0.0.1", port=0, device="cpu",
        dtype="float32", mode="ar", max_num_seqs=2, max_queue=0, max_budget=16, budget=16,
        session_idle_timeout_s=IDLE_TIMEOUT_S)
    server, port = build_server(config)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
        yield verifier_pb2_grpc.VerifierStub(channel)
    server.stop(None)


def stats(stub: verifier_pb2_grpc.VerifierStub) -> verifier_pb2.EngineStats:
    return stub.GetStats(verifier_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S)


def test_abandoned_sessions_expire_and_free_their_rows(
        stub: verifier_pb2_grpc.VerifierStub) -> None:
    opened = [stub.OpenSession(verifier_pb2.OpenSessionRequest(prompt_ids=[5, 6, 7]),
                               timeout=RPC_TIMEOUT_S) for _ in range(2)]
    assert stats(stub).num_open_sessions == 2
    with pytest.raises(grpc.RpcError) as full:  # both rows held
        stub.OpenSession(verifier_pb2.OpenSessionRequest(prompt_ids=[5]), timeout=RPC_TIMEOUT_S)
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    deadline = time.monotonic() + 30
    while stats(stub).num_open_sessions:
        assert time.monotonic() < deadline, "the sessions never expired"
        time.sleep(0.1)  # polling the engine's counters
    assert stats(stub).num_expired_sessions == 2
    tree = common_pb2.DraftTree(tokens=[opened[0].bonus_token], parents=[-1])
    with pytest.raises(grpc.RpcError) as gone:
        stub.Verify(verifier_pb2.VerifyRequest(session_id=opened[0].session_id, tree=tree),
                    timeout=RPC_TIMEOUT_S)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    # A session in use does not expire: each Verify renews it.
    live = stub.OpenSession(verifier_pb2.OpenSessionRequest(prompt_ids=[5, 6, 7]),
                            timeout=RPC_TIMEOUT_S)
    bonus = live.bonus_token
    for _ in range(6):
        time.sleep(IDLE_TIMEOUT_S / 3)
        reply = stub.Verify(verifier_pb2.VerifyRequest(
            session_id=live.session_id, tree=common_pb2.DraftTree(tokens=[bonus], parents=[-1])),
            timeout=RPC_TIMEOUT_S)
        bonus = reply.bonus_token
    assert stats(stub).num_open_sessions == 1
