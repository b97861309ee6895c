"""Routing: the request's model name (or Azure's deployment header) → a live deployment."""

from __future__ import annotations

from dataclasses import dataclass, field

from backends import Backend, Capabilities, create_backend
from gateway.config import Deployment
from gateway.errors import NotFound
from gateway.policy.capabilities import effective
from gateway.policy.limits import Bucket, buckets_for

WILDCARD = "*"


@dataclass(slots=True)
class LiveDeployment:
    config: Deployment
    backend: Backend
    capabilities: Capabilities = field(init=False)
    buckets: list[Bucket] = field(init=False)

    def __post_init__(self) -> None:
        self.capabilities = effective(self.backend.capabilities, self.config.capabilities)
        self.buckets = buckets_for(f"deployment:{self.config.name}", self.config.limits)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def model(self) -> str:
        return self.config.served_model


class Router:
    def __init__(self, deployments: list[Deployment]) -> None:
        self.deployments = {
            d.name: LiveDeployment(d, create_backend(d.backend, d.served_model, d.options))
            for d in deployments
        }
        self.by_model: dict[str, LiveDeployment] = {}
        self.catch_all: LiveDeployment | None = None
        for live in self.deployments.values():
            for model in (live.name, live.model, *live.config.models):
                if model == WILDCARD:
                    self.catch_all = self.catch_all or live
                else:
                    self.by_model.setdefault(model, live)

    def model_names(self) -> list[str]:
        return list(self.by_model)

    def knows(self, model: str) -> bool:
        return model in self.by_model or self.catch_all is not None

    @property
    def default(self) -> LiveDeployment:
        return next(iter(self.deployments.values()))

    def route(self, model: str | None, deployment_name: str | None = None) -> LiveDeployment:
        if deployment_name:
            live = self.deployments.get(deployment_name)
            if live is None:
                raise NotFound(
                    f"Deployment '{deployment_name}' not found.",
                    param="azureml-model-deployment",
                    code="DeploymentNotFound",
                )
            return live
        if model is None:  # dialects where `model` is optional: the first deployment serves
            return self.default
        live = self.by_model.get(model) or self.catch_all
        if live is None:
            raise NotFound(
                f"The model '{model}' does not exist or you do not have access to it.",
                param="model",
                code="ModelNotFound",
            )
        return live

    async def aclose(self) -> None:
        for live in self.deployments.values():
            await live.backend.aclose()
