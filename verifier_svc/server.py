"""Builds the verifier: loads the target, connects the drafter link, starts the engine
thread and the gRPC server (Verifier, health, reflection)."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc
import structlog
from grpc_health.v1.health import HealthServicer

from ddtree.models.target import TargetModel, load_target
from ddtree.runtime import resolve_device, resolve_dtype
from ddtree.service import (
    SERVER_OPTIONS,
    GrpcSecurity,
    add_health_and_reflection,
    add_port,
    open_channel,
    server_interceptors,
    set_serving,
)
from ddtree.v1 import drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.scheduler import Scheduler
from verifier_svc.servicer import VerifierServicer
from verifier_svc.sessions import ClientSessions, KVSlots

log = structlog.get_logger("verifier_svc")

SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name


class VerifierServer:
    """The gRPC server plus what it drives; `stop` ends all of it."""

    def __init__(
        self,
        server: grpc.Server,
        health: HealthServicer,
        scheduler: Scheduler,
        drafter: DrafterClient | None,
    ) -> None:
        self.server = server
        self.health = health
        self.scheduler = scheduler
        self.drafter = drafter

    def stop(self, grace: float | None) -> threading.Event:
        """Stops taking RPCs, lets running ones end within `grace` s, then the engine."""
        self.health.enter_graceful_shutdown()  # NOT_SERVING: balancers stop sending work
        done = self.server.stop(grace)
        done.wait()
        self.scheduler.stop()
        if self.drafter is not None:
            self.drafter.close()
        return done

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return bool(self.server.wait_for_termination(timeout))


def model_info(
    config: VerifierServiceConfig, target: TargetModel, max_model_len: int
) -> verifier_pb2.ModelInfo:
    return verifier_pb2.ModelInfo(
        model_id=config.model_id or Path(config.target).resolve().name,
        vocab_size=target.config.vocab_size,
        max_model_len=max_model_len,
        eos_token_ids=list(target.config.eos_token_ids),
        default_mode=config.mode,
        default_budget=config.budget,
        default_max_topk=config.max_topk or 0,
        max_budget=config.max_budget,
    )


def build_server(config: VerifierServiceConfig) -> tuple[VerifierServer, int]:
    """Loads, binds, starts and marks SERVING; -> (server, bound port). Port 0 picks one."""
    device = resolve_device(config.device)
    target = load_target(Path(config.target), device, resolve_dtype(config.dtype, device)).eval()
    max_model_len = config.max_model_len or target.config.max_position_embeddings
    drafter = None
    if config.drafter_addr:
        drafter = DrafterClient(
            config.drafter_addr, config.draft_timeout_s, config.connect_timeout_s, target.config
        )
        secure_drafter_link(drafter, config.security)
        drafter.connect(wait=True)  # not fatal: generations use ar until it connects

    def feature_layers() -> tuple[int, ...]:
        info = drafter.info if drafter is not None else None
        return tuple(info.target_layer_ids) if info is not None else ()

    slots = KVSlots(config.max_sessions)
    scheduler = Scheduler(target, drafter, slots, max_model_len)
    sessions = ClientSessions(target, slots, max_model_len, config.max_budget, feature_layers)
    servicer = VerifierServicer(
        config, scheduler, sessions, model_info(config, target, max_model_len)
    )
    # Each Generate stream holds a thread for its whole life; leave room for unary calls.
    # RPCs past the pool are refused (RESOURCE_EXHAUSTED) instead of waiting for a thread.
    num_threads = 2 * config.max_sessions + 8
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=num_threads), options=SERVER_OPTIONS,
        interceptors=server_interceptors(config.security), maximum_concurrent_rpcs=num_threads,
    )
    verifier_pb2_grpc.add_VerifierServicer_to_server(servicer, server)
    health = add_health_and_reflection(server, [SERVICE_NAME], config.is_reflection)
    port = add_port(server, config.host, config.port, config.security)
    scheduler.start()
    server.start()
    set_serving(health, [SERVICE_NAME])
    log.info(
        "verifier_serving",
        port=port,
        model_id=servicer.model_info.model_id,
        device=str(device),
        mode=config.mode,
        drafter_addr=config.drafter_addr,
        drafter_connected=drafter is not None and drafter.info is not None,
    )
    return VerifierServer(server, health, scheduler, drafter), port


def secure_drafter_link(drafter: DrafterClient, security: GrpcSecurity) -> None:
    """The drafter channel with the token and TLS of `security`.

    A bridge: DrafterClient opens a plaintext channel of its own; once it takes its
    channel from `ddtree.service.open_channel(address, security)` this goes away.
    """
    if not (security.token or security.tls_ca):
        return
    drafter._channel.close()
    drafter._channel = open_channel(drafter.address, security)
    drafter._stub = drafter_pb2_grpc.DrafterStub(drafter._channel)
