"""GenerateMany over real gRPC: many generations on one stream give each its own tokens,
one message carries the updates of a whole round, a bad start fails alone, abort and a
client that goes away free the rows."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import grpc

from ddtree.models.target import TargetModel
from ddtree.v1 import common_pb2, verifier_pb2
from tests.integration.conftest import RPC_TIMEOUT_S, Verifier, greedy_tokens, make_prompt

AR = common_pb2.SpecParams(mode=common_pb2.MODE_AR)
TREE = common_pb2.SpecParams(mode=common_pb2.MODE_TREE, budget=8)
LINEAR = common_pb2.SpecParams(mode=common_pb2.MODE_LINEAR)


class Requests:
    """A request iterator the test writes to while the stream runs; None half-closes."""

    def __init__(self) -> None:
        self._queue: queue.Queue[verifier_pb2.GenerateManyRequest | None] = queue.Queue()

    def start(self, request_id: str, prompt: list[int], max_tokens: int,
              spec: common_pb2.SpecParams = AR) -> None:
        self._queue.put(verifier_pb2.GenerateManyRequest(start=verifier_pb2.GenerateRequest(
            request_id=request_id, prompt_ids=prompt, max_tokens=max_tokens, ignore_eos=True,
            spec=spec)))

    def abort(self, request_id: str) -> None:
        self._queue.put(verifier_pb2.GenerateManyRequest(abort=request_id))

    def close(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[verifier_pb2.GenerateManyRequest]:
        while (item := self._queue.get()) is not None:
            yield item


def wait_idle(verifier: Verifier) -> verifier_pb2.EngineStats:
    deadline = time.monotonic() + RPC_TIMEOUT_S
    while True:
        stats = verifier.stub.GetStats(verifier_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S)
        if stats.num_running == 0 and stats.num_waiting == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_generations_on_one_stream_get_their_own_tokens_a_round_per_message(
        verifier: Verifier, target: TargetModel) -> None:
    prompts = {f"many-{i}": make_prompt(target, 5 + i, seed=300 + i) for i in range(4)}
    specs = {"many-0": AR, "many-1": TREE, "many-2": LINEAR, "many-3": AR}
    requests = Requests()
    for request_id, prompt in prompts.items():
        requests.start(request_id, prompt, 12, specs[request_id])
    requests.close()  # the stream ends once every generation has
    tokens: dict[str, list[int]] = {request_id: [] for request_id in prompts}
    finished: dict[str, str] = {}
    sizes = []
    for message in verifier.stub.GenerateMany(iter(requests), timeout=RPC_TIMEOUT_S):
        sizes.append(len(message.updates))
        for update in message.updates:
            assert update.error_code == 0, update.error_message
            assert update.request_id not in finished
            tokens[update.request_id] += update.response.token_ids
            if update.response.finish_reason:
                finished[update.request_id] = update.response.finish_reason
                assert update.response.stats.num_completion_tokens == 12
    assert finished == dict.fromkeys(prompts, "length")
    for request_id, prompt in prompts.items():
        assert tokens[request_id] == greedy_tokens(target, prompt, 12), request_id
    assert max(sizes) >= 2  # rows of one round went out in one message
    assert wait_idle(verifier).num_running == 0


def test_a_bad_start_fails_alone_and_the_stream_lives_on(
        verifier: Verifier, target: TargetModel) -> None:
    prompt = make_prompt(target, 6, seed=41)
    requests = Requests()
    requests.start("", prompt, 4)  # no request_id
    requests.start("bad-length", prompt, -1)
    requests.start("bad-vocab", [target.config.vocab_size + 5], 4)
    requests.start("good", prompt, 6)
    requests.close()
    errors, tokens = {}, []
    for message in verifier.stub.GenerateMany(iter(requests), timeout=RPC_TIMEOUT_S):
        for update in message.updates:
            if update.error_code:
                errors[update.request_id] = (grpc.StatusCode.INVALID_ARGUMENT.value[0]
                                             == update.error_code, update.error_message)
            else:
                assert update.request_id == "good"
                tokens += update.response.token_ids
    assert set(errors) == {"", "bad-length", "bad-vocab"}
    assert all(is_invalid for is_invalid, _ in errors.values()), errors
    assert "request_id" in errors[""][1] and "max_tokens" in errors["bad-length"][1]
    assert tokens == greedy_tokens(target, prompt, 6)


def test_a_start_that_reuses_a_running_id_is_refused_and_the_first_runs_on(
        verifier: Verifier, target: TargetModel) -> None:
    prompt = make_prompt(target, 5, seed=9)
    requests = Requests()
    requests.start("twice", prompt, 40)
    tokens: list[int] = []
    refused: list[str] = []
    for message in verifier.stub.GenerateMany(iter(requests), timeout=RPC_TIMEOUT_S):
        for update in message.updates:
            assert update.request_id == "twice"
            if update.error_code:
                refused.append(update.error_message)
                # the stream still tracks the first: a half-close waits for its end
                requests.close()
            else:
                if not tokens and not refused:
                    requests.start("twice", prompt, 4)  # while the first runs
                tokens += update.response.token_ids
    assert len(refused) == 1 and "already running" in refused[0]
    assert tokens == greedy_tokens(target, prompt, 40)


def test_abort_on_the_stream_ends_that_generation_only(
        verifier: Verifier, target: TargetModel) -> None:
    requests = Requests()
    requests.start("long", make_prompt(target, 5, seed=7), 400)
    requests.start("short", make_prompt(target, 5, seed=8), 8)
    ended: dict[str, str] = {}
    call = verifier.stub.GenerateMany(iter(requests), timeout=RPC_TIMEOUT_S)
    for message in call:
        for update in message.updates:
            if update.request_id == "long" and "long" not in ended and not update.error_code:
                requests.abort("long")  # after its first message
            if update.error_code:
                ended[update.request_id] = f"status {update.error_code}"
            elif update.response.finish_reason:
                ended[update.request_id] = update.response.finish_reason
        if len(ended) == 2:
            requests.close()
    assert ended["short"] == "length"
    assert ended["long"] == f"status {grpc.StatusCode.CANCELLED.value[0]}"
    assert wait_idle(verifier).num_running == 0


def test_a_client_that_goes_away_frees_its_rows(
        verifier: Verifier, target: TargetModel) -> None:
    requests = Requests()
    for i in range(3):
        requests.start(f"gone-{i}", make_prompt(target, 5, seed=60 + i), 2000)
    call = verifier.stub.GenerateMany(iter(requests), timeout=RPC_TIMEOUT_S)
    next(call)  # running
    call.cancel()
    stats = wait_idle(verifier)
    assert stats.num_running == 0 and stats.num_waiting == 0
