"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.dispatch import respond
from gateway.params import check_context_length, plan_completion
from gateway.schemas import CompletionRequest
from gateway.state import gateway_state, request_id

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    state = gateway_state(request)
    plan = await state.plan(request, plan_completion, body, state.defaults, state.encoder,
                            request_id(request))
    check_context_length(plan, await state.fetch_model_info())
    return await respond(state, plan, request)
