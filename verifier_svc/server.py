"""Builds the verifier: loads the target, connects the drafter link, builds the engine
(KV pool sized at start-up), starts the engine thread and the gRPC server (Verifier,
health, reflection)."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import structlog
import torch
from grpc_health.v1.health import HealthServicer

from ddtree import draft_socket
from ddtree.engine import Engine
from ddtree.engine.generate import build_engine as build_local
from ddtree.engine.sessions import ClientSessions
from ddtree.models.drafter import load_drafter
from ddtree.models.target import TargetModel, load_target
from ddtree.runtime import resolve_device, resolve_dtype
from ddtree.service import (
    SERVER_OPTIONS,
    add_health_and_reflection,
    add_port,
    server_interceptors,
    set_serving,
)
from ddtree.tp_launch import Group, GroupSpec, rank_devices, start_group
from ddtree.v1 import verifier_pb2, verifier_pb2_grpc
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.local_socket import LocalManyServer
from verifier_svc.remote_drafter import RemoteDrafter
from verifier_svc.scheduler import Scheduler
from verifier_svc.servicer import VerifierServicer
from verifier_svc.shared_drafter import SharedDrafter

log = structlog.get_logger("verifier_svc")

FOLLOWER_DIED_EXIT_CODE = 3
SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name


class VerifierServer:
    """The gRPC server plus what it drives; `stop` ends all of it."""

    def __init__(
        self,
        server: grpc.Server,
        health: HealthServicer,
        scheduler: Scheduler,
        drafter: DrafterClient | None,
        group: Group | None = None,
        local: LocalManyServer | None = None,
    ) -> None:
        self.server = server
        self.local = local
        self.health = health
        self.scheduler = scheduler
        self.drafter = drafter
        self.group = group

    def stop(self, grace: float | None) -> threading.Event:
        """Stops taking RPCs, lets running ones end within `grace` s, then the engine."""
        self.health.enter_graceful_shutdown()  # NOT_SERVING: balancers stop sending work
        done = self.server.stop(grace)
        if self.local is not None:  # the socket's streams get the same grace, then end
            self.local.drain(grace)
            self.local.stop()
        done.wait()
        stopped = self.scheduler.stop()
        if self.group is not None and stopped:  # the followers' last message: stop
            self.group.stop()
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
    """The engine over the target; drafting in this process with --local-drafter, over the
    wire when a fitting drafter answered at start-up (otherwise every generation runs in
    ar). On a GPU every shape traffic takes is compiled and captured before serving
    (`Engine.warm_up`; the drafter service warms its half up the same way)."""
    if config.local_drafter:
        weight = target.embeddings.embed_tokens.weight
        local = load_drafter(Path(config.local_drafter), target.config, weight.device,
                             weight.dtype).eval()
        engine = build_local(target, local, config.engine_config())
    else:
        engine = _remote_engine(config, target, drafter)
        log.info("drafter_link", kind=_link_kind(engine.drafting, drafter))
    if engine.graphs.enabled:
        started = time.perf_counter()
        num_shapes = engine.warm_up()
        log.info("engine_warmed_up", shapes=num_shapes, graphs=engine.graphs.num_graphs,
                 batch_buckets=list(engine.plan.batch_buckets),
                 seconds=round(time.perf_counter() - started, 1))
    return engine


def _remote_engine(config: VerifierServiceConfig, target: TargetModel,
                   drafter: DrafterClient | None) -> Engine:
    """The engine with the drafter service: the shared draft link where the drafter
    accepts it (this host and GPU), else the Draft stream; without a drafter, ar."""
    info = drafter.info if drafter is not None else None
    if drafter is None or info is None:
        if drafter is not None:
            log.error("drafter_unreachable_serving_ar", drafter_addr=config.drafter_addr)
        return Engine(target, None, config.engine_config())
    timeouts = (config.draft_timeout_s, config.draft_new_shape_timeout_s)
    if not (config.drafter_shared and config.drafter_socket and info.local_socket
            and config.tensor_parallel_size == 1):
        return Engine(target, RemoteDrafter(drafter, info, *timeouts), config.engine_config())
    shared = SharedDrafter(drafter, info, *timeouts)
    engine = Engine(target, shared, config.engine_config())  # attaches the link
    if not shared.linked:  # another GPU or host, or no CUDA IPC: the Draft stream
        shared.close()
        engine.drafting = RemoteDrafter(drafter, info, *timeouts)
    return engine


def _link_kind(drafting: object, drafter: DrafterClient | None) -> str:
    if isinstance(drafting, SharedDrafter):
        return "shared"
    if drafting is None or drafter is None:
        return "none"
    return drafter.transport or "none"


def build_server(config: VerifierServiceConfig) -> tuple[VerifierServer, int]:
    """Loads, binds, starts and marks SERVING; -> (server, bound port). Port 0 picks one."""
    device = resolve_device(config.device)
    target, group = load_verifier_target(config, device)
    drafter = None
    if config.drafter_addr:
        drafter = DrafterClient(
            config.drafter_addr, config.draft_timeout_s, config.connect_timeout_s, target.config,
            config.security, use_socket=config.drafter_socket)
        drafter.connect(wait=True)  # not fatal: generations use ar without it
    engine = build_engine(config, target, drafter)
    sessions = ClientSessions(engine, config.max_budget)
    scheduler = Scheduler(engine, sessions, config.session_idle_timeout_s)
    servicer = VerifierServicer(
        config, scheduler, sessions, model_info(config, target, engine.max_model_len), drafter
    )
    # Each Generate (or GenerateMany) stream holds a thread for its whole life; leave room
    # for unary calls.
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
    local = _start_generate_socket(config, port, servicer, num_threads)  # before GetModelInfo
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
        local_drafter=config.local_drafter,
        drafter_connected=engine.drafting is not None,
        tensor_parallel_size=config.tensor_parallel_size,
        num_kv_rows=engine.plan.num_slots,
        max_model_len=engine.max_model_len,
        generate_socket=servicer.model_info.local_socket or None,
    )
    return VerifierServer(server, health, scheduler, drafter, group, local), port


def _start_generate_socket(config: VerifierServiceConfig, port: int,
                           servicer: VerifierServicer, max_streams: int
                           ) -> LocalManyServer | None:
    """GenerateMany's Unix socket (config.generate_socket), advertised in the servicer's
    ModelInfo."""
    local = draft_socket.start_server(
        config.generate_socket, "verifier", port,
        lambda path, instance_id: LocalManyServer(path, servicer, instance_id,
                                                  config.security.token, max_streams),
        "verifier_generate_socket_failed")
    if local is not None:
        info = servicer.model_info
        info.local_socket, info.instance_id = local.path, local.instance_id
    return local


def load_verifier_target(config: VerifierServiceConfig, device: torch.device
                         ) -> tuple[TargetModel, Group | None]:
    """The target, or with --tensor-parallel-size N > 1 this process's shard (rank 0) and
    the group of N-1 follower processes holding the others."""
    dtype = resolve_dtype(config.dtype, device)
    if config.tensor_parallel_size == 1:
        return load_target(Path(config.target), device, dtype).eval(), None
    devices = rank_devices(config.tensor_parallel_size, device, config.verifier_gpus)
    spec = GroupSpec(config.target, dtype, devices, config.batch_invariant)
    group = start_group(spec, _exit_on_follower_death)
    assert group.target is not None
    log.info("tensor_parallel_group_ready", tensor_parallel_size=spec.world_size,
             backend=spec.backend, devices=",".join(devices))
    return group.target, group


def _exit_on_follower_death(rank: int, exit_code: int | None) -> None:
    """Without a follower the engine's next collective would wait forever: end the whole
    verifier now (ddtree serve's supervisor restarts it, followers included)."""
    log.error("verifier_exiting_tensor_parallel_follower_died", rank=rank, exit_code=exit_code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(FOLLOWER_DIED_EXIT_CODE)

