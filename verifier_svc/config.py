"""The verifier service's one frozen configuration, built from flags whose defaults come
from environment variables (so compose sets everything through `environment:`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddtree.draft_socket import check_path
from ddtree.engine import MAX_BUDGET, MODES, EngineConfig, Mode, SpecParams
from ddtree.service import GrpcSecurity, add_security_flags, parse_service_config, security_of


@dataclass(frozen=True)
class VerifierServiceConfig:
    target: str  # target checkpoint dir
    drafter_addr: str = ""  # HOST:PORT of drafter_svc; "" = no drafter (ar only)
    # A drafter checkpoint run inside this process, on the target's device (one GPU, no
    # drafter service and no hop); excludes drafter_addr. "" = none.
    local_drafter: str = ""
    host: str = "127.0.0.1"
    port: int = 50051  # 0 = any free port
    device: str = "auto"
    dtype: str = "auto"
    mode: Mode = "auto"  # server default (load-following); a request may override it
    budget: int = 32
    max_topk: int | None = None
    max_budget: int = 256  # largest tree a request (or a Verify client) may send
    max_model_len: int = 0  # 0 = the target's max_position_embeddings
    max_num_seqs: int = 64  # generations + OpenSession sessions holding a KV row at once
    max_queue: int = 1024  # requests waiting for a row; more get RESOURCE_EXHAUSTED
    kv_memory_gib: float = 0.0  # the KV pool's budget; 0 = auto (half the free GPU memory)
    cuda_graphs: bool = True  # capture each round shape in a CUDA graph (GPU only)
    batch_invariant: bool = True  # batch-invariant GEMMs: every mode exact in bf16 (GPU)
    max_prefill_tokens: int = 8192  # prompt tokens prefilled per engine step
    # The batch's halves take turns with the drafter (one verifies while the other's trees
    # are drafted); off by default: measured slower on the H200.
    alternate: bool = False
    # Each round's next trees are asked for right after its harvest (the drafter drafts
    # while the verifier delivers, admits and launches).
    send_ahead: bool = True
    # The Draft stream over the drafter's Unix socket when it advertises one this host
    # can open (same messages, without gRPC's threads); gRPC otherwise.
    drafter_socket: bool = True
    # ... and, with the drafter on this GPU, share the engine's round state with it (the
    # shared draft link: the draft half runs there over this process's tables, nothing
    # but 9 bytes through the socket a round); off or unavailable: the Draft stream.
    drafter_shared: bool = True
    # GenerateMany also on this Unix socket (advertised in ModelInfo) for a gateway on this
    # host: the same messages without gRPC's ~100-150 us of CPU a message on each side.
    # "auto" = $TMPDIR/ddtree-verifier-<port>.sock, "off" = none.
    generate_socket: str = "auto"
    session_idle_timeout_s: float = 60.0  # an unused OpenSession session is closed
    draft_timeout_s: float = 10.0  # the most a round waits for the drafter's reply
    # ... when the drafter has not answered that (rows, tree nodes) shape yet (it compiles)
    draft_new_shape_timeout_s: float = 60.0
    connect_timeout_s: float = 5.0  # drafter GetInfo at start-up and per reconnect try
    model_id: str = ""  # "" = the target directory's name
    tensor_parallel_size: int = 1  # ranks sharing the target (N-1 follower processes)
    verifier_gpus: str = ""  # "0,1": rank i on cuda:<i-th>; "" = cuda:0..N-1 (or the CPU)
    # gRPC security: the token every caller (gateway, Verify clients) must send and the
    # verifier sends the drafter; TLS files (server side, and tls_ca for the drafter link).
    grpc_token: str = field(default="", repr=False)
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    tls_ca: str = ""
    tls_server_name: str = ""
    is_reflection: bool = True
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.local_drafter and self.drafter_addr:
            raise ValueError("--local-drafter and --drafter-addr exclude each other: the "
                             "drafter runs either in this process or behind its service")
        if self.local_drafter and self.tensor_parallel_size > 1:
            raise ValueError("--local-drafter runs with --tensor-parallel-size 1 only")
        if self.mode != "ar" and not (self.drafter_addr or self.local_drafter):
            raise ValueError(f"mode {self.mode!r} needs --drafter-addr or --local-drafter "
                             "(or use --mode ar)")
        if not 1 <= self.max_budget <= MAX_BUDGET:
            raise ValueError(f"max_budget must be in [1, {MAX_BUDGET}], got {self.max_budget}")
        if not 1 <= self.budget <= self.max_budget:  # whatever the default mode: a request
            raise ValueError(                        # may switch to tree with this budget
                f"budget must be in [1, max_budget {self.max_budget}], got {self.budget}")
        if self.max_num_seqs < 1 or self.max_model_len < 0 or self.max_queue < 0:
            raise ValueError("max_num_seqs must be >= 1, max_queue and max_model_len >= 0")
        if self.kv_memory_gib < 0 or self.session_idle_timeout_s <= 0:
            raise ValueError("kv_memory_gib must be >= 0 and session_idle_timeout_s > 0")
        if (self.draft_timeout_s <= 0 or self.connect_timeout_s <= 0
                or self.draft_new_shape_timeout_s <= 0):
            raise ValueError("timeouts must be > 0")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.generate_socket.lower() in ("none", "off"):
            object.__setattr__(self, "generate_socket", "")
        if self.generate_socket not in ("", "auto"):
            check_path(self.generate_socket)
        security_of(self)  # validates the TLS files
        try:
            self.default_spec.validate(self.max_budget)
        except ValueError as exc:
            raise ValueError(f"server default spec: {exc}") from exc

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            max_num_seqs=self.max_num_seqs, max_queue=self.max_queue,
            max_model_len=self.max_model_len, kv_memory_bytes=int(self.kv_memory_gib * 2**30),
            # The followers receive each forward's inputs from the host: TP runs eagerly.
            max_budget=self.max_budget,
            cuda_graphs=self.cuda_graphs and self.tensor_parallel_size == 1,
            invariant=self.batch_invariant, max_prefill_tokens=self.max_prefill_tokens,
            alternate=self.alternate, send_ahead=self.send_ahead)

    @property
    def security(self) -> GrpcSecurity:
        return security_of(self)

    @property
    def default_spec(self) -> SpecParams:
        return SpecParams(mode=self.mode, budget=self.budget, max_topk=self.max_topk)


def _topk(value: str) -> int | None:
    """0 (the wire's and the environment's "unset") means no branching cap."""
    return int(value) or None


def _add_flags(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    def get(name: str, default: str) -> str:
        return env.get(f"DDTREE_{name}", default)

    target = env.get("DDTREE_TARGET")
    parser.add_argument("--target", default=target, required=not target)
    parser.add_argument("--drafter-addr", default=get("DRAFTER_ADDR", ""))
    parser.add_argument("--local-drafter", default=get("LOCAL_DRAFTER", ""),
                        help="a drafter checkpoint run inside this process on the target's "
                             "device (no drafter service, no hop); excludes --drafter-addr")
    parser.add_argument("--host", default=get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(get("PORT", "50051")))
    parser.add_argument("--device", default=get("DEVICE", "auto"))
    parser.add_argument("--dtype", default=get("DTYPE", "auto"))
    parser.add_argument("--mode", choices=MODES, default=get("MODE", "auto"),
                        help="default mode of requests that name none (auto: the policy picks "
                             "ar, the chain or a tree size per row from measured acceptance "
                             "and round cost)")
    parser.add_argument("--budget", type=int, default=int(get("BUDGET", "32")))
    parser.add_argument(
        "--max-topk", type=_topk, default=_topk(get("MAX_TOPK", "0")), help="0 = no cap"
    )
    parser.add_argument("--max-budget", type=int, default=int(get("MAX_BUDGET", "256")))
    parser.add_argument("--max-model-len", type=int, default=int(get("MAX_MODEL_LEN", "0")))
    parser.add_argument("--max-num-seqs", type=int, default=int(get("MAX_NUM_SEQS", "64")),
                        help="generations and sessions holding a KV row at once")
    parser.add_argument("--max-queue", type=int, default=int(get("MAX_QUEUE", "1024")),
                        help="requests waiting for a KV row (more get 429)")
    parser.add_argument("--kv-memory-gib", type=float, default=float(get("KV_MEMORY_GIB", "0")),
                        help="KV pool budget; 0 = half the free GPU memory (2 GiB on a CPU)")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction,
                        default=get("CUDA_GRAPHS", "1") != "0")
    parser.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction,
                        default=get("BATCH_INVARIANT", "1") != "0",
                        help="batch-invariant GEMMs (exact ar tokens in bf16 in every mode)")
    parser.add_argument("--alternate", action=argparse.BooleanOptionalAction,
                        default=get("ALTERNATE", "0") != "0",
                        help="the batch's halves take turns with the drafter, so each "
                             "half's exchange overlaps the other's verify (measured slower "
                             "on the H200 with the demo pair: off by default)")
    parser.add_argument("--send-ahead", action=argparse.BooleanOptionalAction,
                        default=get("SEND_AHEAD", "1") != "0",
                        help="ask the drafter for a round's next trees right after its "
                             "harvest, so drafting overlaps the verifier's host work")
    parser.add_argument("--drafter-socket", action=argparse.BooleanOptionalAction,
                        default=get("DRAFTER_SOCKET", "1") != "0",
                        help="speak the Draft stream over the drafter's Unix socket when it "
                             "advertises one this host can open (on by default; off: the "
                             "gRPC stream always)")
    parser.add_argument("--drafter-shared", action=argparse.BooleanOptionalAction,
                        default=get("DRAFTER_SHARED", "1") != "0",
                        help="with the drafter on this host and GPU, share the engine's "
                             "round state with it over its Unix socket: the draft half "
                             "runs there without features or trees through the host (on "
                             "by default; falls back to the Draft stream)")
    parser.add_argument("--generate-socket", default=get("GENERATE_SOCKET", "auto"),
                        help="GenerateMany also on this Unix socket for a gateway on this "
                             "host (advertised in GetModelInfo; 'auto' = one per port in the "
                             "temporary directory, 'off' = none)")
    parser.add_argument("--max-prefill-tokens", type=int,
                        default=int(get("MAX_PREFILL_TOKENS", "8192")))
    parser.add_argument("--session-idle-timeout", dest="session_idle_timeout_s", type=float,
                        default=float(get("SESSION_IDLE_TIMEOUT", "60")),
                        help="seconds an unused OpenSession session lives")
    parser.add_argument(
        "--draft-timeout-s", type=float, default=float(get("DRAFT_TIMEOUT_S", "10"))
    )
    parser.add_argument(
        "--draft-new-shape-timeout-s", type=float,
        default=float(get("DRAFT_NEW_SHAPE_TIMEOUT_S", "60")),
        help="the wait for a (rows, tree nodes) shape the drafter has not answered yet: "
             "its first compile of kernels for that shape")
    parser.add_argument(
        "--connect-timeout-s", type=float, default=float(get("CONNECT_TIMEOUT_S", "5"))
    )
    parser.add_argument("--model-id", default=get("MODEL_ID", ""))
    parser.add_argument("--tensor-parallel-size", type=int,
                        default=int(get("TENSOR_PARALLEL_SIZE", "1")),
                        help="shard the target over N ranks (N-1 follower processes)")
    parser.add_argument("--verifier-gpus", default=get("VERIFIER_GPUS", ""),
                        help="GPU of each rank, e.g. 0,1 (default cuda:0..N-1 of the visible)")
    add_security_flags(parser, env, is_server=True, is_client=True)
    parser.add_argument("--no-reflection", dest="is_reflection", action="store_false",
                        default=get("REFLECTION", "1") != "0", help="no server reflection")
    parser.add_argument("--log-level", default=get("LOG_LEVEL", "info"))


def parse_config(argv: Sequence[str] | None, environ: Mapping[str, str]) -> VerifierServiceConfig:
    """Flags override DDTREE_* environment variables, which override the defaults."""
    return parse_service_config(
        VerifierServiceConfig, "python -m verifier_svc", __doc__, _add_flags, argv, environ)
