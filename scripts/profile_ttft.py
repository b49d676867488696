"""Where the first token's time goes through the services: a real verifier (ar, no
drafter) and the real gateway as processes on loopback; the time to the first token of a
probe request (max_tokens 1) sent straight to the verifier over gRPC (GenerateMany, as the
gateway sends it, and Generate) and through the gateway over HTTP (completions with token
ids: no chat template), alone and beside `--load` streams that keep the engine busy.

    PYTHONPATH=. python scripts/profile_ttft.py --target DIR --device cuda --dtype bfloat16

On the H200 (lease 11) the first token took 2.7 / 3.4 ms in process at c1 / c8 and
9.5 / 20-47 ms through `ddtree serve`: the rows of this table split the difference into
the verifier's service path (gRPC) and the gateway (HTTP minus gRPC). Without --target the
tiny pair runs on the CPU (its prefill dominates there: compare rows, not absolutes).
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx

from ddtree.v1 import verifier_pb2, verifier_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_gateway import free_port, wait_healthy  # noqa: E402

PROMPT = list(range(100, 240))  # 140 token ids


def probe_many(stub: verifier_pb2_grpc.VerifierStub, ids: Iterator[str]) -> float:
    requests: queue.Queue[verifier_pb2.GenerateManyRequest | None] = queue.Queue()
    started = time.perf_counter()
    requests.put(verifier_pb2.GenerateManyRequest(start=verifier_pb2.GenerateRequest(
        request_id=next(ids), prompt_ids=PROMPT, max_tokens=1, ignore_eos=True)))
    requests.put(None)
    for _ in stub.GenerateMany(iter(requests.get, None), timeout=60):
        return time.perf_counter() - started
    raise RuntimeError("no reply")


def probe_generate(stub: verifier_pb2_grpc.VerifierStub) -> float:
    started = time.perf_counter()
    for _ in stub.Generate(verifier_pb2.GenerateRequest(prompt_ids=PROMPT, max_tokens=1,
                                                        ignore_eos=True), timeout=60):
        return time.perf_counter() - started
    raise RuntimeError("no reply")


def probe_http(client: httpx.Client, base: str) -> float:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 1, "stream": True,
            "temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    with client.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started
    raise RuntimeError("no event")


def background(base: str, streams: int, stop: threading.Event) -> list[threading.Thread]:
    """`streams` clients that keep a long generation running each until `stop`."""
    def run() -> None:
        with httpx.Client() as client:
            while not stop.is_set():
                body = {"model": "m", "prompt": PROMPT, "max_tokens": 2000, "stream": True,
                        "temperature": 0, "ignore_eos": True}
                with client.stream("POST", f"{base}/v1/completions", json=body,
                                   timeout=120) as reply:
                    for _ in reply.iter_lines():
                        if stop.is_set():
                            break

    threads = [threading.Thread(target=run, daemon=True) for _ in range(streams)]
    for thread in threads:
        thread.start()
    return threads


def median_ms(probe: Callable[[], float], repeats: int) -> tuple[float, float]:
    for _ in range(3):
        probe()
    times = sorted(probe() for _ in range(repeats))
    return 1e3 * statistics.median(times), 1e3 * times[int(0.9 * (len(times) - 1))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="default: the tiny pair")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--load", default="0,7", help="background streams per row")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-shared-stream", action="store_true",
                        help="the gateway sends a Generate call per generation")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        target = args.target
        if target is None:
            from ddtree.models.tiny import make_tiny_pair

            make_tiny_pair(Path(tmp) / "pair", family="llama")
            target = Path(tmp) / "pair" / "target"
        verifier_port, gateway_port = free_port(), free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        log = open(Path(tmp) / "services.log", "wb")  # noqa: SIM115 - closed below
        verifier = subprocess.Popen(
            [sys.executable, "-m", "verifier_svc", "--target", str(target), "--device",
             args.device, "--dtype", args.dtype, "--mode", "ar", "--port", str(verifier_port)],
            env=env, stdout=log, stderr=log)
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--verifier-addr", f"127.0.0.1:{verifier_port}",
             "--target", str(target), "--port", str(gateway_port), "--model-name", "m",
             "--log-level", "warning",
             *(["--no-shared-stream"] if args.no_shared_stream else [])],
            env=env, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{gateway_port}"
        try:
            wait_healthy(f"{base}/health", gateway, seconds=600)
            channel = grpc.insecure_channel(f"127.0.0.1:{verifier_port}")
            stub = verifier_pb2_grpc.VerifierStub(channel)
            ids = (f"ttft-{i}" for i in itertools.count())
            client = httpx.Client()
            print(f"time to the first token, ms (median / p90 of {args.repeats}), "
                  f"{args.device} {args.dtype}, prompt {len(PROMPT)} tokens")
            print(f"{'load':>5} {'GenerateMany':>16} {'Generate':>16} {'HTTP (gateway)':>16}")
            for load in (int(x) for x in args.load.split(",")):
                stop = threading.Event()
                threads = background(base, load, stop)
                time.sleep(2.0 if load else 0.0)  # the streams are running
                rows = [median_ms(lambda: probe_many(stub, ids), args.repeats),
                        median_ms(lambda: probe_generate(stub), args.repeats),
                        median_ms(lambda: probe_http(client, base), args.repeats)]
                stop.set()
                for thread in threads:
                    thread.join(timeout=60)
                print(f"{load:>5} " + " ".join(f"{m:>8.2f} / {p:<6.2f}" for m, p in rows))
            channel.close()
        finally:
            gateway.send_signal(signal.SIGINT)
            verifier.terminate()
            for process in (gateway, verifier):
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
