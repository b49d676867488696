"""The shared draft link (verifier_svc/shared_drafter.py, drafter_svc/shared_round.py)
against the real drafter service (the tiny pair, on the CPU: the tables travel as shared
memory): the engine shares its round state, the drafter runs the draft half over it, and
every generation serves exactly what the in-process drafter serves (the same trees: the
same code over the same state), the target's greedy tokens at T = 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree.engine import Engine, EngineConfig
from ddtree.engine.generate import build_engine as build_local
from ddtree.models.drafter import load_drafter
from ddtree.models.target import TargetModel
from tests.integration.conftest import MAX_BUDGET, greedy_tokens
from tests.integration.test_drafter_socket import client_of, serve
from tests.integration.test_remote_ahead import requests
from verifier_svc.shared_drafter import SharedDrafter

CONFIG = EngineConfig(max_num_seqs=6, max_queue=8, max_budget=MAX_BUDGET)


@pytest.mark.parametrize("sampled", [False, True])
def test_the_shared_link_serves_what_the_in_process_drafter_serves(
        tiny_pair: Path, fp32_target: TargetModel, drafter_port: int, sampled: bool) -> None:
    client = client_of(drafter_port, fp32_target)
    try:
        assert client.info is not None
        shared = SharedDrafter(client, client.info, 20.0, 20.0)
        engine = Engine(fp32_target, shared, CONFIG)
        assert shared.linked
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
        for i, request in enumerate(requests(fp32_target, False)):
            assert served[0][f"r{i}"] == greedy_tokens(
                fp32_target, request.prompt_ids, request.max_tokens)
