"""Builds the verifier: loads the target, connects the drafter link, builds the engine
(KV pool sized at start-up), starts the engine thread and the gRPC server (Verifier,
health, reflection)."""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc
import structlog
from grpc_health.v1.health import HealthServicer

from ddtree.engine import Engine
from ddtree.engine.sessions import ClientSessions
from ddtree.models.target import TargetModel, load_target
from ddtree.runtime import resolve_device, resolve_dtype
from ddtree.service import (
    SERVER_OPTIONS,
    add_health_and_reflection,
    add_port,
    server_interceptors,
    set_serving,
)
from ddtree.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import RemoteDrafter
from verifier_svc.scheduler import Scheduler
from verifier_svc.servicer import VerifierServicer

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


def build_engine(config: VerifierServiceConfig, target: TargetModel,
                 drafter: DrafterClient | None) -> Engine:
    """The engine over the target; drafting over the wire when a fitting drafter answered
    at start-up (otherwise every generation runs in ar)."""
    remote = None
    info = drafter.info if drafter is not None else None
    if drafter is not None and info is not None:
        remote = RemoteDrafter(drafter, info, config.draft_timeout_s)
    elif drafter is not None:
        log.error("drafter_unreachable_serving_ar", drafter_addr=config.drafter_addr)
    return Engine(target, remote, config.engine_config())


def build_server(config: VerifierServiceConfig) -> tuple[VerifierServer, int]:
    """Loads, binds, starts and marks SERVING; -> (server, bound port). Port 0 picks one."""
    device = resolve_device(config.device)
    target = load_target(Path(config.target), device, resolve_dtype(config.dtype, device)).eval()
    drafter = None
    if config.drafter_addr:
        drafter = DrafterClient(
            config.drafter_addr, config.draft_timeout_s, config.connect_timeout_s, target.config,
            config.security)
        drafter.connect(wait=True)  # not fatal: generations use ar without it
    engine = build_engine(config, target, drafter)
    sessions = ClientSessions(engine, config.max_budget)
    scheduler = Scheduler(engine, sessions, config.session_idle_timeout_s)
    servicer = VerifierServicer(
        config, scheduler, sessions, model_info(config, target, engine.max_model_len), drafter
    )
    # Each Generate stream holds a thread for its whole life; leave room for unary calls.
    # Every running or queued generation may hold a stream; RPCs past the pool are refused
    # (RESOURCE_EXHAUSTED) instead of waiting for a thread.
    num_threads = config.max_num_seqs + config.max_queue + 16
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
        drafter_connected=engine.drafting is not None,
        num_kv_rows=engine.plan.num_slots,
        max_model_len=engine.max_model_len,
    )
    return VerifierServer(server, health, scheduler, drafter), port

