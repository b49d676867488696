"""Builds the drafter's gRPC server: loads the drafter plus the target's embedding and LM
head (never the whole target), registers Drafter, health and reflection."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
import structlog

from ddtree.engine import LocalDrafter
from ddtree.models.checkpoint import read_config
from ddtree.models.drafter import DFlashDrafter, load_drafter
from ddtree.models.target import TargetEmbeddings, load_target_embeddings
from ddtree.models.target_config import TargetConfig
from ddtree.runtime import resolve_device, resolve_dtype
from ddtree.service import SERVER_OPTIONS, add_health_and_reflection, set_serving
from ddtree.v1 import drafter_pb2, drafter_pb2_grpc
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.servicer import DrafterServicer
from drafter_svc.sessions import DraftSessionTable

log = structlog.get_logger("drafter_svc")

SERVICE_NAME = drafter_pb2.DESCRIPTOR.services_by_name["Drafter"].full_name


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
    )
    return drafter, embeddings, info, config.max_model_len or target_config.max_position_embeddings


def build_server(config: DrafterServiceConfig) -> tuple[grpc.Server, int]:
    """Loads the models, binds, starts and marks the server SERVING; -> (server, bound port)."""
    drafter, embeddings, info, max_model_len = load_models(config)
    local = LocalDrafter(drafter, embeddings, config.max_sessions, max_model_len)
    sessions = DraftSessionTable(config.max_sessions, local.depth)
    device = embeddings.embed_tokens.weight.device
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers), options=SERVER_OPTIONS
    )
    drafter_pb2_grpc.add_DrafterServicer_to_server(DrafterServicer(local, sessions, info), server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"cannot bind {config.host}:{config.port}")
    server.start()
    set_serving(health, [SERVICE_NAME])
    log.info(
        "drafter_serving",
        port=port,
        drafter=info.drafter_id,
        block_size=info.block_size,
        device=str(device),
    )
    return server, port
