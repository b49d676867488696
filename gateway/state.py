"""What every route needs, built once per app: config, the verifier client, the prompt
encoder, metrics and the request defaults; plus the verifier's ModelInfo once known."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from fastapi import Request

from ddtree.v1 import verifier_pb2
from gateway.config import GatewayConfig
from gateway.logprobs import TokenNames
from gateway.metrics import Metrics
from gateway.params import Defaults
from gateway.prompts import PromptEncoder
from gateway.verifier_client import VerifierClient


@dataclass
class GatewayState:
    config: GatewayConfig
    client: VerifierClient
    encoder: PromptEncoder
    names: TokenNames
    metrics: Metrics
    defaults: Defaults
    created: int  # unix time the model "was created" (/v1/models)
    model_info: verifier_pb2.ModelInfo | None = field(default=None)

    async def fetch_model_info(self) -> verifier_pb2.ModelInfo | None:
        """The verifier's ModelInfo, asked again until it once answers (it is static)."""
        if self.model_info is None:
            try:
                self.model_info = await self.client.model_info()
            except grpc.aio.AioRpcError:
                return None
        return self.model_info


def gateway_state(request: Request) -> GatewayState:
    state = request.app.state.gateway
    assert isinstance(state, GatewayState)
    return state


def request_id(request: Request) -> str:
    """Set by the request-id middleware for every HTTP request."""
    return str(request.state.request_id)
