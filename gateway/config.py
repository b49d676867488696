"""The gateway's one frozen configuration, built from flags whose defaults come from
DDTREE_* environment variables (so compose sets everything through `environment:`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from ddtree.service import GrpcSecurity, add_security_flags, security_of

Granularity = Literal["round", "token"]
GRANULARITIES: tuple[str, ...] = get_args(Granularity)
ReasoningSetting = Literal["auto", "on", "off"]


# Bodies past this are refused (413) before they are read: a chat of a few MiB is already
# far longer than most models' context; tokenizing 50 MB froze the event loop for minutes.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class GatewayConfig:
    verifier_addr: str  # HOST:PORT of verifier_svc
    tokenizer: str  # dir holding the target's tokenizer and chat template
    host: str = "127.0.0.1"  # loopback unless told otherwise (compose: 0.0.0.0 in its network)
    port: int = 8000
    # Bind with SO_REUSEPORT, so that several gateway processes share the port (the kernel
    # spreads connections over them: `ddtree serve --gateway-workers N`).
    reuse_port: bool = False
    model_name: str = ""  # the id clients send as `model`; "" = the tokenizer dir's name
    # "round": one SSE event per verify round (several tokens); "token": one per token, for
    # benchmark tools that count chunks. A request may override it (`ddtree.stream_granularity`).
    stream_granularity: Granularity = "round"
    # Round granularity: the verifier messages that arrived while the last event was being
    # sent go out as one event (a busy gateway sends fewer, larger events); off: one each.
    merge_when_behind: bool = True
    # Generations share one GenerateMany stream to the verifier (one message per round for
    # all of them); off: a Generate call each.
    shared_stream: bool = True
    # ... over the verifier's Unix socket when it advertises one this process can open
    # (a verifier on this host; the same messages without gRPC's CPU a message).
    verifier_socket: bool = True
    max_n: int = 16  # largest `n` (x prompts) one request may ask for
    request_timeout_s: float = 600.0  # deadline of one generation
    rpc_timeout_s: float = 5.0  # deadline of Abort and GetModelInfo
    stats_timeout_s: float = 1.0  # deadline of the health check and GetStats (/health, /metrics)
    # A Generate that has produced no token yet is retried while the verifier answers
    # UNAVAILABLE (restarting), up to this many tries and this long.
    retry_attempts: int = 30
    retry_timeout_s: float = 60.0
    # "auto": split <think>...</think> when the tokenizer has both tags as tokens.
    reasoning: ReasoningSetting = "auto"
    api_key: str = field(default="", repr=False)  # "" = no authentication on /v1
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    header_timeout_s: float = 10.0  # a client must send its request head within this
    body_timeout_s: float = 30.0  # ... and its body within this
    grpc_token: str = field(default="", repr=False)  # sent to the verifier on every call
    tls_ca: str = ""  # TLS to the verifier, trusting this CA
    tls_cert: str = ""  # client certificate for mutual TLS
    tls_key: str = ""
    tls_server_name: str = ""
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.verifier_addr or ":" not in self.verifier_addr:
            raise ValueError(f"verifier_addr must be HOST:PORT, got {self.verifier_addr!r}")
        if not self.tokenizer:
            raise ValueError("a tokenizer directory is required (--target or --tokenizer)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.stream_granularity not in GRANULARITIES:
            raise ValueError(f"stream_granularity must be one of {GRANULARITIES}")
        if self.reasoning not in ("auto", "on", "off"):
            raise ValueError(f"reasoning must be auto, on or off, got {self.reasoning!r}")
        if self.max_n < 1 or self.retry_attempts < 1 or self.max_request_bytes < 1:
            raise ValueError("max_n, retry_attempts and max_request_bytes must be >= 1")
        timeouts = (self.request_timeout_s, self.rpc_timeout_s, self.stats_timeout_s,
                    self.header_timeout_s, self.body_timeout_s)
        if min(timeouts) <= 0 or self.retry_timeout_s < 0:
            raise ValueError("timeouts must be > 0")
        security_of(self)  # validates the TLS files

    @property
    def security(self) -> GrpcSecurity:
        return security_of(self)


def _add_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    def get(name: str, default: str) -> str:
        return env.get(f"DDTREE_{name}", default)

    addr = env.get("DDTREE_VERIFIER_ADDR")
    parser.add_argument("--verifier-addr", default=addr, required=not addr)
    parser.add_argument("--target", default=get("TARGET", ""), help="target checkpoint dir")
    parser.add_argument(
        "--tokenizer", default=get("TOKENIZER", ""), help="tokenizer dir (default: --target)"
    )
    parser.add_argument("--host", default=get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(get("PORT", "8000")))
    parser.add_argument("--reuse-port", action=argparse.BooleanOptionalAction,
                        default=get("REUSE_PORT", "0") != "0",
                        help="bind with SO_REUSEPORT: several gateway processes share the "
                             "port, the kernel spreads connections over them")
    model_name = get("MODEL_NAME", get("MODEL_ID", ""))
    parser.add_argument("--model-name", default=model_name)
    parser.add_argument(
        "--stream-granularity", choices=GRANULARITIES, default=get("STREAM_GRANULARITY", "round")
    )
    parser.add_argument("--merge-when-behind", action=argparse.BooleanOptionalAction,
                        default=get("MERGE_WHEN_BEHIND", "1") != "0",
                        help="round granularity: messages that queued while the last event "
                             "was sent go out as one event (default on)")
    parser.add_argument("--shared-stream", action=argparse.BooleanOptionalAction,
                        default=get("SHARED_STREAM", "1") != "0",
                        help="generations share one GenerateMany stream to the verifier: "
                             "one message per round for all (default on); off: a Generate "
                             "call each")
    parser.add_argument("--verifier-socket", action=argparse.BooleanOptionalAction,
                        default=get("VERIFIER_SOCKET", "1") != "0",
                        help="the shared stream over the verifier's Unix socket when it "
                             "advertises one this process can open (a verifier on this "
                             "host; default on); else over gRPC")
    parser.add_argument("--max-n", type=int, default=int(get("MAX_N", "16")))
    parser.add_argument(
        "--request-timeout-s", type=float, default=float(get("REQUEST_TIMEOUT_S", "600"))
    )
    parser.add_argument("--rpc-timeout-s", type=float, default=float(get("RPC_TIMEOUT_S", "5")))
    parser.add_argument("--stats-timeout-s", type=float,
                        default=float(get("STATS_TIMEOUT_S", "1")))
    parser.add_argument("--retry-attempts", type=int, default=int(get("RETRY_ATTEMPTS", "30")))
    parser.add_argument("--retry-timeout-s", type=float,
                        default=float(get("RETRY_TIMEOUT_S", "60")),
                        help="how long a request with no token yet waits for a restarting "
                             "verifier")
    parser.add_argument(
        "--reasoning", choices=("auto", "on", "off"), default=get("REASONING", "auto")
    )
    parser.add_argument("--api-key", default=get("API_KEY", ""),
                        help="require `Authorization: Bearer KEY` on /v1 (env DDTREE_API_KEY)")
    parser.add_argument("--max-request-bytes", type=int,
                        default=int(get("MAX_REQUEST_BYTES", str(DEFAULT_MAX_REQUEST_BYTES))))
    parser.add_argument("--header-timeout-s", type=float,
                        default=float(get("HEADER_TIMEOUT_S", "10")))
    parser.add_argument("--body-timeout-s", type=float, default=float(get("BODY_TIMEOUT_S", "30")))
    add_security_flags(parser, env, is_server=False, is_client=True)
    parser.add_argument("--log-level", default=get("LOG_LEVEL", "info"))


def parse_config(argv: Sequence[str] | None, environ: Mapping[str, str]) -> GatewayConfig:
    """Flags override DDTREE_* environment variables, which override the defaults."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    _add_flags(parser, environ)
    args = vars(parser.parse_args(argv))
    target = args.pop("target")
    args["tokenizer"] = args["tokenizer"] or target
    if args["tokenizer"] and not Path(args["tokenizer"]).is_dir():
        # Never read as a hub name: the gateway downloads nothing at run time.
        parser.error(f"tokenizer directory {args['tokenizer']} does not exist "
                     "(--target / --tokenizer take a local checkpoint directory)")
    try:
        return GatewayConfig(**args)
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
