"""`python -m ddtree.healthcheck HOST:PORT [--service NAME]`: exit 0 when the gRPC server
answers SERVING on grpc.health.v1, else 1. Used by compose healthchecks and `ddtree serve`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def is_serving(address: str, service: str = "", timeout_s: float = 2.0) -> bool:
    """One Check call with a deadline; any RPC error (not up yet, refused) counts as no."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=timeout_s,
                wait_for_ready=True,
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_until_serving(address: str, timeout_s: float, service: str = "") -> bool:
    """Polls `is_serving` until it answers yes or `timeout_s` passes (readiness, no sleeps
    beyond the RPC's own wait_for_ready)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if is_serving(address, service, timeout_s=min(2.0, left)):
            return True
        # NOT_SERVING answers come back at once: pace the loop instead of spinning.
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree.healthcheck", description=__doc__)
    parser.add_argument("address", help="HOST:PORT of the gRPC server")
    parser.add_argument("--service", default="", help="service name ('' = the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = parser.parse_args(argv)
    return 0 if is_serving(args.address, args.service, args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
