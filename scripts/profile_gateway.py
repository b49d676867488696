"""The gateway's own CPU work per streamed event, on the CPU: a real verifier (ar, the tiny
pair, float32) and the real gateway as two processes on loopback, the gateway under
cProfile; N concurrent streaming completions (token events, temperature 0); then the
gateway's time in the functions that handle each event, per event or per verifier message.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/profile_gateway.py --streams 8
    ... --no-cprofile     # the gateway's CPU per token and per event alone

The tiny target answers fast enough on the CPU that the gateway, not the model, bounds the
event rate: what it measures is the Python work a busy gateway does per event (compare
within one run: the figures grow with whatever else the host runs).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from ddtree.models.tiny import make_tiny_pair

# (label, pstats function-name fragment, what one call handles)
FUNCTIONS = (
    ("verifier message -> token deltas", "gateway/generation.py", "consume", "message"),
    ("incremental detokenize", "gateway/detokenize.py", "push", "token"),
    ("SSE chunk (JSON)", "gateway/streaming.py", "chunk", "event"),
    ("gRPC stream read", "grpc/aio/_call.py", "read", "message"),
    ("HTTP send (h11 + socket)", "h11_impl.py", "send", "event"),
    ("socket send", "~", "<method 'send' of '_socket.socket' objects>", "event"),
)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, "the gateway exited"
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy in {seconds} s")


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream(base_url: str, index: int, max_tokens: int) -> int:
    """One streaming completion -> the number of data events it got."""
    body = {"model": "tiny", "prompt": [5, 6, 7, 8 + index], "max_tokens": max_tokens,
            "stream": True, "temperature": 0, "ignore_eos": True}
    events = 0
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=300) as reply:
        for line in reply.iter_lines():
            events += line.startswith("data: {")
    return events


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=8, help="concurrent completions")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--keep-profile", type=Path, default=None,
                        help="copy the gateway's cProfile output here (pstats)")
    parser.add_argument("--cprofile", action=argparse.BooleanOptionalAction, default=True,
                        help="run the gateway under cProfile (off: its CPU per token alone)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_tiny_pair(root / "pair", family="llama")
        target = str(root / "pair" / "target")
        verifier_port, gateway_port = free_port(), free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        log = open(root / "services.log", "wb")  # noqa: SIM115 - closed with the processes
        verifier = subprocess.Popen(
            [sys.executable, "-m", "verifier_svc", "--target", target, "--device", "cpu",
             "--dtype", "float32", "--mode", "ar", "--port", str(verifier_port),
             "--max-model-len", str(args.max_tokens + 64)], env=env, stdout=log, stderr=log)
        profile = root / "gateway.prof"
        profiler = ["-m", "cProfile", "-o", str(profile)] if args.cprofile else []
        gateway = subprocess.Popen(
            [sys.executable, *profiler, "-m", "gateway",
             "--verifier-addr", f"127.0.0.1:{verifier_port}", "--target", target,
             "--port", str(gateway_port), "--model-name", "tiny"], env=env, stdout=log, stderr=log)
        base_url = f"http://127.0.0.1:{gateway_port}"
        try:
            wait_healthy(f"{base_url}/health", gateway)
            stream(base_url, 0, 8)  # warm-up
            cpu_before = cpu_seconds(gateway.pid)
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
                events = sum(pool.map(lambda i: stream(base_url, i, args.max_tokens),
                                      range(args.requests)))
            seconds = time.perf_counter() - started
            cpu = cpu_seconds(gateway.pid) - cpu_before
        finally:
            gateway.send_signal(signal.SIGINT)  # uvicorn stops, cProfile writes its file
            gateway.wait(timeout=30)
            verifier.terminate()
            verifier.wait(timeout=30)
            log.close()
        tokens = args.requests * args.max_tokens
        print(f"{events} events ({tokens} tokens) in {seconds:.2f} s ({events / seconds:.0f} "
              f"events/s), {args.streams} streams, ar, tiny pair on the CPU; the gateway's CPU"
              f"{' (under cProfile)' if args.cprofile else ''}: {1e6 * cpu / tokens:.0f} us "
              f"per token, {1e6 * cpu / max(events, 1):.0f} us per event")
        if not args.cprofile:
            return 0
        if args.keep_profile is not None:
            args.keep_profile.write_bytes(profile.read_bytes())
        stats = pstats.Stats(str(profile))
        print(f"{'gateway function':<34} {'calls':>7} {'us per call':>12}  per")
        table = stats.stats  # type: ignore[attr-defined]
        for label, where, name, unit in FUNCTIONS:
            calls = cumulative = 0.0
            for (path, _, function), (_, ncalls, _, cum, _) in table.items():
                if where in path and function == name:
                    calls, cumulative = calls + ncalls, cumulative + cum
            if calls:
                print(f"{label:<34} {calls:>7.0f} {1e6 * cumulative / calls:>12.1f}  {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
