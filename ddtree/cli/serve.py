"""`ddtree serve`: the three services on one machine (drafter, verifier, OpenAI gateway) as
supervised child processes, each started once the one it depends on answers its health
check. A child that dies is restarted with backoff: a dead drafter leaves the verifier
serving in ar until it is back; while a dead verifier restarts, the gateway's /health says
503 and requests that have no token yet wait for it (ddtree/cli/supervisor.py). Only
Ctrl-C / SIGTERM stops it (exit 0).

Ports are fixed (gateway 8000, verifier 50051, drafter 50052: what the README's curl and
grpcurl examples use), and everything binds loopback unless --host says otherwise for the
gateway. `--gateway-workers N` runs N gateway processes on that port (SO_REUSEPORT: the
kernel spreads connections over them, as vLLM's API server count); they share their
/metrics figures through a directory of prometheus_client's multiprocess mode, removed at
the end.
`--pid-dir DIR` keeps DIR/<service>.pid current across restarts (scripts/soak.py
kills the drafter through it). `--colocate-drafter` runs the drafter inside the verifier
process instead (two processes, one device, no gRPC hop per round). Secrets reach the
children through their environment (DDTREE_API_KEY, DDTREE_GRPC_TOKEN), never their
command lines. `--mps` (auto by default) runs the drafter and the verifier as clients of
a private MPS server when they share a GPU (ddtree/mps.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ddtree.cli.options import (
    DEFAULT_BUDGET,
    add_model_options,
    add_spec_options,
    resolve_pair_dirs,
)
from ddtree.cli.supervisor import Child, Supervisor, say
from ddtree.errors import DDTreeError
from ddtree.mps import MODES, MpsServer, decide

# How long a child may take to load its model and answer its health check.
DEFAULT_STARTUP_TIMEOUT_S = 600.0
LOOPBACK = "127.0.0.1"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="run drafter, verifier and OpenAI gateway locally")
    add_model_options(parser)
    add_spec_options(parser)
    parser.set_defaults(budget=None)  # min(DEFAULT_BUDGET, --max-budget) unless given
    parser.add_argument("--host", default=LOOPBACK, help="the gateway's bind address")
    parser.add_argument("--port", type=int, default=8000, help="the gateway's HTTP port")
    parser.add_argument("--gateway-workers", type=int, default=1,
                        help="gateway processes sharing the HTTP port (SO_REUSEPORT; any "
                             "answers /metrics for all)")
    parser.add_argument("--verifier-port", type=int, default=50051, help="loopback gRPC port")
    parser.add_argument("--drafter-port", type=int, default=50052, help="loopback gRPC port")
    parser.add_argument("--max-model-len", type=int, default=0, help="0 = the target's")
    parser.add_argument("--max-num-seqs", type=int, default=64,
                        help="generations holding a KV row at once (more wait in a queue)")
    parser.add_argument("--max-budget", type=int, default=256,
                        help="largest tree a request may ask for; the drafter warms its "
                             "graphs up to it (a smaller one starts faster); --budget "
                             f"defaults to the smaller of {DEFAULT_BUDGET} and this")
    parser.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                        help="batch-invariant GEMMs: every mode serves the ar tokens in bf16")
    parser.add_argument("--colocate-drafter", action="store_true",
                        help="run the drafter inside the verifier process, on its device (two "
                             "processes: no drafter service and no gRPC hop per round)")
    parser.add_argument("--drafter-gpu", type=int, default=None,
                        help="put the drafter on GPU I (cuda:I; default: --device)")
    parser.add_argument("--verifier-gpu", type=int, default=None,
                        help="put the verifier (the target) on GPU J (cuda:J; default: --device)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="shard the target over N GPUs (the verifier's follower ranks)")
    parser.add_argument("--verifier-gpus", default="",
                        help="GPU of each tensor-parallel rank, e.g. 0,1 (default 0..N-1)")
    parser.add_argument(
        "--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S, help="seconds"
    )
    parser.add_argument("--mps", choices=MODES, default=os.environ.get("DDTREE_MPS", "auto"),
                        help="run the drafter and the verifier as clients of a private CUDA "
                             "MPS server (auto: when they share a GPU and "
                             "nvidia-cuda-mps-control is there; env DDTREE_MPS)")
    parser.add_argument("--pid-dir", type=Path, default=None,
                        help="write serve.pid, drafter.pid, verifier.pid, gateway.pid here")
    parser.add_argument("--api-key", default=os.environ.get("DDTREE_API_KEY", ""),
                        help="require this Bearer key on /v1 (env DDTREE_API_KEY)")
    parser.add_argument("--grpc-token", default=os.environ.get("DDTREE_GRPC_TOKEN", ""),
                        help="shared token of the gRPC links (env DDTREE_GRPC_TOKEN)")
    parser.set_defaults(func=run)


def default_budget(args: argparse.Namespace) -> int:
    """--budget, or the usual default within --max-budget when not given."""
    return args.budget if args.budget is not None else min(DEFAULT_BUDGET, args.max_budget)


def service_commands(args: argparse.Namespace, target: str, drafter: str | None
                     ) -> list[tuple[str, list[str]]]:
    """(name, argv) of each child in start order; no drafter in ar mode, none as a service
    with --colocate-drafter (the verifier runs it)."""
    python = sys.executable

    def placed(gpu: int | None) -> list[str]:
        return ["--target", target, "--device", placement(args, gpu), "--dtype", args.dtype]

    commands = []
    colocated = drafter is not None and args.colocate_drafter
    if drafter is not None and not colocated:
        commands.append(("drafter", [
            python, "-m", "drafter_svc", "--drafter", drafter, *placed(args.drafter_gpu),
            "--host", LOOPBACK, "--port", str(args.drafter_port),
            "--max-model-len", str(args.max_model_len),
            # One session per verifier row: the drafter's pool and the batch sizes its
            # start-up warms follow the verifier's (64 rows by default; lease 19 saw a
            # 203 s warm-up of batches up to 64 behind --max-num-seqs 8).
            "--max-sessions", str(args.max_num_seqs), "--max-budget", str(args.max_budget),
        ]))
    verifier = [
        python, "-m", "verifier_svc", *placed(args.verifier_gpu), "--host", LOOPBACK,
        "--port", str(args.verifier_port), "--mode", args.mode,
        "--budget", str(default_budget(args)),
        "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
        "--max-budget", str(args.max_budget),
        "--batch-invariant" if args.batch_invariant else "--no-batch-invariant",
    ]
    if args.max_topk:
        verifier += ["--max-topk", str(args.max_topk)]
    if args.tensor_parallel_size != 1:
        verifier += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    if args.verifier_gpus:
        verifier += ["--verifier-gpus", args.verifier_gpus]
    if colocated:
        verifier += ["--local-drafter", str(drafter)]
    elif drafter is not None:
        verifier += ["--drafter-addr", f"{LOOPBACK}:{args.drafter_port}"]
    commands.append(("verifier", verifier))
    gateway = [python, "-m", "gateway", "--verifier-addr", f"{LOOPBACK}:{args.verifier_port}",
               "--host", args.host, "--port", str(args.port), "--target", target]
    workers = args.gateway_workers
    for worker in range(workers):
        name = "gateway" if worker == 0 else f"gateway-{worker + 1}"
        commands.append((name, [*gateway, "--reuse-port"] if workers > 1 else gateway))
    return commands


def placement(args: argparse.Namespace, gpu: int | None) -> str:
    return f"cuda:{gpu}" if gpu is not None else args.device


def shares_gpu(args: argparse.Namespace, drafter: str | None) -> bool:
    """A drafter service and the verifier (one rank) on one device."""
    return (drafter is not None and not args.colocate_drafter
            and args.tensor_parallel_size == 1
            and placement(args, args.drafter_gpu) == placement(args, args.verifier_gpu))


def http_ok(url: str, timeout_s: float = 2.0, pid: int | None = None) -> bool:
    """A 200 from url (with `pid`: from that gateway process, which says so in a header;
    several may share the port, and any may answer a connection)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return bool(reply.status == 200) and (
                pid is None or reply.headers.get("x-ddtree-gateway-pid") == str(pid))
    except (urllib.error.URLError, OSError):
        return False


