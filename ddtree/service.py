"""What every ddtree gRPC process shares: channel/server options (message limits,
keepalive), the grpc.health.v1 + reflection registration, and JSON logs.

The 4 MiB gRPC default breaks prefill feature transfers (SERVING.md: a 4K-token prompt's
features are ~160 MB), so both ends of every channel raise the limits; keepalive on both
ends finds a dead peer of the long-lived Draft stream in seconds instead of minutes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

MAX_MESSAGE_BYTES = 256 * 1024 * 1024

_MESSAGE_LIMITS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

SERVER_OPTIONS: list[tuple[str, int]] = _MESSAGE_LIMITS + [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Accept the clients' pings below (the default 5-minute minimum would GOAWAY them).
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]

CHANNEL_OPTIONS: list[tuple[str, int]] = _MESSAGE_LIMITS + [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a peer restart (the default backoff starts at 1 s, grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
]


def add_health_and_reflection(
    server: grpc.Server, service_names: Sequence[str]
) -> health.HealthServicer:
    """Registers grpc.health.v1 (overall "" and per service) and reflection (grpcurl).

    Every service starts NOT_SERVING; the caller flips it with `set_serving` once ready.
    """
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *service_names):
        servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    reflection.enable_server_reflection(
        (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return servicer


def set_serving(servicer: health.HealthServicer, service_names: Sequence[str]) -> None:
    for name in ("", *service_names):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)


def configure_logging(level: str = "info") -> None:
    """structlog -> one JSON object per line on stderr (what log shippers expect)."""
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def serve_until_signalled(server: grpc.Server, name: str, grace_s: float) -> None:
    """Blocks until SIGINT / SIGTERM, then stops `server`, giving in-flight RPCs `grace_s`."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    structlog.get_logger(name).info("stopping", service=name)
    server.stop(grace_s).wait()


ConfigT = TypeVar("ConfigT")


def parse_service_config(
    config_type: Callable[..., ConfigT], prog: str, description: str | None,
    add_flags: Callable[[argparse.ArgumentParser, Mapping[str, str]], None],
    argv: Sequence[str] | None, environ: Mapping[str, str],
) -> ConfigT:
    """Flags override DDTREE_* environment variables, which override the defaults; the
    frozen config's own validation errors become usage errors (exit 2)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_flags(parser, environ)
    args: dict[str, Any] = vars(parser.parse_args(argv))
    try:
        return config_type(**args)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
