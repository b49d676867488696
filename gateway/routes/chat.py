"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.dispatch import respond
from gateway.params import check_context_length, plan_chat
from gateway.schemas import ChatCompletionRequest
from gateway.state import gateway_state, request_id

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state = gateway_state(request)
    plan = await state.plan(request, plan_chat, body, state.defaults, state.encoder,
                            request_id(request))
    check_context_length(plan, await state.fetch_model_info())
    return await respond(state, plan, request)
