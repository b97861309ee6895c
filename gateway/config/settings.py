"""Configuration: validated once at start into typed objects; nothing below reads raw dicts."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    IPvAnyNetwork,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from backends.base import BACKEND_KINDS
from gateway.config.environment import Environment
from gateway.core.options import ConfigError, Strict, describe, from_file, one_of
from gateway.dialects import DEFAULT_MOUNTS

ExtraParamsPolicy = Literal["pass-through", "drop", "error"]


def normalised_mount(value: str | None) -> str | None:
    """A base path: "" for the root, "/x" otherwise; None leaves the dialect unmounted."""
    if value is None:
        return None
    value = "/" + value.strip("/")
    return "" if value == "/" else value


def default_mounts() -> dict[str, str | None]:
    return dict(DEFAULT_MOUNTS)


def mounts_schema() -> dict[str, Any]:
    return {
        "description": 'Base path of each dialect; "/" puts it at the root, null leaves it unmounted.',
        "properties": {
            name: {"anyOf": [{"type": "string"}, {"type": "null"}], "default": mount}
            for name, mount in DEFAULT_MOUNTS.items()
        },
        "additionalProperties": False,
    }


class Limits(Strict):
    """Requests and tokens per minute; absent means unlimited."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class ParameterRange(Strict):
    """The values the deployment's model takes for one parameter (either bound may be left out)."""

    minimum: float | None = None
    maximum: float | None = None


class DeploymentCapabilities(Strict):
    """Narrows what the backend declares, for the model this deployment serves."""

    modalities: list[Literal["text", "image", "audio", "file"]] | None = None
    unsupported_parameters: list[str] = Field(default_factory=list)
    parameter_ranges: dict[str, ParameterRange] = Field(
        default_factory=dict,
        description="the values the model takes, by parameter (e.g. temperature: {maximum: 1}); "
        "a request outside them is refused with 422 (Azure's 'value not supported by the model')",
    )
    context_length: int | None = Field(default=None, ge=1)
    max_n: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(
        default=None, ge=1, description="most tokens one choice may hold; more is refused with 422"
    )
    default_max_tokens: int | None = Field(
        default=None, ge=1, description="the limit a request that sets none gets"
    )

    @field_validator("parameter_ranges")
    @classmethod
    def known_parameters(cls, ranges: dict[str, ParameterRange]) -> dict[str, ParameterRange]:
        from gateway.core.parameters import BY_NAME

        unknown = sorted(set(ranges) - set(BY_NAME))
        if unknown:
            raise ValueError(f"unknown parameters {unknown}; parameters are named as in the catalogue")
        return ranges


class Replica(Strict):
    """One endpoint serving the deployment's model; its options are laid over the deployment's."""

    name: str | None = None
    weight: float = Field(default=1.0, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)
    max_concurrent: int | None = Field(
        default=None, ge=1, description="this replica's own `concurrency.max_concurrent`"
    )
    metrics_url: str | None = Field(
        default=None,
        description="where its Prometheus metrics are read (`routing.load_from: metrics`); "
        "default: the base URL's /metrics",
    )


class Concurrency(Strict):
    """How many requests a replica takes at once, and how the rest wait (per worker: with N
    workers a replica may get N times as many). A request no replica has room for waits in the
    deployment's queue, first come first served, for the first replica to free a slot; when the
    queue is full, or the wait outlasts `queue_timeout`, it gets a 503 with Retry-After before
    any byte of an answer (a streamed request gets no keep-alive while it waits)."""

    max_concurrent: int = Field(
        default=256,
        ge=1,
        description="requests a replica serves at once (vLLM runs 256 sequences at once, TGI 128 "
        "requests); a lower `max_connections` in its options lowers it to that",
    )
    queue: int = Field(default=2048, ge=0, description="requests that may wait for a replica; more: 503")
    queue_timeout: float = Field(default=30.0, gt=0, description="seconds a request may wait; then 503")


