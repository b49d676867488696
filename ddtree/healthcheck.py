"""`python -m ddtree.healthcheck HOST:PORT [--service NAME]`: exit 0 when the gRPC server
answers SERVING on grpc.health.v1, else 1. Used by compose healthchecks and `ddtree serve`.
Health checks need no token; a TLS server is checked over TLS (--tls-ca, DDTREE_TLS_CA).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ddtree.service import GrpcSecurity, open_channel


def is_serving(address: str, service: str = "", timeout_s: float = 2.0,
               security: GrpcSecurity | None = None) -> bool:
    """One Check call with a deadline; any RPC error (not up yet, refused) counts as no."""
    with open_channel(address, security, options=()) as channel:
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


def wait_until_serving(address: str, timeout_s: float, service: str = "",
                       security: GrpcSecurity | None = None) -> bool:
    """Polls `is_serving` until it answers yes or `timeout_s` passes (readiness, no sleeps
    beyond the RPC's own wait_for_ready)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if is_serving(address, service, timeout_s=min(2.0, left), security=security):
            return True
        # NOT_SERVING answers come back at once: pace the loop instead of spinning.
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree.healthcheck", description=__doc__)
    parser.add_argument("address", help="HOST:PORT of the gRPC server")
    parser.add_argument("--service", default="", help="service name ('' = the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    parser.add_argument("--tls-ca", default=os.environ.get("DDTREE_TLS_CA", ""),
                        help="check over TLS, trusting this CA (env DDTREE_TLS_CA)")
    parser.add_argument("--tls-server-name",
                        default=os.environ.get("DDTREE_TLS_SERVER_NAME", ""),
                        help="the name in the server's certificate")
    args = parser.parse_args(argv)
    # Under mutual TLS the service's own certificate doubles as the checker's.
    cert, key = os.environ.get("DDTREE_TLS_CERT", ""), os.environ.get("DDTREE_TLS_KEY", "")
    if not args.tls_ca:
        cert = key = ""
    security = GrpcSecurity(tls_ca=args.tls_ca, tls_server_name=args.tls_server_name,
                            tls_cert=cert, tls_key=key)
    return 0 if is_serving(args.address, args.service, args.timeout, security) else 1


if __name__ == "__main__":
    sys.exit(main())
