"""The shared draft link (verifier_svc/shared_drafter.py, drafter_svc/shared_round.py)
against the real drafter service (the tiny pair, on the CPU: the tables travel as shared
memory): the engine shares its round state, the drafter runs the draft half over it, and
every generation serves exactly what the in-process drafter serves (the same trees: the
same code over the same state), the target's greedy tokens at T = 0."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch

from ddtree import draft_socket
from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.drafting import LocalDrafter
from ddtree.engine.generate import build_engine as build_local
from ddtree.models.drafter import load_drafter
from ddtree.models.target import TargetModel
from drafter_svc.server import build_server
from tests.integration.conftest import MAX_BUDGET, greedy_tokens, make_prompt
from tests.integration.test_drafter_socket import client_of, drafter_config, serve, wait_for
from tests.integration.test_remote_ahead import requests
from verifier_svc import shared_drafter
from verifier_svc.config import parse_config as verifier_config
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import RemoteDrafter
from verifier_svc.server import _link_kind, _remote_engine
from verifier_svc.shared_drafter import SharedDrafter

CONFIG = EngineConfig(max_num_seqs=6, max_queue=8, max_budget=MAX_BUDGET)


def linked_engine(target: TargetModel, client: DrafterClient) -> tuple[Engine, SharedDrafter]:
    """An engine whose drafting is the shared link to the client's drafter (attached)."""
    assert client.info is not None
    shared = SharedDrafter(client, client.info, 20.0, 20.0)
    engine = Engine(target, shared, CONFIG)
    assert shared.linked
    return engine, shared


def assert_greedy(target: TargetModel, tokens: dict[str, list[int]]) -> None:
    for i, request in enumerate(requests(target, False)):
        assert tokens[f"r{i}"] == greedy_tokens(target, request.prompt_ids, request.max_tokens)


@pytest.mark.parametrize("sampled", [False, True])
def test_the_shared_link_serves_what_the_in_process_drafter_serves(
        tiny_pair: Path, fp32_target: TargetModel, drafter_port: int, sampled: bool) -> None:
    client = client_of(drafter_port, fp32_target)
    try:
        engine, _ = linked_engine(fp32_target, client)
        served = serve(engine, requests(fp32_target, sampled))
    finally:
        client.close()
    drafter = load_drafter(tiny_pair / "drafter", fp32_target.config,
                           fp32_target.embeddings.embed_tokens.weight.device,
                           fp32_target.embeddings.embed_tokens.weight.dtype).eval()
    local = build_local(fp32_target, drafter, CONFIG)
    assert serve(local, requests(fp32_target, sampled)) == served
    assert served[1] > 0
    if not sampled:
        assert_greedy(fp32_target, served[0])


def test_a_drafter_that_goes_away_leaves_its_rows_in_ar_and_the_link_attaches_again(
        tiny_pair: Path, fp32_target: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_drafter, "REATTACH_INTERVAL_S", 0.0)
    server, port = build_server(drafter_config(tiny_pair))
    client = client_of(port, fp32_target)
    try:
        engine, shared = linked_engine(fp32_target, client)
        reqs = [GenerationRequest(make_prompt(fp32_target, 5 + i, 60 + i), 30,
                                  spec=SpecParams("tree", 8), ignore_eos=True)
                for i in range(3)]
        for i, request in enumerate(reqs):
            engine.add_request(f"r{i}", request)
        tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(reqs))}
        drafted_before = 0
        for _ in range(3):
            for request_id, result in engine.step():
                tokens[request_id] += result.new_tokens
                drafted_before += result.num_drafted_nodes
        assert drafted_before > 0
        server.stop(None)  # the link's connection is shut: its next round fails
        while engine.has_work:
            for request_id, result in engine.step():
                tokens[request_id] += result.new_tokens
        assert not shared.linked
        for i, request in enumerate(reqs):  # finished in ar, still the greedy tokens
            assert tokens[f"r{i}"] == greedy_tokens(fp32_target, request.prompt_ids, 30)
        first = shared._instance
        server, _ = build_server(drafter_config(tiny_pair, port=port))  # back, anew
        # attached again in the background, to the new drafter
        assert wait_for(lambda: shared.available and shared._instance != first)
        served = serve(engine, requests(fp32_target, False))
        assert served[1] > 0  # and drafting
        assert_greedy(fp32_target, served[0])
    finally:
        client.close()
        server.stop(None)


