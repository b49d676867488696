"""The drafter service's one frozen configuration, built from flags whose defaults come
from environment variables (so compose sets everything through `environment:`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddtree.draft_socket import check_path
from ddtree.engine import MAX_BUDGET
from ddtree.service import GrpcSecurity, add_security_flags, parse_service_config, security_of


@dataclass(frozen=True)
class DrafterServiceConfig:
    drafter: str  # DFlash drafter checkpoint dir
    target: str  # target checkpoint dir (only its embedding + LM head are loaded)
    host: str = "127.0.0.1"  # loopback unless told otherwise (compose: 0.0.0.0 in its network)
    port: int = 50052  # 0 = any free port
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int = 0  # longest context a session's draft KV holds; 0 = the target's
    max_sessions: int = 64
    max_budget: int = 256  # largest tree a request may ask for
    # Draft streams open at once (each holds an RPC thread for its life), over all
    # verifiers, and per verifier connection; more are refused with RESOURCE_EXHAUSTED.
    max_streams: int = 8
    max_streams_per_peer: int = 2
    # A new session's first context (its prompt's features) replayed from CUDA graphs of
    # static token buckets instead of ~20 eager launches (GPU only; lease 23 measured
    # +9-14% at c8 and +3-4% at c1 through `ddtree serve`, docs/performance.md).
    context_graphs: bool = True
    # The Draft stream also on a Unix socket, for verifiers on this host (advertised in
    # GetInfo; ddtree/draft_socket.py): "auto" = $TMPDIR/ddtree-drafter-<port>.sock,
    # a path, or "" for none (gRPC only).
    local_socket: str = "auto"
    # A verifier on this host and GPU may share its round state over the local socket
    # (the shared draft link, drafter_svc/shared_round.py): the draft half then runs here
    # over the verifier's tables, with no features or trees through the socket.
    shared_draft: bool = True
    grpc_token: str = field(default="", repr=False)
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    is_reflection: bool = True
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_model_len < 0:
            raise ValueError(f"max_model_len must be >= 0, got {self.max_model_len}")
        security_of(self)  # validates the TLS files
        for name in ("max_sessions", "max_budget", "max_streams", "max_streams_per_peer"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.local_socket.lower() in ("none", "off"):
            object.__setattr__(self, "local_socket", "")
        if self.local_socket not in ("", "auto"):
            check_path(self.local_socket)
        if self.max_budget > MAX_BUDGET:
            raise ValueError(f"max_budget must be <= {MAX_BUDGET}, got {self.max_budget}")

    @property
    def security(self) -> GrpcSecurity:
        return security_of(self)


def _add_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    def get(name: str, default: str) -> str:
        return env.get(f"DDTREE_{name}", default)

    for flag in ("drafter", "target"):
        value = env.get(f"DDTREE_{flag.upper()}")
        parser.add_argument(f"--{flag}", default=value, required=not value)
    parser.add_argument("--host", default=get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(get("PORT", "50052")))
    parser.add_argument("--device", default=get("DEVICE", "auto"))
    parser.add_argument("--dtype", default=get("DTYPE", "auto"))
    parser.add_argument("--max-model-len", type=int, default=int(get("MAX_MODEL_LEN", "0")))
    parser.add_argument("--max-sessions", type=int, default=int(get("MAX_SESSIONS", "64")))
    parser.add_argument("--max-budget", type=int, default=int(get("MAX_BUDGET", "256")))
    parser.add_argument("--max-streams", type=int, default=int(get("MAX_STREAMS", "8")),
                        help="Draft streams open at once (all verifiers)")
    parser.add_argument("--max-streams-per-peer", type=int,
                        default=int(get("MAX_STREAMS_PER_PEER", "2")),
                        help="Draft streams one verifier connection may hold")
    parser.add_argument("--context-graphs", action=argparse.BooleanOptionalAction,
                        default=get("CONTEXT_GRAPHS", "1") != "0",
                        help="a new session's first context from CUDA graphs of static "
                             "token buckets (GPU; on by default; off: eager launches)")
    parser.add_argument("--local-socket", default=get("LOCAL_SOCKET", "auto"),
                        help="the Draft stream also on this Unix socket for verifiers on "
                             "this host ('auto': $TMPDIR/ddtree-drafter-<port>.sock; "
                             "'none': gRPC only)")
    parser.add_argument("--shared-draft", action=argparse.BooleanOptionalAction,
                        default=get("SHARED_DRAFT", "1") != "0",
                        help="let a verifier on this host and GPU share its round state "
                             "over the local socket (on by default)")
    add_security_flags(parser, env, is_server=True, is_client=False)
    parser.add_argument("--no-reflection", dest="is_reflection", action="store_false",
                        default=get("REFLECTION", "1") != "0", help="no server reflection")
    parser.add_argument("--log-level", default=get("LOG_LEVEL", "info"))


def parse_config(argv: Sequence[str] | None, environ: Mapping[str, str]) -> DrafterServiceConfig:
    """Flags override DDTREE_* environment variables, which override the defaults."""
    return parse_service_config(
        DrafterServiceConfig, "python -m drafter_svc", __doc__, _add_flags, argv, environ)
