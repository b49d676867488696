"""`ddtree serve` supervises drafter, verifier and gateway as real processes: each starts
after the one it needs is healthy; a child killed with SIGKILL is restarted (the drafter
while the verifier serves in ar, the verifier while the gateway answers 503 and holds
requests that have no token yet); only SIGTERM / Ctrl-C stops it, with exit code 0 and no
error line."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddtree.healthcheck import is_serving
from tests.integration.conftest import REPO, free_port

STARTUP_TIMEOUT_S = 180.0
READY = re.compile(r"ddtree serve: ([\w-]+) ready \(pid (\d+), (\S+)\)")


class Serve:
    """A running `ddtree serve`; a thread reads its stdout and stderr lines into a queue."""

    def __init__(self, pair: Path, pid_dir: Path, *extra: str) -> None:
        self.pid_dir = pid_dir
        self.port = free_port()
        argv = [sys.executable, "-m", "ddtree.cli", "serve", "--target", str(pair / "target"),
                "--drafter", str(pair / "drafter"), "--device", "cpu", "--dtype", "float32",
                "--mode", "tree", "--budget", "4", "--port", str(self.port),
                "--verifier-port", str(free_port()), "--drafter-port", str(free_port()),
                "--pid-dir", str(pid_dir), *extra]
        self.process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.children: dict[str, tuple[int, str]] = {}

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str) -> None:
        """Reads output until a line contains `text` (recording the children it reports)."""
        while True:
            try:
                line = self.lines.get(timeout=STARTUP_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"no output for {STARTUP_TIMEOUT_S:.0f} s before "
                                     f"{text!r}:\n{''.join(self.output[-40:])}") from None
            assert line is not None, (f"ddtree serve exited ({self.process.wait()}) before "
                                      f"{text!r}:\n{''.join(self.output[-40:])}")
            if match := READY.search(line):
                self.children[match[1]] = (int(match[2]), match[3])
            if text in line:
                return

    def pid(self, name: str) -> int:
        return int((self.pid_dir / f"{name}.pid").read_text())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: signal.Signals) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(timeout=90)
        time.sleep(0.2)  # the reader thread drains the pipe
        return code

    def error_lines(self) -> list[str]:
        return [line for line in self.output if "error" in line.lower()]


@pytest.fixture()
def serve(tiny_pair: Path, tmp_path: Path) -> Iterator[Serve]:
    running = Serve(tiny_pair, tmp_path / "pids")
    try:
        running.wait_for("OpenAI API at")
        yield running
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait(timeout=60)


def http(url: str, body: dict | None = None, timeout_s: float = 120) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return reply.status, dict(json.loads(reply.read()))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.loads(exc.read()))


def complete(serve: Serve) -> dict:
    status, body = http(f"{serve.url}/v1/completions", {
        "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0,
        "return_token_ids": True})
    assert status == 200, body
    return body


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_serve_runs_the_three_services_and_stops_them_on_sigterm(serve: Serve) -> None:
    assert set(serve.children) == {"drafter", "verifier", "gateway"}
    assert {name: serve.pid(name) for name in serve.children} == {
        name: pid for name, (pid, _) in serve.children.items()}
    assert http(f"{serve.url}/health")[0] == 200
    assert complete(serve)["usage"]["completion_tokens"] == 6
    assert serve.stop(signal.SIGTERM) == 0
    for name, (pid, _) in serve.children.items():
        assert not pid_alive(pid), f"{name} still running after ddtree serve stopped"
    assert not is_serving(serve.children["verifier"][1], timeout_s=1.0)
    assert not list(serve.pid_dir.glob("*.pid"))
    assert serve.error_lines() == []


def test_killed_children_are_restarted_and_requests_still_succeed(serve: Serve) -> None:
    reference = complete(serve)["choices"][0]["token_ids"]
    # The drafter dies: the verifier serves in ar meanwhile (same tokens at T=0) ...
    drafter = serve.pid("drafter")
    os.kill(drafter, signal.SIGKILL)
    assert complete(serve)["choices"][0]["token_ids"] == reference
    serve.wait_for("drafter ready")
    assert serve.pid("drafter") != drafter and pid_alive(serve.pid("drafter"))
    # ... the verifier dies: /health says 503, and a request sent now waits for the
    # restarted verifier instead of failing (it had produced no token).
    verifier = serve.pid("verifier")
    os.kill(verifier, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while http(f"{serve.url}/health")[0] != 503:
        assert time.monotonic() < deadline, "the gateway never reported the dead verifier"
        time.sleep(0.05)  # polling /health
    assert complete(serve)["choices"][0]["token_ids"] == reference
    serve.wait_for("verifier ready")
    assert serve.pid("verifier") != verifier
    assert http(f"{serve.url}/health")[0] == 200
    # Ctrl-C: everything stops, exit 0, nothing that reads as an error.
    assert serve.stop(signal.SIGINT) == 0
    assert serve.error_lines() == []


def test_sixty_four_concurrent_requests_all_complete(serve: Serve) -> None:
    """With the default limits (64 KV rows, a queue behind them) 64 simultaneous requests
    are all served, none refused with 429, and every one gets the same greedy tokens."""
    results: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def one() -> None:
        reply = http(f"{serve.url}/v1/completions", {
            "prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0,
            "return_token_ids": True})
        with lock:
            results.append(reply)

    threads = [threading.Thread(target=one) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == 64
    assert [status for status, _ in results] == [200] * 64, [b for s, b in results if s != 200]
    assert len({tuple(body["choices"][0]["token_ids"]) for _, body in results}) == 1


def finished_requests(serve: Serve) -> tuple[str, float]:
    """(the pid of the gateway process that answered, ddtree:request_success_total summed
    over its labels) from /metrics, on a new connection."""
    with urllib.request.urlopen(f"{serve.url}/metrics", timeout=30) as reply:
        pid, text = reply.headers.get("x-ddtree-gateway-pid"), reply.read().decode()
    return pid, sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("ddtree:request_success_total{"))


def test_gateway_workers_share_the_port_and_one_dying_loses_no_request(
        tiny_pair: Path, tmp_path: Path) -> None:
    """`--gateway-workers 2`: two gateway processes on one port (SO_REUSEPORT). Once one of
    them died, every request is answered (by the other) while it restarts. (A connection
    the kernel had queued for the dying process when it died is reset, as with any
    SO_REUSEPORT server.) /metrics, from whichever process answers, counts every request
    either served, the dead one's included (prometheus_client's multiprocess mode)."""
    serve = Serve(tiny_pair, tmp_path / "pids", "--gateway-workers", "2")
    try:
        serve.wait_for("OpenAI API at")
        assert set(serve.children) == {"drafter", "verifier", "gateway", "gateway-2"}
        reference = complete(serve)["choices"][0]["token_ids"]
        first = serve.pid("gateway")
        os.kill(first, signal.SIGKILL)
        serve.wait_for("gateway exited")
        for _ in range(8):  # new connections only reach the live process
            assert complete(serve)["choices"][0]["token_ids"] == reference
        serve.wait_for("gateway ready")
        assert serve.pid("gateway") != first and pid_alive(serve.pid("gateway"))
        assert pid_alive(serve.pid("gateway-2"))
        sums: dict[str, set[float]] = {}
        for _ in range(200):  # until both live processes have answered a scrape
            pid, total = finished_requests(serve)
            sums.setdefault(pid, set()).add(total)
            if len(sums) == 2:
                break
        assert set(sums) == {str(serve.pid("gateway")), str(serve.pid("gateway-2"))}
        assert all(totals == {9.0} for totals in sums.values()), sums
        assert serve.stop(signal.SIGTERM) == 0
        assert not list(serve.pid_dir.glob("*.pid"))
    finally:
        if serve.process.poll() is None:
            serve.process.kill()
            serve.process.wait(timeout=60)


def test_a_colocated_drafter_serves_from_the_verifier_process(
        tiny_pair: Path, tmp_path: Path) -> None:
    """`--colocate-drafter`: two processes (the verifier runs the drafter); a tree request
    drafts and serves ar's tokens at T = 0; SIGTERM stops both."""
    serve = Serve(tiny_pair, tmp_path / "pids", "--colocate-drafter")
    try:
        serve.wait_for("OpenAI API at")
        assert set(serve.children) == {"verifier", "gateway"}
        bodies = {}
        for mode in ("ar", "tree"):
            status, bodies[mode] = http(f"{serve.url}/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12,
                "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                "ddtree": {"mode": mode, "budget": 8}})
            assert status == 200, bodies[mode]
        tokens = {mode: body["choices"][0]["token_ids"] for mode, body in bodies.items()}
        assert tokens["tree"] == tokens["ar"] and len(tokens["ar"]) == 12
        assert bodies["tree"]["ddtree_stats"]["num_drafted_nodes"] > 0
        assert serve.stop(signal.SIGTERM) == 0
        assert serve.error_lines() == []
    finally:
        if serve.process.poll() is None:
            serve.process.kill()
            serve.process.wait(timeout=60)
