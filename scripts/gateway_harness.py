"""The gateway's side of a busy `ddtree serve`, on the CPU: a synthetic verifier (the real
GenerateMany writer, `verifier_svc.generate_many.ManyStream`, fed by a ticker instead of an
engine: every tick each live generation gets one token, the outbox is flushed once a tick,
as the engine thread does per step) behind the real gateway, and `ddtree bench --url` in
front. What it measures is the gateway's (and the client's) share of a serve run at ar-like
event rates without a GPU: tokens/s against the offered rate (ticks/s x concurrency), TTFT,
and the gateway's /metrics timings (verifier -> gateway's loop -> consumer -> client).

    PYTHONPATH=. python scripts/gateway_harness.py               # 1,200 ticks/s, c8, 96 requests
    PYTHONPATH=. python scripts/gateway_harness.py --busy-core   # a busy loop on the gateway's core

With --pin (the default where there are 2+ cores) the gateway runs on core 0 and the rest on
the other cores, so the gateway has a core of its own unless --busy-core puts a busy loop
beside it (lease 41: that reproduced the GPU host's read lag on a 2-core sandbox). The
demo target's tokenizer (`ddtree models pull smollm2`) serves the chat template.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import httpx
from profile_gateway import cpu_seconds, free_port, wait_healthy  # this script's folder

DEMO_TARGET = Path.home() / ".cache" / "ddtree" / "smollm2-135m-instruct"
INSTANCE_ID = "harness"
TOKENS = list(range(300, 1300))  # ids that decode to text in the demo tokenizer
TIMINGS = ("request_prepare", "verifier_start", "verifier_first_token", "verifier_read",
           "verifier_hop", "delivery", "time_to_first_token")


def serve_verifier(port: int, rate: float, socket_path: str) -> None:
    """The synthetic verifier until killed; GenerateMany also on `socket_path` ("": no)."""
    from ddtree.engine import RoundResult, SpecParams
    from ddtree.service import add_health_and_reflection, set_serving
    from ddtree.v1 import verifier_pb2, verifier_pb2_grpc
    from verifier_svc.generate_many import ManyStream
    from verifier_svc.local_socket import LocalManyServer
    from verifier_svc.scheduler import Generation, Outbox
    from verifier_svc.servicer import VerifierServicer

    class Ticker:
        """The scheduler's two calls ManyStream makes (enqueue, cancel), and the steps."""

        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.live: dict[int, tuple[Generation, int]] = {}
            threading.Thread(target=self.run, daemon=True).start()

        def enqueue(self, generation: Generation) -> None:
            with self.lock:
                self.live[id(generation)] = (generation, 0)

        def cancel(self, generation: Generation) -> None:
            with self.lock:
                self.live.pop(id(generation), None)

        def run(self) -> None:
            period, due = 1.0 / rate, time.perf_counter()
            while True:
                due += period
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                else:
                    due = time.perf_counter()
                outboxes: set[Outbox] = set()
                with self.lock:
                    for key, (generation, made) in list(self.live.items()):
                        made += 1
                        finished = made >= generation.request.max_tokens
                        result = RoundResult(
                            new_tokens=[TOKENS[made % len(TOKENS)]],
                            acceptance_length=int(made > 1), finished=finished,
                            finish_reason="length" if finished else None,
                            committed_tokens=[1] if made > 1 else [])
                        outbox = generation.put(result, flush=False)
                        if outbox is not None:
                            outboxes.add(outbox)
                        if finished:
                            del self.live[key]
                        else:
                            self.live[key] = (generation, made)
                for outbox in outboxes:
                    outbox.flush()

    class Servicer(verifier_pb2_grpc.VerifierServicer):
        def __init__(self) -> None:
            self.ticker = Ticker()
            # what VerifierServicer._generation_request reads
            self.model_info = verifier_pb2.ModelInfo(max_model_len=8192)
            self.config = argparse.Namespace(default_spec=SpecParams(mode="ar"), max_budget=64)

        def GetModelInfo(self, request: object, context: object) -> verifier_pb2.ModelInfo:
            return verifier_pb2.ModelInfo(model_id="synthetic", vocab_size=49152,
                                          max_model_len=8192, eos_token_ids=[2],
                                          default_mode="ar", local_socket=socket_path,
                                          instance_id=INSTANCE_ID if socket_path else "")

        def GetStats(self, request: object, context: object) -> verifier_pb2.EngineStats:
            return verifier_pb2.EngineStats()  # no slot limit: always admits

        def GenerateMany(self, requests: Iterator[verifier_pb2.GenerateManyRequest],
                         context: grpc.ServicerContext,
                         ) -> Iterator[verifier_pb2.GenerateManyResponse]:
            stream = self.many_stream(context.peer())
            context.add_callback(stream.cancel_all)
            yield from stream.run(requests, context.is_active)

        def many_stream(self, peer: str) -> ManyStream:
            def convert(message: verifier_pb2.GenerateRequest) -> object:
                return VerifierServicer._generation_request(self, message)  # type: ignore[arg-type]

            return ManyStream(self.ticker, convert, VerifierServicer._response,  # type: ignore[arg-type]
                              peer)

    servicer = Servicer()
    if socket_path:
        LocalManyServer(socket_path, servicer, INSTANCE_ID, "", 16).start()  # type: ignore[arg-type]
    server = grpc.server(futures.ThreadPoolExecutor(16))
    verifier_pb2_grpc.add_VerifierServicer_to_server(servicer, server)
    health = add_health_and_reflection(server, ["ddtree.v1.Verifier"], False)
    set_serving(health, ["ddtree.v1.Verifier"])
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def timings(metrics: str) -> dict[str, tuple[int, float]]:
    """/metrics -> {name: (count, mean seconds)} for TIMINGS."""
    found: dict[str, float] = {}
    for line in metrics.splitlines():
        match = re.match(r"^ddtree:(\w+)_seconds_(sum|count)\{[^}]*\} (\S+)$", line)
        if match and match.group(1) in TIMINGS:
            found[f"{match.group(1)}_{match.group(2)}"] = float(match.group(3))
    return {name: (int(found[f"{name}_count"]), found[f"{name}_sum"] / found[f"{name}_count"])
            for name in TIMINGS if found.get(f"{name}_count")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1200.0, help="verifier ticks a second")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num", type=int, default=96, help="HumanEval requests")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--target", type=Path, default=DEMO_TARGET, help="tokenizer directory")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction,
                        default=(os.cpu_count() or 1) >= 2)
    parser.add_argument("--busy-core", action="store_true",
                        help="a busy loop shares the gateway's core (needs --pin)")
    parser.add_argument("--socket", action=argparse.BooleanOptionalAction, default=True,
                        help="the shared stream over the verifier's Unix socket (default) "
                             "or gRPC")
    parser.add_argument("--serve-verifier", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--socket-path", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_verifier:
        serve_verifier(args.serve_verifier, args.rate, args.socket_path)
        return 0
    if not (args.target / "tokenizer.json").exists():
        parser.error(f"no tokenizer in {args.target} (`ddtree models pull smollm2`)")
    others = ",".join(str(c) for c in range(1, os.cpu_count() or 2)) or "0"

    def pinned(core: str, command: list[str]) -> list[str]:
        return ["taskset", "-c", core, *command] if args.pin else command

    verifier_port, gateway_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "OMP_NUM_THREADS": "1"}
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    processes = [subprocess.Popen(
        pinned(others, [sys.executable, __file__, "--serve-verifier", str(verifier_port),
                        "--rate", str(args.rate), "--socket-path",
                        str(logs / f"harness-{verifier_port}.sock") if args.socket else ""]),
        env=env, stdout=subprocess.DEVNULL, stderr=open(logs / "harness_verifier.log", "wb"))]
    gateway = subprocess.Popen(
        pinned("0", [sys.executable, "-m", "gateway", "--verifier-addr",
                     f"127.0.0.1:{verifier_port}", "--target", str(args.target),
                     "--port", str(gateway_port)]),
        env=env, stdout=subprocess.DEVNULL, stderr=open(logs / "harness_gateway.log", "wb"))
    processes.append(gateway)
    if args.busy_core and args.pin:
        processes.append(subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c",
                                           "while True: pass"]))
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        wait_healthy(f"{url}/health", gateway)
        before = cpu_seconds(gateway.pid)
        bench = subprocess.run(
            pinned(others, [sys.executable, "-m", "ddtree.cli", "bench", "--url", url,
                            "--prompts", "humaneval", "--num-prompts", str(args.num),
                            "--num-requests", str(args.num), "--max-tokens",
                            str(args.max_tokens), "--no-progress", "--client-processes",
                            str(args.client_processes), "--modes", "ar", "--budgets", "1",
                            "--concurrency", str(args.concurrency)]),
            env=env, capture_output=True, text=True, check=False)
        cpu = cpu_seconds(gateway.pid) - before
        rows = [line for line in bench.stdout.splitlines() if line.startswith("humaneval")]
        print("\n".join(rows) or bench.stdout + bench.stderr)
        offered = args.rate * args.concurrency
        print(f"offered {offered:,.0f} tok/s (ticks/s x concurrency); gateway CPU {cpu:.2f} s "
              f"({1e6 * cpu / (args.num * args.max_tokens):.0f} us a token)")
        for name, (count, mean) in timings(httpx.get(f"{url}/metrics").text).items():
            print(f"ddtree:{name}_seconds: {count} x {1e3 * mean:.2f} ms")
    finally:
        for process in processes:
            process.kill()
            process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
