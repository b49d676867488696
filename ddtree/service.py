"""What every ddtree gRPC process shares: channel/server options (message limits,
keepalive), the grpc.health.v1 + reflection registration, JSON logs, and the security of
every link: a shared token in the `authorization` metadata (checked by a server
interceptor; health checks exempt), optional TLS (server certificate, client CA for mutual
TLS) and the channels clients open with both.

The 4 MiB gRPC default breaks prefill feature transfers (SERVING.md: a 4K-token prompt's
features are ~160 MB), so both ends of every channel raise the limits; keepalive on both
ends finds a dead peer of the long-lived Draft stream in seconds instead of minutes.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ddtree.signals import SignalStop

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
    # A second server on a busy port must fail to bind, not share the port's traffic.
    ("grpc.so_reuseport", 0),
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
    server: grpc.Server, service_names: Sequence[str], is_reflection: bool = True
) -> health.HealthServicer:
    """Registers grpc.health.v1 (overall "" and per service) and, unless switched off,
    reflection (grpcurl).

    Every service starts NOT_SERVING; the caller flips it with `set_serving` once ready.
    """
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *service_names):
        servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if is_reflection:
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


# The GIL switch interval of the service processes (seconds; Python's default is 0.005).
# A thread that wakes from a blocking call (the engine thread when the drafter's trees
# arrive, a stream's writer when a round's tokens do, the gateway's stream reader when a
# message does) waits for the GIL up to this long while another thread runs Python: once
# per handoff, several times per round. 0.5 ms since lease 41: on the H100's 16 cores, ar
# at c8 through `ddtree serve` had the verifier's messages reach the gateway's loop 10-13
# ms after they were built at 5 ms and ~2 ms at 0.5 ms (0.81-0.83x of in process -> 0.84-0.89x;
# on a 2-core sandbox, where a process's threads share one core, no difference).
GIL_SWITCH_INTERVAL_ENV = "DDTREE_GIL_SWITCH_INTERVAL_S"
DEFAULT_GIL_SWITCH_INTERVAL_S = 0.0005


def configure_threads(environ: Mapping[str, str]) -> float:
    """Sets the process's GIL switch interval from DDTREE_GIL_SWITCH_INTERVAL_S (or the
    default); -> the interval set. Raises ValueError for a value that is not > 0."""
    raw = environ.get(GIL_SWITCH_INTERVAL_ENV, "").strip()
    interval = float(raw) if raw else DEFAULT_GIL_SWITCH_INTERVAL_S
    if not interval > 0:
        raise ValueError(f"{GIL_SWITCH_INTERVAL_ENV} must be > 0 seconds, got {raw!r}")
    sys.setswitchinterval(interval)
    return interval


class Stoppable(Protocol):
    """A server `serve_until_signalled` stops: a grpc.Server, or one that wraps it."""

    def stop(self, grace: float | None) -> threading.Event: ...


def serve_until_signalled(server: Stoppable, name: str, grace_s: float) -> None:
    """Blocks until SIGINT / SIGTERM, then stops `server`, giving in-flight RPCs `grace_s`."""
    stop = SignalStop()
    stop.install()
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


# ------------------------------------------------------------------ security of the links

AUTH_HEADER = "authorization"  # "Bearer <token>", as grpc.access_token_call_credentials sends
# Health checks stay open: compose, load balancers and `ddtree serve` probe without secrets.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)


@dataclass(frozen=True)
class GrpcSecurity:
    """How one process secures its gRPC links (every field optional; all empty = plaintext,
    no token: fine on loopback, which is every service's default bind address).

    token: shared secret every RPC (but health checks) must carry as `Bearer <token>`.
    tls_cert / tls_key: PEM files; a server's certificate, or a client's for mutual TLS.
    tls_client_ca: servers only; require client certificates signed by this CA.
    tls_ca: clients only; speak TLS and trust this CA for the server's certificate.
    tls_server_name: clients only; the name the server's certificate must carry when it is
        not the host being dialled (a health check of 127.0.0.1 in a container).
    """

    token: str = field(default="", repr=False)
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    tls_ca: str = ""
    tls_server_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        for name in ("tls_cert", "tls_key", "tls_client_ca", "tls_ca"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"--{name.replace('_', '-')} {path}: no such file")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca needs the server's --tls-cert and --tls-key")

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata a client sends on every RPC."""
        return ((AUTH_HEADER, f"Bearer {self.token}"),) if self.token else ()


SECURITY_FIELDS = ("token", "tls_cert", "tls_key", "tls_client_ca", "tls_ca", "tls_server_name")


def add_security_flags(
    parser: argparse.ArgumentParser, env: Mapping[str, str], is_server: bool, is_client: bool
) -> None:
    """--grpc-token, TLS files (DDTREE_GRPC_TOKEN, DDTREE_TLS_*); a token is best passed
    through the environment (argv is visible to every local user)."""
    group = parser.add_argument_group("gRPC security")
    group.add_argument("--grpc-token", default=env.get("DDTREE_GRPC_TOKEN", ""),
                       help="shared secret of the gRPC links (env DDTREE_GRPC_TOKEN)")
    group.add_argument("--tls-cert", default=env.get("DDTREE_TLS_CERT", ""),
                       help="PEM certificate (server; client certificate for mutual TLS)")
    group.add_argument("--tls-key", default=env.get("DDTREE_TLS_KEY", ""),
                       help="PEM private key of --tls-cert")
    if is_server:
        group.add_argument("--tls-client-ca", default=env.get("DDTREE_TLS_CLIENT_CA", ""),
                           help="require client certificates signed by this CA (mutual TLS)")
    if is_client:
        group.add_argument("--tls-ca", default=env.get("DDTREE_TLS_CA", ""),
                           help="connect with TLS, trusting this CA for the server")
        group.add_argument("--tls-server-name", default=env.get("DDTREE_TLS_SERVER_NAME", ""),
                           help="name the server's certificate carries (default: its host)")


def security_of(config: Any) -> GrpcSecurity:
    """The GrpcSecurity of a config holding the flags above (`grpc_token`, `tls_*`)."""
    values = {name: getattr(config, "grpc_token" if name == "token" else name, "")
              for name in SECURITY_FIELDS}
    return GrpcSecurity(**values)


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every RPC (but health checks) whose metadata lacks `Bearer <token>` with
    UNAUTHENTICATED, before the servicer runs."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def _is_allowed(self, details: grpc.HandlerCallDetails) -> bool:
        method = getattr(details, "method", "") or ""
        if method.startswith(UNAUTHENTICATED_PREFIXES):
            return True
        for key, value in getattr(details, "invocation_metadata", None) or ():
            given = value.encode() if isinstance(value, str) else bytes(value)
            if key == AUTH_HEADER and hmac.compare_digest(given, self._expected):
                return True
        return False

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or self._is_allowed(handler_call_details):
            return handler
        return _refusing(handler)


def _refuse(request: Any, context: grpc.ServicerContext) -> Any:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong gRPC token")


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that refuses at once (a bidi stream is
    refused before the client's first message)."""
    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_refuse, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_refuse, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refuse, **kwargs)
    return grpc.unary_unary_rpc_method_handler(_refuse, **kwargs)


def server_interceptors(security: GrpcSecurity) -> list[grpc.ServerInterceptor]:
    return [TokenInterceptor(security.token)] if security.token else []


def add_port(server: grpc.Server, host: str, port: int, security: GrpcSecurity) -> int:
    """Binds `host:port` (TLS when a certificate is set) -> the bound port; raises OSError."""
    address = f"{host}:{port}"
    if security.tls_cert:
        credentials = grpc.ssl_server_credentials(
            [(_read(security.tls_key), _read(security.tls_cert))],
            root_certificates=_read(security.tls_client_ca),
            require_client_auth=bool(security.tls_client_ca),
        )
        bound = server.add_secure_port(address, credentials)
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind {address}")
    return int(bound)


def channel_credentials(security: GrpcSecurity) -> grpc.ChannelCredentials | None:
    """TLS credentials of a client (None: plaintext)."""
    if not security.tls_ca:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(security.tls_ca), private_key=_read(security.tls_key),
        certificate_chain=_read(security.tls_cert))


