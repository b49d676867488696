"""Builds the drafter's gRPC server: loads the drafter plus the target's embedding and LM
head (never the whole target), registers Drafter, health and reflection.

Every Draft stream holds an RPC thread for its whole life, idle or not, so streams are
bounded (all verifiers together, and per verifier connection) below the thread pool,
which keeps `NUM_UNARY_WORKERS` threads for GetInfo and health checks: a verifier can
always reconnect, and a stream past the bound is refused at once (RESOURCE_EXHAUSTED)
instead of waiting for a thread that never frees.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import structlog

from ddtree import draft_socket
from ddtree.draft_codec import DRAFT_WIRE_VERSION
from ddtree.engine import LocalDrafter
from ddtree.engine.draft_graphs import GraphDrafter
from ddtree.models.checkpoint import read_config
from ddtree.models.drafter import DFlashDrafter, load_drafter
from ddtree.models.target import TargetEmbeddings, load_target_embeddings
from ddtree.models.target_config import TargetConfig
from ddtree.runtime import resolve_device, resolve_dtype
from ddtree.service import (
    SERVER_OPTIONS,
    add_health_and_reflection,
    add_port,
    server_interceptors,
    set_serving,
)
from ddtree.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.local_socket import LocalDraftServer, SharedLinks
from drafter_svc.servicer import DrafterServicer
from drafter_svc.sessions import DraftSessionTable

log = structlog.get_logger("drafter_svc")

SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name
DRAFT_METHOD = f"/{SERVICE_NAME}/Draft"
# Threads beyond the stream bound: GetInfo, health checks, reflection.
NUM_UNARY_WORKERS = 4


class StreamLimiter(grpc.ServerInterceptor):
    """Admits at most `max_streams` Draft streams at once, `max_per_peer` of them from one
    connection (gRPC's peer string names the TCP connection); refuses the rest."""

    def __init__(self, max_streams: int, max_per_peer: int) -> None:
        self.max_streams, self.max_per_peer = max_streams, max_per_peer
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _admit(self, peer: str) -> str | None:
        """Takes a slot for `peer`; -> why not, or None when admitted."""
        with self._lock:
            if sum(self._open.values()) >= self.max_streams:
                return f"the drafter serves at most {self.max_streams} Draft streams"
            if self._open[peer] >= self.max_per_peer:
                return f"at most {self.max_per_peer} Draft streams per connection"
            self._open[peer] += 1
            return None

    def _release(self, peer: str) -> None:
        with self._lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method != DRAFT_METHOD:
            return handler
        behavior = handler.stream_stream

        def bounded(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            peer = context.peer()
            refusal = self._admit(peer)
            if refusal is not None:
                log.warning("draft_stream_refused", peer=peer, reason=refusal)
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
            try:
                yield from behavior(requests, context)
            finally:
                self._release(peer)

        return grpc.stream_stream_rpc_method_handler(
            bounded, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


def load_models(
    config: DrafterServiceConfig,
) -> tuple[DFlashDrafter, TargetEmbeddings, drafter_pb2.DrafterInfo, int]:
    """-> (drafter, the target's embeddings, DrafterInfo, max_model_len)."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    target_config = TargetConfig.from_hf(read_config(Path(config.target)))
    embeddings = load_target_embeddings(Path(config.target), device, dtype).eval()
    drafter = load_drafter(Path(config.drafter), target_config, device, dtype).eval()
    info = drafter_pb2.DrafterInfo(
        drafter_id=Path(config.drafter).resolve().name,
        block_size=drafter.config.block_size,
        target_layer_ids=list(drafter.config.target_layer_ids),
        hidden_size=target_config.hidden_size,
        vocab_size=target_config.vocab_size,
        max_budget=config.max_budget,
        num_target_layers=target_config.num_layers,
        wire_version=DRAFT_WIRE_VERSION,
    )
    return drafter, embeddings, info, config.max_model_len or target_config.max_position_embeddings


def new_grpc_server(config: DrafterServiceConfig) -> grpc.Server:
    """A thread per admissible RPC and never more RPCs than threads: none ever waits for
    a thread (the token check runs first, then the stream bound)."""
    num_threads = config.max_streams + NUM_UNARY_WORKERS
    interceptors = [*server_interceptors(config.security),
                    StreamLimiter(config.max_streams, config.max_streams_per_peer)]
    return grpc.server(futures.ThreadPoolExecutor(max_workers=num_threads),
                       options=SERVER_OPTIONS, interceptors=interceptors,
                       maximum_concurrent_rpcs=num_threads)


def build_server(config: DrafterServiceConfig) -> tuple[DrafterServer, int]:
    """Loads the models, binds, starts and marks the server SERVING; -> (server, bound port)."""
    drafter, embeddings, info, max_model_len = load_models(config)
    local = LocalDrafter(drafter, embeddings, config.max_sessions, max_model_len,
                         context_graphs=config.context_graphs)
    graphs = GraphDrafter(local, config.max_sessions, config.max_budget,
                          len(info.target_layer_ids) * info.hidden_size)
    sessions = DraftSessionTable(config.max_sessions, local.depth)
    device = embeddings.embed_tokens.weight.device
    if graphs.graphs.enabled:  # a GPU: every tree size compiled and captured before serving
        started = time.perf_counter()
        graphs.warm_up()
        log.info("drafter_warmed_up", node_buckets=list(graphs.node_buckets),
                 seconds=round(time.perf_counter() - started, 1))
    server = new_grpc_server(config)
    servicer = DrafterServicer(graphs, sessions, info)
    drafter_pb2_grpc.add_DrafterServicer_to_server(servicer, server)
    health = add_health_and_reflection(server, [SERVICE_NAME], config.is_reflection)
    port = add_port(server, config.host, config.port, config.security)
    shared = SharedLinks(local, servicer.model_lock, config.max_sessions, max_model_len,
                         config.context_graphs) if config.shared_draft else None
    socket_server = _start_local_socket(config, port, servicer, info, shared)  # before GetInfo
    server.start()
    set_serving(health, [SERVICE_NAME])
    log.info(
        "drafter_serving",
        port=port,
        drafter=info.drafter_id,
        block_size=info.block_size,
        device=str(device),
        local_socket=info.local_socket or None,
    )
    return DrafterServer(server, socket_server), port


class DrafterServer:
    """The drafter's gRPC server and its Unix socket, where on: `stop` ends both."""

    def __init__(self, server: grpc.Server, local: LocalDraftServer | None) -> None:
        self.grpc = server
        self.local = local

    def stop(self, grace: float | None) -> threading.Event:
        if self.local is not None:
            self.local.stop()
        return self.grpc.stop(grace)


def _start_local_socket(config: DrafterServiceConfig, port: int, servicer: DrafterServicer,
                        info: drafter_pb2.DrafterInfo,
                        shared: SharedLinks | None) -> LocalDraftServer | None:
    """The Draft stream's Unix socket (config.local_socket), advertised in `info`."""
    local = draft_socket.start_server(
        config.local_socket, "drafter", port,
        lambda path, instance_id: LocalDraftServer(path, servicer, instance_id,
                                                   config.security.token, config.max_streams,
                                                   shared),
        "drafter_local_socket_failed")
    if local is not None:
        info.local_socket, info.instance_id = local.path, local.instance_id
    return local
