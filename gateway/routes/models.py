"""GET /v1/models and GET /v1/models/{model}: the one model this gateway serves."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import model_not_found
from gateway.state import GatewayState, gateway_state

router = APIRouter()


async def _model_card(state: GatewayState) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": state.defaults.model,
        "object": "model",
        "created": state.created,
        "owned_by": "ddtree",
    }
    info = await state.fetch_model_info()
    if info is not None:
        card["max_model_len"] = info.max_model_len
    return card


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [await _model_card(gateway_state(request))]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    state = gateway_state(request)
    if model != state.defaults.model:
        raise model_not_found(model)
    return await _model_card(state)
