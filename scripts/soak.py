"""Soak test of a running `ddtree serve` (or one this script starts): N concurrent clients
for M seconds, the drafter killed every K seconds (its pid from `ddtree serve --pid-dir`),
clients that hang up mid-stream at random. Loopback only; bounded in time and count.

Reports, as JSON: completed / failed / lost requests (lost: no answer, or a stream that
ended without its finish), tokens that differ from the target's own (each prompt's
`mode: ar` answer at temperature 0), KV slots leaked once the load is gone (the verifier's
GetStats: nothing running, waiting or open, kv_usage 0), p50 / p99 latency. Exit code 0
when nothing failed, was lost, differed or leaked.

    python scripts/soak.py --start --target DIR --drafter DIR --concurrency 4 --duration-s 600
    python scripts/soak.py --base-url http://127.0.0.1:8000 --verifier-addr 127.0.0.1:50051 \\
        --pid-dir /tmp/ddtree-pids
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx

from ddtree.service import GrpcSecurity, open_channel
from ddtree.v1 import verifier_pb2, verifier_pb2_grpc

PROMPTS = ("The quick brown fox", "def fibonacci(n):", "Once upon a time", "List three colors:",
           "import numpy as np\n", "The capital of France is", "1, 2, 3, 4,", "Dear Sir,")
MODES = ("tree", "linear", "shadow")
LOOPBACK = ("127.", "localhost", "[::1]")


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str, latency: float | None = None, error: str = "") -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if latency is not None:
                self.latencies.append(latency)
            if error and len(self.errors) < 20:
                self.errors.append(error)

    @property
    def count(self) -> int:
        with self.lock:
            return sum(self.outcomes.values())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--verifier-addr", default="127.0.0.1:50051")
    parser.add_argument("--pid-dir", type=Path, default=None, help="ddtree serve's --pid-dir")
    parser.add_argument("--start", action="store_true", help="start a ddtree serve for the run")
    parser.add_argument("--target", help="with --start")
    parser.add_argument("--drafter", help="with --start")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--kill-drafter-every-s", type=float, default=60.0, help="0 = never")
    parser.add_argument("--disconnect-prob", type=float, default=0.1)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--request-timeout-s", type=float, default=120.0)
    parser.add_argument("--settle-s", type=float, default=30.0,
                        help="how long the pool may take to drain after the load")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.base_url.removeprefix("http://").startswith(LOOPBACK):
        parser.error("the soak test only targets loopback addresses")
    if not args.verifier_addr.startswith(LOOPBACK):
        parser.error("the soak test only targets loopback addresses")
    if args.start and not args.target:
        parser.error("--start needs --target (and --drafter)")
    return args


def complete(client: httpx.Client, prompt: str, mode: str, max_tokens: int) -> dict[str, Any]:
    reply = client.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True, "ddtree": {"mode": mode}})
    reply.raise_for_status()
    return dict(reply.json())


def streamed_tokens(client: httpx.Client, prompt: str, mode: str, max_tokens: int,
                    hang_up: bool) -> list[int] | None:
    """The streamed token ids; None when this client hung up on purpose. Raises ValueError
    for a stream that ended without a finish reason (lost)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True, "ddtree": {"mode": mode}}
    tokens, finished, done = [], False, False
    with client.stream("POST", "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise httpx.HTTPError(f"error event: {chunk['error'].get('message')}")
                for choice in chunk.get("choices", []):
                    tokens += choice.get("token_ids") or []
                    finished = finished or choice.get("finish_reason") is not None
                if hang_up:
                    return None
    if not (finished and done):
        raise ValueError("the stream ended without its finish reason")
    return tokens


def client_loop(args: argparse.Namespace, references: dict[str, list[int]], tally: Tally,
                deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=args.base_url, timeout=args.request_timeout_s) as client:
        while time.monotonic() < deadline and tally.count < args.max_requests:
            prompt, mode = rng.choice(PROMPTS), rng.choice(MODES)
            hang_up = rng.random() < args.disconnect_prob
            started = time.monotonic()
            try:
                if hang_up or rng.random() < 0.5:
                    tokens = streamed_tokens(client, prompt, mode, args.max_tokens, hang_up)
                else:
                    tokens = complete(client, prompt, mode, args.max_tokens)["choices"][0][
                        "token_ids"]
            except httpx.HTTPStatusError as exc:
                tally.add("failed", error=f"{exc.response.status_code}: {exc.response.text[:200]}")
                continue
            except (httpx.TimeoutException, httpx.TransportError, ValueError) as exc:
                tally.add("lost", error=f"{type(exc).__name__}: {exc}")
                continue
            except httpx.HTTPError as exc:
                tally.add("failed", error=str(exc))
                continue
            if tokens is None:
                tally.add("disconnected")
            elif tokens != references[prompt]:
                tally.add("mismatched", error=f"{mode} {prompt!r}: {tokens} != ar's")
            else:
                tally.add("completed", time.monotonic() - started)


def drafter_killer(pid_dir: Path, every_s: float, stop: threading.Event,
                   kills: list[int]) -> None:
    while not stop.wait(every_s):
        try:
            pid = int((pid_dir / "drafter.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)
        except (OSError, ValueError):
            pass  # between restarts: no drafter to kill this time


def settled_stats(address: str, settle_s: float) -> dict[str, Any]:
    """GetStats once the pool drained (or `settle_s` passed): what is still held."""
    security = GrpcSecurity(token=os.environ.get("DDTREE_GRPC_TOKEN", ""))
    deadline = time.monotonic() + settle_s
    with open_channel(address, security) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        while True:
            try:
                stats = stub.GetStats(verifier_pb2.StatsRequest(), timeout=5)
                held = {"num_running": stats.num_running, "num_waiting": stats.num_waiting,
                        "num_open_sessions": stats.num_open_sessions,
                        "kv_usage": stats.kv_usage}
                if not any(held.values()) or time.monotonic() > deadline:
                    return held
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    return {"error": exc.code().name}
            time.sleep(0.2)  # aborts land within an engine round


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def start_serve(args: argparse.Namespace, pid_dir: Path) -> subprocess.Popen[bytes]:
    ports = [free_port() for _ in range(3)]
    args.base_url = f"http://127.0.0.1:{ports[0]}"
    args.verifier_addr = f"127.0.0.1:{ports[1]}"
    argv = [sys.executable, "-m", "ddtree.cli", "serve", "--target", args.target,
            "--device", args.device, "--dtype", args.dtype, "--port", str(ports[0]),
            "--verifier-port", str(ports[1]), "--drafter-port", str(ports[2]),
            "--pid-dir", str(pid_dir)]
    if args.drafter:
        argv += ["--drafter", args.drafter]
    serve = subprocess.Popen(argv, stdout=sys.stderr)
    deadline = time.monotonic() + 600
    while not healthy(args.base_url):
        if serve.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"soak: ddtree serve did not come up (exit {serve.poll()})")
        time.sleep(0.2)  # polling /health
    return serve


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    with httpx.Client(base_url=args.base_url, timeout=args.request_timeout_s) as client:
        references = {p: complete(client, p, "ar", args.max_tokens)["choices"][0]["token_ids"]
                      for p in PROMPTS}
    tally, kills, stop = Tally(), [], threading.Event()
    started = time.monotonic()
    deadline = started + args.duration_s
    killer = None
    if args.pid_dir is not None and args.kill_drafter_every_s > 0:
        killer = threading.Thread(target=drafter_killer, daemon=True,
                                  args=(args.pid_dir, args.kill_drafter_every_s, stop, kills))
        killer.start()
    workers = [threading.Thread(target=client_loop, args=(args, references, tally, deadline,
                                                          args.seed + i))
               for i in range(args.concurrency)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=args.duration_s + args.request_timeout_s + 30)
    stop.set()
    held = settled_stats(args.verifier_addr, args.settle_s)
    outcomes = tally.outcomes
    return {
        "duration_s": round(time.monotonic() - started, 2), "concurrency": args.concurrency,
        "completed": outcomes["completed"], "failed": outcomes["failed"],
        "lost": outcomes["lost"], "disconnected": outcomes["disconnected"],
        "mismatched": outcomes["mismatched"], "num_drafter_kills": len(kills),
        "latency_s": {"p50": percentile(tally.latencies, 0.5),
                      "p99": percentile(tally.latencies, 0.99)},
        "pool_after_load": held, "leaked": any(v for v in held.values()),
        "errors": tally.errors,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    serve = None
    with tempfile.TemporaryDirectory(prefix="ddtree-soak-") as tmp:
        if args.start:
            args.pid_dir = Path(tmp)
            serve = start_serve(args, args.pid_dir)
        try:
            report = run_load(args)
        finally:
            if serve is not None:
                serve.send_signal(signal.SIGTERM)
                code = serve.wait(timeout=120)
        if serve is not None:
            report["serve_exit_code"] = code
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    bad = report["failed"] or report["lost"] or report["mismatched"] or report["leaked"]
    return 1 if bad or report.get("serve_exit_code", 0) else 0


if __name__ == "__main__":
    sys.exit(main())