def _raw_link(client: DrafterClient) -> socket.socket:
    assert client.info is not None
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(client.info.local_socket)
    draft_socket.send_frame(raw, draft_socket.hello(client.info.instance_id, "",
                                                    draft_socket.SHARED_PREFIX))
    assert draft_socket.recv_frame(raw, time.monotonic() + 5.0) == draft_socket.HELLO_OK
    return raw


def _answer(raw: socket.socket, frame: bytes) -> bytes:
    draft_socket.send_frame(raw, frame)
    return draft_socket.recv_frame(raw, time.monotonic() + 10.0)


def test_the_drafter_refuses_a_link_it_cannot_serve_and_serves_the_next(
        fp32_target: TargetModel, drafter_port: int) -> None:
    client = client_of(drafter_port, fp32_target)
    try:
        assert client.info is not None
        attach = {"op": "attach", "device_uuid": "GPU-of-another-host", "num_slots": 2,
                  "max_model_len": 64, "block_size": client.info.block_size,
                  "target_layer_ids": list(client.info.target_layer_ids), "tensors": {},
                  "events": {"ready": None, "done": None}, "num_fds": 0}
        cases = {
            "another device": json.dumps(attach).encode(),
            "too many rows": json.dumps({**attach, "device_uuid": "cpu",
                                         "num_slots": 10_000}).encode(),
            "a draft before attaching": draft_socket.SHARED_DRAFT.pack(b"D", 1, 4),
            "not JSON": b"{not json",
            "an unknown op": json.dumps({"op": "dance"}).encode(),
            "a tensor without its descriptor": json.dumps({
                **attach, "device_uuid": "cpu", "tensors": {"ints": {
                    "kind": "cpu", "shape": [3, 9], "stride": [9, 1], "offset": 0,
                    "dtype": "torch.int64", "fd_index": 0, "storage_size": 216}}}).encode(),
        }
        for name, frame in cases.items():
            raw = _raw_link(client)
            answer = json.loads(_answer(raw, frame))
            assert answer["error"], name
            with pytest.raises(draft_socket.FrameError):  # the drafter ended that link
                draft_socket.recv_frame(raw, time.monotonic() + 5.0)
            raw.close()
        linked_engine(fp32_target, client)  # and serves a proper one
    finally:
        client.close()


def test_the_verifier_takes_the_shared_link_where_the_drafter_offers_it(
        tiny_pair: Path, fp32_target: TargetModel, drafter_port: int) -> None:
    off, off_port = build_server(drafter_config(tiny_pair, shared_draft=False))
    try:
        for port, flags, kind in ((drafter_port, [], "shared"),
                                  (drafter_port, ["--no-drafter-shared"], "unix"),
                                  (off_port, [], "unix")):
            config = verifier_config(
                ["--target", str(tiny_pair / "target"), "--drafter-addr",
                 f"127.0.0.1:{port}", "--device", "cpu", "--dtype", "float32",
                 "--max-num-seqs", "4", *flags], {})
            client = client_of(port, fp32_target)
            try:
                engine = _remote_engine(config, fp32_target, client)
                assert _link_kind(engine.drafting, client) == kind
                assert isinstance(engine.drafting, SharedDrafter if kind == "shared"
                                  else RemoteDrafter)
            finally:
                client.close()
    finally:
        off.stop(None)


def test_a_context_started_in_parts_is_the_context_started_at_once(
        tiny_pair: Path, fp32_target: TargetModel) -> None:
    """A prompt longer than the link's staging rows reaches the drafter in parts
    (`LocalDrafter.start` at an offset): the same context as one start."""
    weight = fp32_target.embeddings.embed_tokens.weight
    drafter = load_drafter(tiny_pair / "drafter", fp32_target.config, weight.device,
                           weight.dtype).eval()
    whole = LocalDrafter(drafter, fp32_target.embeddings, 2, 64)
    parts = whole.sibling(2, 64, context_graphs=False)
    width = len(whole.target_layer_ids) * fp32_target.config.hidden_size
    features = torch.randn(23, width, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        whole.start(1, "r", features)
        parts.start(1, "r", features[:10])
        parts.start(1, "r", features[10:], 10)
    assert parts.pool.k.abs().sum() > 0
    assert torch.allclose(parts.pool.k, whole.pool.k, atol=1e-6)
    assert torch.allclose(parts.pool.v, whole.pool.v, atol=1e-6)