class Affinity(Strict):
    """Prefix affinity: a request goes to the replica that served the longest start of its
    prompt (so its prompt cache holds it), unless that replica is loaded past `bound` times the
    replicas' mean, full or ejected; a client's `prompt_cache_key` (else its session header:
    `X-Claude-Code-Session-Id`, `session-id` or `x-session-id`; else `user`) keeps its requests
    on one replica the same way."""

    enabled: bool = False
    block_chars: int = Field(default=256, ge=16, description="characters of the prompt a block hash covers")
    max_blocks: int = Field(
        default=100_000, ge=16, description="block hashes remembered (least recently used go)"
    )
    bound: float = Field(
        default=1.25, ge=1.0, description="the favoured replica is passed over above this times the mean load"
    )


class Routing(Strict):
    """How a replica is chosen among those with room: `p2c` (two at random, the less loaded
    wins) or `round-robin`; the load is the gateway's own count of requests it sent, or, with
    `load_from: metrics`, what each replica's /metrics says it runs and queues (vLLM, llama.cpp's
    server, TGI), read every `scrape_interval` seconds."""

    pick: Literal["p2c", "round-robin"] = "p2c"
    load_from: Literal["gateway", "metrics"] = "gateway"
    scrape_interval: float = Field(default=1.0, gt=0, description="seconds between two reads of /metrics")
    scrape_timeout: float = Field(default=1.0, gt=0, description="seconds one read of /metrics may take")
    stale_after: int = Field(
        default=3,
        ge=1,
        description="intervals without a good read after which the gateway's own count is used",
    )
    affinity: Affinity = Affinity()


class Timeouts(Strict):
    """Seconds. `first_token`, `idle` and `total` end the request with the dialect's 504-class
    error; `headers` and `keepalive` shape how a stream waits for its first token."""

    first_token: float = Field(default=60.0, gt=0)
    idle: float = Field(default=60.0, gt=0, description="between two chunks of a stream")
    total: float = Field(default=600.0, gt=0)
    headers: float = Field(
        default=10.0,
        gt=0,
        description="seconds a stream's 200 waits for the first token: a failure before then is "
        "answered with its own status in the dialect's shape",
    )
    keepalive: float = Field(
        default=10.0,
        gt=0,
        description="SSE keep-alive interval, after `headers`, while waiting for the first token",
    )


class Retries(Strict):
    """Retries and fallback happen only before anything of the answer reached the client."""

    attempts: int = Field(default=3, ge=1, description="tries in all, over replicas and fallbacks")
    budget: float = Field(default=30.0, gt=0, description="seconds for all tries together")


class Health(Strict):
    """Passive health (outlier detection, as Envoy does it): a replica is ejected for `cooldown`
    seconds after `failures` failures in a row — 5xx or broken answers, each from a different
    request that another replica then answered — or at once when it cannot be reached or does
    not answer in time; then one request probes it. A request that fails the same way on every
    replica it tried is that request's failure and counts against none."""

    failures: int = Field(default=5, ge=1, description="consecutive failures that eject a replica")
    cooldown: float = Field(default=30.0, gt=0, description="seconds an ejected replica is left alone")


class Deployment(Strict):
    name: str = Field(min_length=1)
    backend: str = Field(default="echo", description=" | ".join(BACKEND_KINDS))
    model: str | None = Field(
        default=None, description="The model name the backend serves (defaults to the name)."
    )
    models: list[str] = Field(
        default_factory=list,
        description='Model names routed here besides `name`; "*" catches every name.',
    )
    provider: str = "chatgate"
    extra_parameters: ExtraParamsPolicy = "error"
    price: Price | None = Field(default=None, description="per million tokens; gives cost counts and budgets")
    tokenizer: Path | None = Field(
        default=None,
        description="a tokenizer.json (Hugging Face tokenizers) to count prompt tokens exactly; "
        "otherwise about four characters a token, corrected by what the backend reports",
    )
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
    concurrency: Concurrency = Concurrency()
    routing: Routing = Routing()

    @field_validator("backend")
    @classmethod
    def known_backend(cls, backend: str) -> str:
        if backend not in BACKEND_KINDS:
            raise ValueError(f"unknown backend {backend!r}; one of {', '.join(BACKEND_KINDS)}")
        return backend

    def replica_options(self) -> list[tuple[str, float, dict[str, Any]]]:
        """(name, weight, merged options) of each replica."""
        replicas = self.replicas or [Replica()]
        return [
            (r.name or f"{self.name}-{i}", r.weight, {**self.options, **r.options})
            for i, r in enumerate(replicas)
        ]

    def max_concurrent(self) -> list[int]:
        """Each replica's admission limit, in the order of `replica_options`."""
        default = self.concurrency.max_concurrent
        return [r.max_concurrent or default for r in self.replicas or [Replica()]]

    @property
    def served_model(self) -> str:
        return self.model or self.name

    def metrics_urls(self) -> list[str | None]:
        """Each replica's own `metrics_url`, in the order of `replica_options`."""
        return [r.metrics_url for r in self.replicas or [Replica()]]