class _TokenMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                     grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call of a sync channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or ()), *self._metadata])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def open_channel(
    address: str, security: GrpcSecurity | None = None,
    options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS,
) -> grpc.Channel:
    """A sync channel to `address` speaking TLS and sending the token as `security` says."""
    security = security or GrpcSecurity()
    credentials = channel_credentials(security)
    options = _with_server_name(options, security)
    channel = (grpc.secure_channel(address, credentials, options=options)
               if credentials is not None else grpc.insecure_channel(address, options=options))
    if security.token:
        return grpc.intercept_channel(channel, _TokenMetadata(security.metadata))
    return channel


def open_aio_channel(
    address: str, security: GrpcSecurity | None = None,
    options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS,
) -> grpc.aio.Channel:
    """An asyncio channel; its calls carry `security.metadata` themselves (per call)."""
    security = security or GrpcSecurity()
    credentials = channel_credentials(security)
    options = _with_server_name(options, security)
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=options)
    return grpc.aio.insecure_channel(address, options=options)


def _with_server_name(
    options: Sequence[tuple[str, Any]], security: GrpcSecurity
) -> list[tuple[str, Any]]:
    if security.tls_ca and security.tls_server_name:
        return [*options, ("grpc.ssl_target_name_override", security.tls_server_name)]
    return list(options)
