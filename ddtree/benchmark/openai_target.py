"""Any OpenAI-compatible server as a benchmark target: streaming `/v1/chat/completions`
(or `/v1/completions` for raw prompts) with `stream_options.include_usage`, over aiohttp
(the client of vLLM's and SGLang's serving benchmarks). httpx, which this used before,
cost the client 68-127 us a Server-Sent Event at one event a millisecond a stream (an
anyio cancel scope and h11 in Python around every read; `scripts/sse_client_capacity.py`),
so at 8 ar streams the client itself used ~0.7 of a core and its loop held first tokens
back: a benchmark's client should not be what it measures.

Against our gateway a `SpecPoint` other than `server` rides in the per-request `ddtree`
extension (`{"mode", "budget", "max_topk"}`) and the usage chunk's `ddtree_stats` give the
acceptance histogram; a foreign server gets no extension and its rows show acceptance as
unknown.
"""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from ddtree.benchmark.config import SERVER_MODE, TREE_MODES, RequestSettings, SpecPoint
from ddtree.benchmark.sample import BenchPrompt, RequestSample
from ddtree.benchmark.target import RunBounds
from ddtree.errors import InvalidArgumentError

# An event's line may be this long (a chunk with many top logprobs); aiohttp's default
# buffer refuses lines past 128 KiB.
READ_BUFFER_BYTES = 1 << 22


def request_body(model: str, prompt: BenchPrompt, spec: SpecPoint, settings: RequestSettings,
                 extra_body: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "max_tokens": settings.max_tokens, "temperature": settings.temperature,
        "stream": True, "stream_options": {"include_usage": True},
    }
    if settings.is_chat:
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    if settings.top_p != 1.0:
        body["top_p"] = settings.top_p
    if settings.top_k:
        body["top_k"] = settings.top_k
    seed = settings.seed_for(prompt.index)
    if seed is not None:
        body["seed"] = seed
    if settings.ignore_eos:
        body["ignore_eos"] = True  # vLLM / SGLang / ddtree extension
    if spec.mode != SERVER_MODE:
        options: dict[str, Any] = {"mode": spec.mode}
        if spec.budget is not None:
            options["budget"] = spec.budget
        if spec.max_topk is not None:
            options["max_topk"] = spec.max_topk
        body["ddtree"] = options
    for key, value in extra_body.items():  # objects merge (e.g. more `ddtree` options)
        both = isinstance(value, dict) and isinstance(body.get(key), dict)
        body[key] = body[key] | value if both else value
    return body


def chunk_text(chunk: dict[str, Any], is_chat: bool) -> str:
    """The content a streamed chunk carries (reasoning content counts: it is output)."""
    texts = []
    for choice in chunk.get("choices") or []:
        if is_chat:
            delta = choice.get("delta") or {}
            texts.append((delta.get("reasoning_content") or "") + (delta.get("content") or ""))
        else:
            texts.append(choice.get("text") or "")
    return "".join(texts)


def read_stats(sample: RequestSample, chunk: dict[str, Any]) -> None:
    usage = chunk.get("usage")
    if usage:
        sample.prompt_tokens = usage.get("prompt_tokens")
        sample.completion_tokens = int(usage.get("completion_tokens") or 0)
    stats = chunk.get("ddtree_stats")
    if stats:
        sample.acceptance_histogram = list(stats.get("acceptance_histogram") or [])
        sample.served_mode = stats.get("mode") or None
        if sample.served_mode in TREE_MODES:
            sample.served_budget = stats.get("budget") or None
        stages = stats.get("stage_seconds")
        if isinstance(stages, dict):
            sample.stage_seconds = {str(k): float(v) for k, v in stages.items()}


class OpenAITarget:
    """One base URL (`http://host:port`, with or without `/v1`)."""

    def __init__(self, url: str, name: str = "url", model: str | None = None,
                 api_key: str | None = None, timeout_s: float = 600.0,
                 extra_body: dict[str, Any] | None = None) -> None:
        self.name = name
        self.base_url = url.rstrip("/").removesuffix("/v1")
        self.api_key, self.timeout_s = api_key, timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None  # made in the loop that uses it
        self.model = model
        self.extra_body = extra_body or {}

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (keep-alive connections, no limit on their number), made on
        first use in the running event loop."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                self.base_url, headers=self.headers,
                # `--timeout`: seconds per request, as vLLM's benchmark bounds its requests
                # (a timer per read instead cost the client ~30-75% more CPU an event)
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=0), read_bufsize=READ_BUFFER_BYTES)
        return self._session

    async def start(self) -> None:
        """Checks the server answers and picks its first model when none was named."""
        try:
            async with self.session.get("/v1/models") as reply:
                reply.raise_for_status()
                listing = await reply.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise InvalidArgumentError(f"{self.base_url}/v1/models: {exc}") from exc
        models = [m["id"] for m in listing.get("data", [])]
        if self.model is None:
            if not models:
                raise InvalidArgumentError(f"{self.base_url} serves no model")
            self.model = models[0]

    def describe(self) -> dict[str, Any]:
        return {"kind": "openai", "url": self.base_url, "model": self.model}

    async def prepare(self, bounds: RunBounds) -> None:
        """A server is sized by whoever started it."""

    async def send(self, prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> RequestSample:
        assert self.model is not None, "call start() first"
        path = "/v1/chat/completions" if settings.is_chat else "/v1/completions"
        body = request_body(self.model, prompt, spec, settings, self.extra_body)
        sample = RequestSample(prompt.index, start=time.perf_counter())
        try:
            async with self.session.post(path, json=body) as reply:
                if reply.status != 200:
                    text = (await reply.read()).decode(errors="replace")
                    sample.error = f"HTTP {reply.status}: {text[:300]}"
                else:
                    await self.read_events(reply, sample, settings.is_chat)
        except (aiohttp.ClientError, TimeoutError) as exc:
            sample.error = f"{type(exc).__name__}: {exc}"
        sample.end = time.perf_counter()
        return sample

    async def read_events(self, reply: aiohttp.ClientResponse, sample: RequestSample,
                          is_chat: bool) -> None:
        """The stream's events into `sample`: its chunks' times and text, its usage."""
        parts = []
        async for line in reply.content:  # one line a step (the SSE events' lines)
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                sample.error = str(chunk["error"].get("message", chunk["error"]))
                break
            text = chunk_text(chunk, is_chat)
            if text:
                sample.chunk_times.append(time.perf_counter())
                parts.append(text)
            read_stats(sample, chunk)
        sample.text = "".join(parts)
        if sample.error is None and sample.completion_tokens == 0 and parts:
            sample.error = "the server sent no usage (stream_options.include_usage)"

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