class Budget(Strict):
    """How much a key may use in a calendar period (UTC): tokens (prompt and completion), or
    cost, from the deployments' `price`. Held in the rate-limit store, like the limits."""

    model_config = ConfigDict(json_schema_extra=one_of("tokens", "cost"))

    tokens: int | None = Field(default=None, ge=1)
    cost: float | None = Field(default=None, gt=0, description="in the unit the prices are in")
    per: Literal["day", "week", "month"]
    hard: bool = Field(
        default=False,
        description="admission reserves the most a request may use (its prompt and max_tokens, or "
        "the deployment's default), so the budget is never passed; a soft budget reserves only the "
        "prompt and may be passed by what the requests in flight generate",
    )

    @model_validator(mode="after")
    def one_measure(self) -> Budget:
        if (self.tokens is None) == (self.cost is None):
            raise ValueError("give tokens or cost (one of them)")
        return self

    @property
    def measure(self) -> Literal["tokens", "cost"]:
        return "tokens" if self.tokens is not None else "cost"

    @property
    def amount(self) -> float:
        return float(self.tokens if self.tokens is not None else self.cost or 0)


class Price(Strict):
    """What a million tokens cost on a deployment (any currency; budgets use the same unit)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


class Key(Strict):
    """An API key, stored only as its SHA-256 (`chatgate keys new NAME` makes one)."""

    model_config = ConfigDict(json_schema_extra=one_of("sha256", "sha256_file"))

    # printable: a name reaches terminals (`chatgate keys list`), logs and metrics' labels
    name: str = Field(min_length=1, pattern=r"^[^\x00-\x1f\x7f-\x9f]+$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="The key's SHA-256, in hex.")
    sha256_file: Path | None = Field(default=None, description="A file holding the SHA-256 instead.")
    deployments: list[str] = Field(default_factory=lambda: ["*"])
    limits: Limits = Limits()
    budgets: list[Budget] = Field(default_factory=list)
    expires: datetime | None = Field(default=None, description="after this instant the key is refused")

    @model_validator(mode="before")
    @classmethod
    def sha256_from_file(cls, values: Any) -> Any:
        return from_file(values, "sha256")

    @field_validator("expires")
    @classmethod
    def in_utc(cls, expires: datetime | None) -> datetime | None:
        """A date or time without a zone is UTC."""
        return expires.replace(tzinfo=UTC) if expires is not None and expires.tzinfo is None else expires


class BreakerSettings(Strict):
    """After `failures` failures in a row the store is not asked for `reset_after` seconds:
    requests are admitted (fail-open) or refused (fail-closed) at once instead of waiting."""

    failures: int = Field(default=3, ge=1)
    reset_after: float = Field(default=5.0, gt=0)


class RedisLimits(Strict):
    model_config = ConfigDict(json_schema_extra=one_of("url", "url_file"))

    url: str = Field(description="redis://[user:password@]host:port/db")
    url_file: Path | None = Field(default=None, description="A file holding the URL instead.")
    on_error: Literal["fail-open", "fail-closed"] = "fail-closed"
    prefix: str = "chatgate:limits:"
    timeout: float = Field(default=0.5, gt=0, description="seconds to wait for Redis on one call")
    max_connections: int = Field(
        default=100, ge=1, description="connections to Redis per worker; more calls at once wait for one"
    )
    pool_timeout: float = Field(
        default=2.0,
        gt=0,
        description="seconds a call waits for a free connection; then it is answered as on_error says "
        "(the breaker does not count it: a busy worker is not a failing store)",
    )
    reservation_lease: float = Field(
        default=120.0,
        gt=0,
        description="seconds a budget reservation counts unless its gateway renews it (every third of "
        "this while the request runs): the reservations of a gateway that died stop counting after it",
    )
    breaker: BreakerSettings = BreakerSettings()

    @model_validator(mode="before")
    @classmethod
    def url_from_file(cls, values: Any) -> Any:
        return from_file(values, "url")


class RateLimiting(Strict):
    """Where counters live: this process (`memory`) or a Redis shared by every replica."""

    store: Literal["memory", "redis"] = "memory"
    redis: RedisLimits | None = None


class ResponseStoreSettings(Strict):
    """The Responses API's stored responses (`store`, `previous_response_id`, `GET /responses/{id}`),
    each visible only to the key that made it: in this process's memory (forgotten on restart),
    or in the Redis of `rate_limits` when that is the store, where every replica sees them."""

    ttl: float = Field(
        default=30 * 24 * 3600.0, gt=0, description="seconds a stored response is kept (30 days by default)"
    )
    max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="the most bytes of stored responses kept in memory; the oldest go first (0: store "
        "nothing). With Redis, Redis's own memory policy bounds them",
    )
    prefix: str = Field(default="chatgate:responses:", description="the Redis key prefix")


GLOBAL_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


class FilterRules(Strict):
    """Words (matched whole, any case) and regular expressions, searched as one expression."""

    words: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list)

    @field_validator("patterns")
    @classmethod
    def compiles(cls, patterns: list[str]) -> list[str]:
        for index, pattern in enumerate(patterns):
            try:
                re.compile(scoped(pattern))
            except re.error as error:
                raise ValueError(f"[{index}] bad regular expression {pattern!r}: {error}") from None
        return patterns

    def compiled(self) -> re.Pattern[str] | None:
        """One expression for all rules (one search per text, not one per rule)."""
        alternatives = [rf"\b{re.escape(word)}\b" for word in self.words]
        alternatives += [scoped(pattern) for pattern in self.patterns]
        if not alternatives:
            return None
        return re.compile("|".join(f"(?:{a})" for a in alternatives), re.IGNORECASE)


def scoped(pattern: str) -> str:
    """`(?i)rest` → `(?i:rest)`: a leading global flag may not stand inside an alternation, so it
    is scoped to its own pattern (what its author meant)."""
    match = GLOBAL_FLAGS.match(pattern)
    return pattern if match is None else f"(?{match.group(1)}:{pattern[match.end() :]})"


class ContentFilter(Strict):
    input: FilterRules = FilterRules()
    output: FilterRules = FilterRules()


class Shutdown(Strict):
    """What SIGTERM does: /ready answers 503 at once; new connections are still served for
    `drain` seconds (so load balancers notice), then refused; requests and streams in flight
    get `deadline` more seconds to finish; then the process exits 0."""

    drain: float = Field(default=0.0, ge=0)
    deadline: float = Field(default=30.0, ge=0)


class ClientLimits(Strict):
    """What one client may hold of a worker (gateway/server/edge.py)."""

    max_header_bytes: int = Field(
        default=64 * 1024, ge=1024, description="request line and headers; more → 431"
    )
    header_timeout: float = Field(default=10.0, gt=0, description="seconds for a request's headers; → 408")
    body_timeout: float = Field(default=60.0, gt=0, description="seconds for a request's body; → 408")
    keepalive_timeout: float = Field(default=5.0, gt=0, description="seconds an idle connection is kept")
    write_timeout: float = Field(
        default=30.0,
        gt=0,
        description="seconds a client may take nothing of an answer waiting for it; then (within a "
        "third more) the connection is cut and what it held freed",
    )
    unsent_bytes: int = Field(
        default=64 * 1024,
        ge=4096,
        description="bytes a connection's socket holds that the client has not taken "
        "(TCP_NOTSENT_LOWAT); past them an answer waits for the client",
    )
    max_pipelined: int = Field(
        default=16, ge=1, description="requests waiting on one connection behind an answer; more → 503"
    )
    max_connections: int = Field(
        default=1000, ge=1, description="connections per worker; more get only the probes' answers"
    )
    probe_connections: int = Field(
        default=32,
        ge=0,
        description="connections past max_connections taken to answer /health, /ready and /metrics "
        "(anything else: 503); past those, closed at once",
    )


class MediaFetch(Strict):
    """How the gateway fetches a remote image (`media.remote_images: fetch`)."""

    timeout: float = Field(
        default=10.0,
        gt=0,
        description="seconds for a request's images, fetched at once (four at a time), redirects included",
    )
    max_redirects: int = Field(default=3, ge=0, description="redirects followed, each target screened")
    max_bytes: int = Field(
        default=20 * 1024 * 1024, ge=1, description="the largest image fetched; larger: 413"
    )


class Media(Strict):
    """Images an OVMS request names by path or URL (gateway/policy/media.py)."""

    allowed_local_media_path: Path | None = Field(
        default=None,
        description="a directory whose files an OVMS request may name as images, by absolute path "
        "(OVMS's --allowed_local_media_path): read by the gateway, symlinks resolved and kept "
        "inside it; none: local paths are refused with 403",
    )
    max_local_media_bytes: int = Field(
        default=20 * 1024 * 1024, ge=1, description="the largest local image read; larger: 413"
    )
    remote_images: Literal["refuse", "fetch", "forward"] = Field(
        default="refuse",
        description="http(s) image URLs: refused with 403; fetched by the gateway (each address "
        "screened, redirects too) and passed on as data: URLs; or forwarded for the backend to "
        "fetch (screened once: the backend's own redirects and DNS lookups are not)",
    )
    allowed_private_networks: list[IPvAnyNetwork] = Field(
        default_factory=list,
        description="networks (CIDR) image URLs may reach although they are not public, e.g. an "
        "internal image store; loopback, link-local and private addresses are refused otherwise",
    )
    max_images_per_request: int = Field(
        default=16, ge=1, description="images read or fetched (or forwarded) for one request; more: 413"
    )
    max_media_bytes_per_request: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="bytes of local and fetched images together in one request; more: 413",
    )
    max_media_bytes_in_flight: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        description="bytes of read and fetched images a worker holds at once, across its requests "
        "(until each request's answer ends); a request that would pass it: 503 with Retry-After",
    )
    fetch: MediaFetch = MediaFetch()

    @field_validator("allowed_local_media_path")
    @classmethod
    def existing_directory(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        if not path.is_absolute():
            raise ValueError(f"{path} is not an absolute path")
        if not path.is_dir():
            raise ValueError(f"{path} is not a directory")
        return path.resolve()


class Server(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_response_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="largest answer relayed; past it a JSON answer is a 502 and a stream ends with an error",
    )
    shutdown: Shutdown = Shutdown()
    clients: ClientLimits = ClientLimits()
    log_buffer_lines: int = Field(
        default=10_000, ge=1, description="log lines held while stdout or stderr is not read; then dropped"
    )


class TracingSettings(Strict):
    """OpenTelemetry traces (gateway/telemetry/tracing.py); also on when OTEL_TRACES_EXPORTER is set.
    The exporter's endpoint and headers come from the standard OTEL_EXPORTER_OTLP_* variables."""

    enabled: bool = False
    exporter: Literal["otlp", "console", "none"] = "otlp"
    service_name: str = "chatgate"
    sample_ratio: float = Field(default=1.0, ge=0, le=1, description="of traces that have no parent")


