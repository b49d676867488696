"""`ddtree serve` starts drafter, verifier and gateway as processes, each after the one it
needs is healthy, serves the OpenAI API, and stops all of them on SIGTERM or as soon as
one child dies."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree.healthcheck import is_serving
from tests.integration.conftest import REPO, free_port

STARTUP_TIMEOUT_S = 180.0
READY = re.compile(r"ddtree serve: (\w+) ready \(pid (\d+), (\S+)\)")


class Serve:
    """A running `ddtree serve` whose stdout lines are read by a thread into a queue."""

    def __init__(self, pair: Path, port: int) -> None:
        argv = [
            sys.executable,
            "-m",
            "ddtree.cli",
            "serve",
            "--target",
            str(pair / "target"),
            "--drafter",
            str(pair / "drafter"),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--mode",
            "tree",
            "--budget",
            "4",
            "--port",
            str(port),
        ]
        self.process = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.children: dict[str, tuple[int, str]] = {}

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str) -> None:
        """Reads stdout until a line contains `text` (recording the children it reports)."""
        while True:
            line = self.lines.get(timeout=STARTUP_TIMEOUT_S)
            assert line is not None, f"ddtree serve exited ({self.process.wait()}) before {text!r}"
            if match := READY.search(line):
                self.children[match[1]] = (int(match[2]), match[3])
            if text in line:
                return


@pytest.fixture()
def serve(tiny_pair: Path) -> Iterator[Serve]:
    running = Serve(tiny_pair, free_port())
    try:
        running.wait_for("OpenAI API at")
        yield running
    finally:
        if running.process.poll() is None:
            running.process.terminate()
            running.process.wait(timeout=60)


def http_json(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
        return dict(json.loads(reply.read()))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_runs_the_three_services_and_stops_them_on_sigterm(serve: Serve) -> None:
    assert set(serve.children) == {"drafter", "verifier", "gateway"}
    gateway = serve.children["gateway"][1]
    assert http_json(f"{gateway}/health") is not None
    model = http_json(f"{gateway}/v1/models")["data"][0]["id"]
    completion = http_json(
        f"{gateway}/v1/completions",
        {"model": model, "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0},
    )
    assert completion["usage"]["completion_tokens"] >= 1
    serve.process.send_signal(signal.SIGTERM)
    assert serve.process.wait(timeout=60) == 0
    for name, (pid, _) in serve.children.items():
        assert not pid_alive(pid), f"{name} still running after ddtree serve stopped"
    assert not is_serving(serve.children["verifier"][1], timeout_s=1.0)


def test_serve_stops_everything_when_a_child_dies(serve: Serve) -> None:
    os.kill(serve.children["verifier"][0], signal.SIGKILL)
    assert serve.process.wait(timeout=60) != 0
    for name in ("drafter", "gateway"):
        assert not pid_alive(serve.children[name][0]), f"{name} outlived a dead verifier"
