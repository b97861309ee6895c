"""Configuration: validated once at start into typed objects; nothing below reads raw dicts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ExtraParamsPolicy = Literal["pass-through", "drop", "error"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Mounts(Strict):
    """Base path of each dialect; "" or "/" puts it at the root, null leaves it unmounted."""

    openai: str | None = "/v1"
    azure: str | None = "/azure"
    aleph_alpha: str | None = "/aleph-alpha"
    lmi: str | None = "/lmi"
    ovms: str | None = "/v3"

    @field_validator("*")
    @classmethod
    def normalise(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = "/" + value.strip("/")
        return "" if value == "/" else value


class Limits(Strict):
    """Requests and tokens per minute; absent means unlimited."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class DeploymentCapabilities(Strict):
    """Narrows what the backend declares, for the model this deployment serves."""

    modalities: list[Literal["text", "image", "audio"]] | None = None
    unsupported_parameters: list[str] = Field(default_factory=list)
    context_length: int | None = Field(default=None, ge=1)
    max_n: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(
        default=None, ge=1, description="most tokens one choice may hold; more is refused with 422"
    )
    default_max_tokens: int | None = Field(
        default=None, ge=1, description="the limit a request that sets none gets"
    )


class Replica(Strict):
    """One endpoint serving the deployment's model; its options are laid over the deployment's."""

    name: str | None = None
    weight: float = Field(default=1.0, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)


class Timeouts(Strict):
    """Seconds. Each ends the request with the dialect's 504-class error."""

    first_token: float = Field(default=60.0, gt=0)
    idle: float = Field(default=60.0, gt=0, description="between two chunks of a stream")
    total: float = Field(default=600.0, gt=0)
    keepalive: float = Field(
        default=10.0, gt=0, description="SSE comment interval while waiting for the first token"
    )


class Retries(Strict):
    """Retries and fallback happen only before anything of the answer reached the client."""

    attempts: int = Field(default=3, ge=1, description="tries in all, over replicas and fallbacks")
    budget: float = Field(default=30.0, gt=0, description="seconds for all tries together")


class Health(Strict):
    """Passive health: consecutive failures eject a replica for a cool-down, then it is probed."""

    failures: int = Field(default=3, ge=1)
    cooldown: float = Field(default=30.0, gt=0)


class Deployment(Strict):
    name: str = Field(min_length=1)
    backend: Literal["echo", "tgi", "openai-compatible", "local"] = "echo"
    model: str | None = Field(
        default=None, description="The model name the backend serves (defaults to the name)."
    )
    models: list[str] = Field(
        default_factory=list,
        description='Model names routed here besides `name`; "*" catches every name.',
    )
    provider: str = "chatgate"
    extra_parameters: ExtraParamsPolicy = "error"
    capabilities: DeploymentCapabilities = DeploymentCapabilities()
    limits: Limits = Limits()
    options: dict[str, Any] = Field(default_factory=dict)
    replicas: list[Replica] = Field(
        default_factory=list, description="endpoints of the same model; none means one, from options"
    )
    fallback: list[str] = Field(
        default_factory=list, description="deployments to try next, in order, when this one fails"
    )
    timeouts: Timeouts = Timeouts()
    retries: Retries = Retries()
    health: Health = Health()

    def replica_options(self) -> list[tuple[str, float, dict[str, Any]]]:
        """(name, weight, merged options) of each replica."""
        replicas = self.replicas or [Replica()]
        return [
            (r.name or f"{self.name}-{i}", r.weight, {**self.options, **r.options})
            for i, r in enumerate(replicas)
        ]

    @property
    def served_model(self) -> str:
        return self.model or self.name


class Key(Strict):
    """An API key, stored only as its SHA-256 (`chatgate keys new NAME` makes one)."""

    name: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    deployments: list[str] = Field(default_factory=lambda: ["*"])
    limits: Limits = Limits()


class RedisLimits(Strict):
    url: str
    on_error: Literal["fail-open", "fail-closed"] = "fail-closed"
    prefix: str = "chatgate:limits:"


class RateLimiting(Strict):
    """Where counters live: this process (`memory`) or a Redis shared by every replica."""

    store: Literal["memory", "redis"] = "memory"
    redis: RedisLimits | None = None


class FilterRules(Strict):
    words: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list)

    @field_validator("patterns")
    @classmethod
    def compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"bad regular expression {pattern!r}: {error}") from None
        return patterns


class ContentFilter(Strict):
    input: FilterRules = FilterRules()
    output: FilterRules = FilterRules()


class Server(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_response_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="largest answer relayed; past it a JSON answer is a 502 and a stream ends with an error",
    )


class Settings(Strict):
    server: Server = Server()
    mounts: Mounts = Mounts()
    keys: list[Key] = Field(default_factory=list)
    rate_limits: RateLimiting = RateLimiting()
    content_filter: ContentFilter = ContentFilter()
    deployments: list[Deployment] = Field(
        default_factory=lambda: [Deployment(name="echo", backend="echo", models=["*"])],
        min_length=1,
    )

    @field_validator("deployments")
    @classmethod
    def unique_names(cls, deployments: list[Deployment]) -> list[Deployment]:
        names = [d.name for d in deployments]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"deployment names must be unique: {', '.join(duplicates)}")
        return deployments

    @model_validator(mode="after")
    def references_exist(self) -> Settings:
        names = {d.name for d in self.deployments}
        for index, key in enumerate(self.keys):
            unknown = sorted(set(key.deployments) - names - {"*"})
            if unknown:
                raise ValueError(f"keys.{index}.deployments: unknown deployments {unknown}")
        for index, deployment in enumerate(self.deployments):
            unknown = sorted(set(deployment.fallback) - names)
            if unknown:
                raise ValueError(f"deployments.{index}.fallback: unknown deployments {unknown}")
        if self.rate_limits.store == "redis" and self.rate_limits.redis is None:
            raise ValueError("rate_limits.redis: required when rate_limits.store is redis")
        return self


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names the bad key."""


def describe(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "(top level)"
        lines.append(f"{where}: {problem['msg']}")
    return "; ".join(lines)


def load_settings(path: str | Path | None = None) -> Settings:
    if path is None:
        return Settings()
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read config {path}: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path}: the top level must be a mapping")
    try:
        return Settings.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(f"invalid config {path}: {describe(error)}") from None