def gateway_ready(url: str, child: Child) -> bool:
    """This gateway process (not another on the same port) answers /health with 200."""
    return child.process is not None and http_ok(url, pid=child.process.pid)


def child_env(args: argparse.Namespace) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name, value in (("DDTREE_API_KEY", args.api_key), ("DDTREE_GRPC_TOKEN", args.grpc_token)):
        if value:
            env[name] = value
    return env


def check_dirs(target: str, drafter: str | None) -> None:
    """A path that is not there is an error here, not a download attempt in a child."""
    for kind, path in (("target", target), ("drafter", drafter)):
        if path is not None and not Path(path).is_dir():
            raise DDTreeError(f"{kind} checkpoint directory {path} does not exist")


def run(args: argparse.Namespace) -> int:
    # Imported here so `ddtree generate` / `bench` run where grpc's health package is absent.
    from ddtree.healthcheck import is_serving

    if args.gateway_workers < 1:
        raise DDTreeError(f"--gateway-workers must be >= 1, got {args.gateway_workers}")
    if args.colocate_drafter and (args.drafter_gpu is not None
                                  or args.tensor_parallel_size != 1):
        raise DDTreeError("--colocate-drafter runs the drafter on the verifier's device: "
                          "it excludes --drafter-gpu and --tensor-parallel-size > 1")
    budget = default_budget(args)
    if not 1 <= budget <= args.max_budget:
        raise DDTreeError(f"--budget must be in [1, --max-budget {args.max_budget}], "
                          f"got {budget}")
    target, drafter = resolve_pair_dirs(args, need_drafter=args.mode != "ar")
    check_dirs(target, drafter)
    gateway_url = f"http://{LOOPBACK if args.host in ('0.0.0.0', '::') else args.host}:{args.port}"
    addresses = {"drafter": f"{LOOPBACK}:{args.drafter_port}",
                 "verifier": f"{LOOPBACK}:{args.verifier_port}", "gateway": gateway_url}
    checks: dict[str, Callable[[], bool]] = {
        "drafter": lambda: is_serving(addresses["drafter"]),
        "verifier": lambda: is_serving(addresses["verifier"]),
    }
    children = []
    # Several gateway processes share their /metrics figures here (multiprocess mode).
    metrics_dir = (tempfile.mkdtemp(prefix="ddtree-gateway-metrics-")
                   if args.gateway_workers > 1 else None)
    for name, argv in service_commands(args, target, drafter):
        service = name.split("-")[0]  # gateway-2, ... are gateway processes too
        child = Child(name, argv, checks.get(service, lambda: False), addresses[service])
        if service == "gateway":
            child.is_ready = functools.partial(gateway_ready, f"{gateway_url}/health", child)
            if metrics_dir is not None:
                child.env = {"PROMETHEUS_MULTIPROC_DIR": metrics_dir}
                child.on_exit = functools.partial(forget_gateway, metrics_dir)
        children.append(child)
    try:
        return supervise(args, children, gateway_url, drafter)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def forget_gateway(metrics_dir: str, pid: int) -> None:
    """A dead gateway process's live gauges (its requests in flight) leave /metrics; its
    counters and histograms stay in the sums."""
    from prometheus_client.multiprocess import mark_process_dead

    mark_process_dead(pid, metrics_dir)


def supervise(args: argparse.Namespace, children: list[Child], gateway_url: str,
              drafter: str | None) -> int:
    env = child_env(args)
    device = placement(args, args.verifier_gpu)
    start_mps, why = decide(args.mps, device, shares_gpu(args, drafter), env)
    if not start_mps:
        if args.mps != "off" and device != "cpu":
            say(f"no MPS server: {why}")
        return Supervisor(children, env, args.startup_timeout, args.pid_dir,
                          banner(args, gateway_url, mps=False)).run()
    with MpsServer(device, required=args.mps == "on", base_env=env) as mps:
        return Supervisor(children, {**env, **mps.env}, args.startup_timeout, args.pid_dir,
                          banner(args, gateway_url, mps=bool(mps.env))).run()


def banner(args: argparse.Namespace, gateway_url: str, mps: bool) -> str:
    under = ", under an MPS server" if mps else ""
    return f"OpenAI API at {gateway_url}/v1 (mode {args.mode}{under}); Ctrl-C stops it"