def given_twice(names: Iterable[str]) -> list[str]:
    """The names given more than once, sorted (in one pass: a keys file holds thousands)."""
    counts = Counter(names)
    return sorted(name for name, count in counts.items() if count > 1)


class Settings(Strict):
    auth: Literal["keys", "none"] | None = Field(
        default=None,
        description='"keys": every request needs a key (with none configured, every request is '
        'refused); "none": the gateway is open, and no keys may be configured. Absent: "keys" when '
        "the config names keys or a keys_file, else none. A gateway that requires keys never "
        "becomes open by a reload unless the new config says `auth: none`.",
    )
    server: Server = Server()
    mounts: dict[str, str | None] = Field(
        default_factory=default_mounts, json_schema_extra=lambda schema: schema.update(mounts_schema())
    )
    keys: list[Key] = Field(default_factory=list)
    keys_file: Path | None = Field(
        default=None,
        description="a YAML list of more keys (`chatgate keys new/revoke/list --file`); the gateway "
        "reloads it when it changes",
    )
    rate_limits: RateLimiting = RateLimiting()
    responses: ResponseStoreSettings = ResponseStoreSettings()
    content_filter: ContentFilter = ContentFilter()
    tracing: TracingSettings = TracingSettings()
    media: Media = Media()
    deployments: list[Deployment] = Field(
        default_factory=lambda: [Deployment(name="echo", backend="echo", models=["*"])],
        min_length=1,
    )
    # what the process environment says, read when the settings are made (gateway/config/environment.py)
    _environment: Environment = PrivateAttr(default_factory=lambda: Environment.from_environ(os.environ))

    @property
    def environment(self) -> Environment:
        return self._environment

    def in_environment(self, environment: Environment) -> Settings:
        """These settings, carrying the given environment (the loader's snapshot)."""
        copy = self.model_copy()
        copy._environment = environment
        return copy

    @field_validator("mounts")
    @classmethod
    def known_dialects_one_a_mount(cls, mounts: dict[str, str | None]) -> dict[str, str | None]:
        defaults = default_mounts()
        unknown = sorted(set(mounts) - set(defaults))
        if unknown:
            raise ValueError(f"unknown dialects {unknown}; the dialects are {', '.join(defaults)}")
        merged = {name: normalised_mount(mounts.get(name, default)) for name, default in defaults.items()}
        taken: dict[str, str] = {}
        for dialect, mount in merged.items():
            if mount is None:
                continue
            if mount in taken:
                raise ValueError(
                    f"{taken[mount]} and {dialect} are both mounted at {mount or '/'!r}: "
                    "give each its own path"
                )
            taken[mount] = dialect
        return merged

    @field_validator("deployments")
    @classmethod
    def unique_deployment_names(cls, deployments: list[Deployment]) -> list[Deployment]:
        duplicates = given_twice(d.name for d in deployments)
        if duplicates:
            raise ValueError(f"deployment names must be unique: {', '.join(duplicates)}")
        return deployments

    @field_validator("keys")
    @classmethod
    def unique_key_names(cls, keys: list[Key]) -> list[Key]:
        duplicates = given_twice(k.name for k in keys)
        if duplicates:
            raise ValueError(f"key names must be unique (config and keys file): {', '.join(duplicates)}")
        return keys

    @property
    def keyed(self) -> bool:
        """Whether every request needs a key."""
        if self.auth is not None:
            return self.auth == "keys"
        return bool(self.keys) or self.keys_file is not None

    @model_validator(mode="after")
    def references_exist(self) -> Settings:
        if self.auth == "none" and (self.keys or self.keys_file is not None):
            raise ValueError("auth: none leaves the gateway open: it cannot have keys or a keys_file")
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


