"""OpenAI and vLLM request options that evaluation and benchmark clients send, over real
HTTP in front of a real verifier: `echo` with logprobs (and `max_tokens: 0`) scores a
prompt with the target's own logprobs, `stream_options.continuous_usage_stats` puts the
usage on every chunk, and the harmless vLLM extensions are honoured or refused clearly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.models.target import TargetModel

PROMPT = "The quick brown fox jumps over"


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": "tiny", **body}, timeout=60)


def target_prompt_logprobs(target: TargetModel, prompt_ids: list[int]) -> list[float]:
    """The target's logprob of each prompt token after the first (in process)."""
    request = GenerationRequest(prompt_ids, 1, spec=SpecParams("ar"), top_logprobs=0,
                                prompt_logprobs=True)
    first, _ = next(iter(generate(target, None, request)))
    assert first.prompt_logprobs is not None
    return [logprob for _, logprob, _ in first.prompt_logprobs]


def test_echo_with_max_tokens_0_scores_the_prompt_only(gateway: str, target: TargetModel) -> None:
    reply = post(gateway, "/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 1,
                                              "max_tokens": 0, "temperature": 0,
                                              "return_token_ids": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    choice = body["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0 and choice["token_ids"] == []
    prompt_ids = choice["prompt_token_ids"]
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt_ids)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = target_prompt_logprobs(target, prompt_ids)
    assert logprobs["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    assert all(len(top) == 1 for top in logprobs["top_logprobs"][1:])


def test_echo_puts_the_prompt_before_the_completion(gateway: str) -> None:
    plain = post(gateway, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4,
                                              "temperature": 0}).json()
    echoed = post(gateway, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "echo": True,
                                               "temperature": 0, "logprobs": 0}).json()
    assert echoed["choices"][0]["text"] == PROMPT + plain["choices"][0]["text"]
    assert echoed["usage"] == plain["usage"]
    num_prompt = plain["usage"]["prompt_tokens"]
    assert len(echoed["choices"][0]["logprobs"]["tokens"]) == num_prompt + 4
    streamed = httpx.post(f"{gateway}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "echo": True, "temperature": 0,
        "stream": True})
    texts = [json.loads(line[6:])["choices"][0]["text"]
             for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert texts[0].startswith(PROMPT) and "".join(texts) == echoed["choices"][0]["text"]


def test_max_tokens_0_without_echo_is_400(gateway: str) -> None:
    reply = post(gateway, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"
    reply = post(gateway, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "echo": True})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "echo"


def usages(reply: httpx.Response) -> list[dict[str, Any] | None]:
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines()
              if line.startswith("data: {")]
    return [chunk.get("usage") for chunk in chunks]


def test_continuous_usage_stats_put_the_usage_on_every_chunk(gateway: str) -> None:
    body = {"messages": [{"role": "user", "content": "Count"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "ddtree": {"stream_granularity": "token"},
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    found = usages(post(gateway, "/v1/chat/completions", body))
    assert all(u is not None for u in found)
    completion = [u["completion_tokens"] for u in found if u is not None]
    assert completion == sorted(completion) and completion[-1] == 8
    assert len({u["prompt_tokens"] for u in found if u is not None}) == 1
    # As vLLM: without include_usage there is no usage at all.
    body["stream_options"] = {"continuous_usage_stats": True}
    assert all(u is None for u in usages(post(gateway, "/v1/chat/completions", body)))


def test_vllm_extensions_honoured_or_refused(gateway: str, tiny_pair: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_pair / "target")
    with_bos = post(gateway, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1,
                                                 "return_token_ids": True}).json()
    without = post(gateway, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1,
                                                "return_token_ids": True,
                                                "add_special_tokens": False}).json()
    ids, bare = (r["choices"][0]["prompt_token_ids"] for r in (with_bos, without))
    assert ids == tokenizer(PROMPT, add_special_tokens=True)["input_ids"]
    assert bare == tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert post(gateway, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1,
                                             "spaces_between_special_tokens": True}
                ).status_code == 200
    for fields, param in (({"spaces_between_special_tokens": False},
                           "spaces_between_special_tokens"),
                          ({"repetition_penalty": 1.2}, "repetition_penalty"),
                          ({"min_tokens": 3}, "min_tokens")):
        reply = post(gateway, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, **fields})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param
