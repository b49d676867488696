"""GET /health (200 when the verifier answers SERVING on grpc.health.v1, else 503) and
GET /metrics (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.state import gateway_state

router = APIRouter()


@router.get("/health", response_model=None)
async def health(request: Request) -> JSONResponse:
    state = gateway_state(request)
    if await state.client.is_serving():
        return JSONResponse({"status": "ok"})
    return JSONResponse(
        {"status": "unavailable", "detail": f"verifier {state.config.verifier_addr} is not "
                                            "serving"}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(gateway_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