REFERENCE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_references(node: Any, environ: Mapping[str, str], where: str = "") -> Any:
    """`${NAME}` and `${NAME:-default}` in every string of the config, read from the
    environment (`$$` is a literal `$`), so secrets need not sit in the file."""
    if isinstance(node, dict):
        return {
            k: expand_references(v, environ, f"{where}.{k}" if where else str(k)) for k, v in node.items()
        }
    if isinstance(node, list):
        return [expand_references(v, environ, f"{where}.{i}") for i, v in enumerate(node)]
    if not isinstance(node, str) or "$" not in node:
        return node

    def value_of(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name is None:
            return "$"
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where or '(top level)'}: environment variable {name} is not set")

    return REFERENCE.sub(value_of, node)


def check_backends(settings: Settings) -> None:
    """Each replica's options against its backend's own options model, and the backend's
    optional dependencies: what would otherwise fail inside a worker, refused before any starts."""
    for index, deployment in enumerate(settings.deployments):
        kind = BACKEND_KINDS[deployment.backend]
        where = f"deployments.{index} ({deployment.name!r})"
        if missing := kind.missing():
            raise ConfigError(
                f"{where}: the {kind.name} backend needs {', '.join(missing)}, "
                f"not installed here: {kind.install}"
            )
        if deployment.tokenizer is not None:
            from gateway.core.token_count import PromptCounter

            try:
                PromptCounter(deployment.tokenizer)
            except ConfigError as error:
                raise ConfigError(f"{where}.{error}") from None
        model = kind.load(kind.options)
        for replica_name, _weight, options in deployment.replica_options():
            try:
                model.model_validate(options)
            except ValidationError as error:
                problems = describe(error).replace("; ", f"; {where}.options.")
                raise ConfigError(f"{where}.options.{problems} (replica {replica_name!r})") from None
