"""`ddtree serve`: the three services on one machine (drafter, verifier, OpenAI gateway) as
child processes, each started only once the one it depends on answers its health check.
Ctrl-C / SIGTERM, or any child dying, stops all three."""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from types import FrameType

from ddtree.cli.options import add_model_options, add_spec_options, resolve_pair_dirs
from ddtree.errors import DDTreeError

# How long a child may take to load its model and answer its health check.
DEFAULT_STARTUP_TIMEOUT_S = 600.0
# How long a child may take to exit after SIGTERM before it is killed.
STOP_GRACE_S = 15.0


class ChildDied(DDTreeError):
    """One of the services exited on its own."""


class _Stop(Exception):
    """SIGTERM arrived: unwind and stop the children."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="run drafter, verifier and OpenAI gateway locally")
    add_model_options(parser)
    add_spec_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="the gateway's bind address")
    parser.add_argument("--port", type=int, default=8000, help="the gateway's HTTP port")
    parser.add_argument("--max-model-len", type=int, default=0, help="0 = the target's")
    parser.add_argument(
        "--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S, help="seconds"
    )
    parser.set_defaults(func=run)


def free_port() -> int:
    """A port the OS considers free now (the child binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_commands(args: argparse.Namespace, target: str, drafter: str | None,
                     drafter_port: int, verifier_port: int) -> list[tuple[str, list[str]]]:
    """(name, argv) of each child in start order; no drafter in ar mode."""
    python = sys.executable
    common = ["--target", target, "--device", args.device, "--dtype", args.dtype]
    commands = []
    if drafter is not None:
        commands.append(("drafter", [
            python, "-m", "drafter_svc", "--drafter", drafter, *common,
            "--host", "127.0.0.1", "--port", str(drafter_port),
            "--max-model-len", str(args.max_model_len),
        ]))
    verifier = [
        python, "-m", "verifier_svc", *common, "--host", "127.0.0.1",
        "--port", str(verifier_port), "--mode", args.mode, "--budget", str(args.budget),
        "--max-model-len", str(args.max_model_len),
    ]
    if args.max_topk:
        verifier += ["--max-topk", str(args.max_topk)]
    if drafter is not None:
        verifier += ["--drafter-addr", f"127.0.0.1:{drafter_port}"]
    commands.append(("verifier", verifier))
    commands.append(("gateway", [
        python, "-m", "gateway", "--verifier-addr", f"127.0.0.1:{verifier_port}",
        "--host", args.host, "--port", str(args.port), "--target", target,
    ]))
    return commands


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(name: str, child: subprocess.Popen[bytes], ready: Callable[[], bool],
               timeout_s: float) -> None:
    """Polls `ready` until it holds; fails as soon as the child exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if child.poll() is not None:
            raise ChildDied(f"{name} exited with code {child.returncode} while starting")
        if time.monotonic() > deadline:
            raise DDTreeError(f"{name} was not healthy within {timeout_s:.0f} s")
        time.sleep(0.2)  # health endpoints answer at once while not ready: pace the poll


def stop_children(children: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    """SIGTERM in reverse start order (gateway first), then SIGKILL what lingers."""
    for _, child in reversed(children):
        if child.poll() is None:
            child.terminate()
    for name, child in reversed(children):
        try:
            child.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            print(f"ddtree serve: {name} did not stop; killing it", file=sys.stderr)
            child.kill()
            child.wait()


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Stop()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    # Imported here so `ddtree generate` / `bench` run where grpc's health package is absent.
    from ddtree.healthcheck import is_serving

    target, drafter = resolve_pair_dirs(args, need_drafter=args.mode != "ar")
    drafter_port, verifier_port = free_port(), free_port()
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    addresses = {
        "drafter": f"127.0.0.1:{drafter_port}",
        "verifier": f"127.0.0.1:{verifier_port}",
        "gateway": f"http://127.0.0.1:{args.port}",
    }
    checks: dict[str, Callable[[], bool]] = {
        "drafter": lambda: is_serving(addresses["drafter"]),
        "verifier": lambda: is_serving(addresses["verifier"]),
        "gateway": lambda: http_ok(f"{addresses['gateway']}/health"),
    }
    with sigterm_unwinds():
        try:
            for name, argv in service_commands(args, target, drafter, drafter_port, verifier_port):
                child = subprocess.Popen(argv)
                children.append((name, child))
                wait_ready(name, child, checks[name], args.startup_timeout)
                print(f"ddtree serve: {name} ready (pid {child.pid}, {addresses[name]})",
                      flush=True)
            host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
            print(f"ddtree serve: OpenAI API at http://{host}:{args.port}/v1 "
                  f"(mode {args.mode}); Ctrl-C stops it", flush=True)
            return watch(children)
        except _Stop:
            return 0
        finally:
            stop_children(children)


def watch(children: list[tuple[str, subprocess.Popen[bytes]]]) -> int:
    """Blocks until a child exits; that is an error (the others are stopped by the caller)."""
    while True:
        for name, child in children:
            if child.poll() is not None:
                raise ChildDied(f"{name} exited with code {child.returncode}; stopping the others")
        time.sleep(0.5)
