"""`ddtree bench --url` against an OpenAI server that is not ours (vLLM, SGLang cannot run
here; a small real HTTP server speaking their streaming dialect stands in): no `ddtree`
extension is sent, tokens come from its usage chunk, acceptance is unknown, the clock
follows its chunks."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ddtree.benchmark.report import schema
from ddtree.cli import main

WORDS = ("Hello", " from", " elsewhere")
CHUNK_GAP_S = 0.05
USAGE_TOKENS = 7  # deliberately not the number of chunks: usage is what counts


async def models(_: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": "foreign-model", "object": "model"}]})


async def chat(request: Request) -> Response:
    body = await request.json()
    if "ddtree" in body:  # a strict foreign server: unknown fields are an error
        return JSONResponse({"error": {"message": "unknown field ddtree"}}, status_code=400)

    async def events() -> AsyncIterator[bytes]:
        for word in WORDS:
            chunk = {"choices": [{"index": 0, "delta": {"content": word}}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await asyncio.sleep(CHUNK_GAP_S)
        usage = {"prompt_tokens": 3, "completion_tokens": USAGE_TOKENS, "total_tokens": 10}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def foreign_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/models", models),
                            Route("/v1/chat/completions", chat, methods=["POST"])])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "test server did not start"
        time.sleep(0.05)  # uvicorn sets `started` once it listens
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


def test_a_foreign_server_row_has_usage_tokens_and_unknown_acceptance(
        foreign_url: str, tmp_path: Path) -> None:
    out = tmp_path / "foreign.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["bench", "--url", foreign_url, "--preset", "seed", "--repeats", "2",
                     "--no-progress", "--json-out", str(out)]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    (row,) = report["rows"]
    assert (row["target"], row["mode"], row["num_failed"]) == ("url", "server", 0)
    assert row["acceptance_length"] is None and row["served_mode"] is None
    assert report["config"]["targets"]["url"]["model"] == "foreign-model"
    for sample in row["samples"]:
        assert sample["completion_tokens"] == USAGE_TOKENS
        assert sample["text"] == "".join(WORDS)
        assert len(sample["itl_s"]) == len(WORDS) - 1
        assert all(gap >= CHUNK_GAP_S * 0.8 for gap in sample["itl_s"])
        assert sample["ttft_s"] < sample["e2e_s"]
    line = stdout.getvalue().splitlines()[2]
    assert line.split()[4] == "?"  # tau column: unknown


def test_client_processes_share_the_requests(foreign_url: str, tmp_path: Path) -> None:
    """--client-processes 2: every request answered by one of two child processes, timed
    on the host's shared clock (the run's requests overlap as the concurrency says), the
    same samples as one client."""
    out = tmp_path / "pool.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["bench", "--url", foreign_url, "--preset", "seed", "--concurrency", "4",
                     "--num-requests", "8", "--warmup", "0", "--client-processes", "2",
                     "--no-progress", "--json-out", str(out)]) == 0
    report: dict[str, Any] = json.loads(out.read_text())
    jsonschema.validate(report, schema())
    assert report["config"]["targets"]["url"]["client_processes"] == 2
    (row,) = report["rows"]
    assert row["num_failed"] == 0 and len(row["samples"]) == 8
    for sample in row["samples"]:
        assert sample["completion_tokens"] == USAGE_TOKENS
        assert sample["text"] == "".join(WORDS)
        assert 0 <= sample["start_s"] and sample["ttft_s"] < sample["e2e_s"]
    # 8 requests of ~3 chunk gaps each, 4 at a time: two waves, not eight one after another
    assert row["wall_s"]["median"] < 8 * len(WORDS) * CHUNK_GAP_S
    # the busiest child's CPU, reported with its samples (a child spends some on each)
    (run,) = row["runs"]
    assert 0 < run["client_cores"] < 1


def test_client_processes_need_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--client-processes", "2", "--modes", "ar", "--no-progress"]) == 2
    assert "--client-processes needs --url" in capsys.readouterr().err
