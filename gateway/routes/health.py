"""GET /health: 200 only while the verifier serves (grpc.health.v1) AND can admit work
(its GetStats: queue not full, or with no queue a free KV slot); 503 otherwise, so a
balancer stops sending. GET /metrics: Prometheus text, the engine gauges read from
GetStats at scrape time (a short deadline; no engine, no engine gauges)."""

from __future__ import annotations

import asyncio
import os

import grpc
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ddtree.v1 import verifier_pb2
from gateway.state import GatewayState, gateway_state

router = APIRouter()


def admission_refusal(stats: verifier_pb2.EngineStats) -> str | None:
    """Why the engine cannot take a request now, or None when it can."""
    if stats.max_queue > 0:
        if stats.num_waiting >= stats.max_queue:
            return f"the queue is full ({stats.num_waiting} of {stats.max_queue} waiting)"
        return None
    in_use = stats.num_running + stats.num_open_sessions
    if stats.max_num_seqs > 0 and in_use >= stats.max_num_seqs:
        return f"every KV slot is in use ({in_use} of {stats.max_num_seqs})"
    return None


async def engine_stats(state: GatewayState) -> verifier_pb2.EngineStats | None:
    """GetStats, or None when the verifier does not answer in time (or at all)."""
    try:
        return await state.client.engine_stats()
    except grpc.aio.AioRpcError:
        return None


# Which gateway process answered /health or /metrics (several may share the port: `ddtree
# serve` waits for each worker's own 200).
PID_HEADER = "x-ddtree-gateway-pid"


@router.get("/health", response_model=None)
async def health(request: Request) -> JSONResponse:
    state = gateway_state(request)
    is_serving, stats = await asyncio.gather(state.client.is_serving(), engine_stats(state))
    process = {PID_HEADER: str(os.getpid())}
    if not is_serving or stats is None:
        return JSONResponse({"status": "unavailable", "detail": "the model backend is not "
                             "serving"}, status_code=503, headers=process)
    refusal = admission_refusal(stats)
    if refusal is not None:
        return JSONResponse({"status": "busy", "detail": refusal}, status_code=503,
                            headers=process)
    return JSONResponse({"status": "ok"}, headers=process)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = gateway_state(request)
    stats = await engine_stats(state)
    return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST,
                    headers={PID_HEADER: str(os.getpid())})
