"""The gateway's live state, built once from Settings: deployments with their backends, and policy."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.datastructures import Headers

from gateway.canonical import ChatRequest
from gateway.config import Settings
from gateway.policy.extra_params import HEADER as EXTRA_PARAMS_HEADER
from gateway.policy.extra_params import apply_extra_params, resolve_policy
from gateway.router import LiveDeployment, Router

if TYPE_CHECKING:
    from gateway.dialects.base import Dialect

DEPLOYMENT_HEADER = "azureml-model-deployment"


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started = int(time.time())
        self.router = Router(settings.deployments)

    def admit(self, dialect: Dialect, request: ChatRequest, headers: Headers) -> LiveDeployment:
        """Route the request and apply policy; raise the GatewayError that refuses it."""
        deployment = self.router.route(request.model, headers.get(DEPLOYMENT_HEADER))
        policy = resolve_policy(headers.get(EXTRA_PARAMS_HEADER), deployment.config.extra_parameters)
        apply_extra_params(request, policy)
        request.deployment = deployment.name
        return deployment

    async def aclose(self) -> None:
        await self.router.aclose()
