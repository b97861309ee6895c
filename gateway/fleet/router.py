"""Routing: the request's model name (or Azure's deployment header) → a chain of deployments
(the one asked for, then its fallbacks); within a deployment, a healthy replica chosen by
least load among two weighted random picks (or in turn: `routing.pick: round-robin`), among
those with room for one more (a replica takes `max_concurrent` at once; the rest wait in the
deployment's `WaitQueue`). The load is the gateway's own count of requests on the replica, or
what its server says (`routing.load_from: metrics`, gateway/fleet/server_load.py); with
`routing.affinity`, the replica holding the prompt's longest prefix goes first
(gateway/fleet/affinity.py)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from backends import Backend, Capabilities, create_backend
from gateway.config.capabilities import effective
from gateway.config.settings import ConfigError, Deployment
from gateway.core.canonical import ChatRequest
from gateway.core.errors import DeploymentNotFound, ModelNotFound
from gateway.fleet.affinity import AffinityTable, Prompt, prompt_of
from gateway.fleet.server_load import LoadWatch, ServerLoad, Target, metrics_url
from gateway.fleet.wait_queue import WaitQueue

WILDCARD = "*"


@dataclass(slots=True)
class Replica:
    """One backend instance, with the passive-health state kept for it.

    Outlier detection as Envoy does it: a replica is ejected for `cooldown` seconds after
    `failures_to_eject` failures in a row, each from a different request that another replica
    then answered (a request that fails the same way everywhere is that request's fault, and
    marks nothing), or at once when it cannot be reached or does not answer in time. After the
    cool-down one request probes it.

    It serves `limit` upstream requests at once (`outstanding`: a request takes a slot, or one
    a choice where each choice is its own upstream request); each slot freed wakes the request
    at the head of `queue`, if one waits."""

    name: str
    weight: float
    backend: Backend
    failures_to_eject: int
    cooldown: float
    limit: int = 1 << 62
    queue: WaitQueue | None = None
    outstanding: int = 0
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    probing: bool = False
    latency: float = 0.0  # moving average of recent successful requests, in seconds
    server: ServerLoad | None = None  # its server's last word on its load (routing.load_from)
    stale_after: float = math.inf  # seconds after which that word no longer counts

    def load(self, now: float) -> float:
        """Its load in requests: what its server last said, brought up to date with the
        gateway's own count, or the gateway's count alone (no metrics read, or none lately)."""
        server = self.server
        if server is None or now - server.read_at > self.stale_after:
            return self.outstanding
        return server.now(self.outstanding)

    def available(self, now: float) -> bool:
        """Healthy, or out of its cool-down and not already being probed."""
        if self.consecutive_failures < self.failures_to_eject:
            return True
        return now >= self.ejected_until and not self.probing

    @property
    def healthy(self) -> bool:
        return self.consecutive_failures < self.failures_to_eject

    @property
    def has_room(self) -> bool:
        return self.outstanding < self.limit

    def has_room_for(self, slots: int) -> bool:
        return self.outstanding + slots <= self.limit

    def released(self, slots: int = 1, key: str = "") -> None:
        self.outstanding -= slots
        queue = self.queue
        if queue is not None:
            left = queue.running[key] - slots
            if left > 0:
                queue.running[key] = left
            else:
                del queue.running[key]
            for _ in range(min(slots, len(queue))):
                queue.wake()

    def started(self, slots: int = 1, key: str = "") -> None:
        self.outstanding += slots
        if self.queue is not None:
            self.queue.running[key] += slots
        if not self.healthy:
            self.probing = True  # this request is the probe

    def succeeded(self, seconds: float, slots: int = 1, key: str = "") -> None:
        self.released(slots, key)
        self.latency = seconds if not self.latency else 0.7 * self.latency + 0.3 * seconds
        self.consecutive_failures = 0
        self.probing = False

    def finished_without_verdict(self, slots: int = 1, key: str = "") -> None:
        """The attempt ended with no health signal yet (the client went away, the request was
        refused for its own sake, or its verdict waits on another replica)."""
        self.released(slots, key)
        self.probing = False

    def failed(self, slots: int = 1, key: str = "") -> None:
        """An attempt that failed by the replica's fault: one more in a row."""
        self.finished_without_verdict(slots, key)
        self.count_failure()

    def count_failure(self) -> None:
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.failures_to_eject:
            self.ejected_until = time.monotonic() + self.cooldown

    def eject(self, slots: int = 1, key: str = "") -> None:
        """Out at once (it cannot be reached, or did not answer in time)."""
        self.finished_without_verdict(slots, key)
        self.consecutive_failures = max(self.consecutive_failures + 1, self.failures_to_eject)
        self.ejected_until = time.monotonic() + self.cooldown


@dataclass(slots=True)
class RoutedDeployment:
    config: Deployment
    replicas: list[Replica]
    capabilities: Capabilities = field(init=False)
    queue: WaitQueue = field(init=False)
    fallbacks: list[RoutedDeployment] = field(default_factory=list)
    watch: LoadWatch | None = None  # reads its replicas' /metrics (routing.load_from: metrics)
    affinity: AffinityTable | None = field(init=False)
    turn: int = field(init=False, default=0)  # round-robin's next

    def __post_init__(self) -> None:
        self.capabilities = self.declared()
        concurrency = self.config.concurrency
        self.queue = WaitQueue(concurrency.queue, concurrency.queue_timeout)
        for replica in self.replicas:
            replica.queue = self.queue
        affinity = self.config.routing.affinity
        self.affinity = AffinityTable(affinity.max_blocks, affinity.bound) if affinity.enabled else None

    def prompt_of(self, request: ChatRequest) -> Prompt | None:
        """The request's prompt as the affinity table reads it; None without affinity."""
        if self.affinity is None:
            return None
        key = request.options.get("prompt_cache_key") or request.trace.session or request.user
        block_chars = self.config.routing.affinity.block_chars
        return prompt_of(request.messages, request.tools, key if isinstance(key, str) else None, block_chars)

    @property
    def name(self) -> str:
        return self.config.name

    def declared(self) -> Capabilities:
        """The backend's capabilities as the config narrows them; where each choice is its own
        upstream request (a fan-out), no more choices than a replica has slots: a request takes
        a slot a choice, so `max_concurrent` bounds the upstream requests, not the client's."""
        found = effective(self.replicas[0].backend.capabilities, self.config.capabilities)
        slots = min(replica.limit for replica in self.replicas)
        if found.requests_per_choice and slots < found.max_n:
            found = replace(found, max_n=max(1, slots))
        return found

    def slots_for(self, request: ChatRequest) -> int:
        """The slots a request takes of the replica it goes to: one, or one a choice."""
        return request.n if self.capabilities.requests_per_choice else 1

    @property
    def model(self) -> str:
        return self.config.served_model

    @property
    def provider(self) -> str:
        return self.config.provider

    @property
    def healthy(self) -> bool:
        return any(r.healthy for r in self.replicas)

    def pick(
        self, exclude: set[str], rng: random.Random, slots: int = 1, prompt: Prompt | None = None
    ) -> Replica | None:
        """Among the available replicas with room: the one holding the prompt's longest prefix
        (`prompt`: with affinity, unless it is overloaded), else the power of two choices: two
        weighted random ones, the one with less load per weight wins, and on a tie the one that
        has been faster (or the next in turn, with `pick: round-robin`)."""
        now = time.monotonic()
        candidates = [
            r for r in self.replicas if r.name not in exclude and r.has_room_for(slots) and r.available(now)
        ]
        if not candidates:
            return None
        if prompt is None or self.affinity is None:
            return self.balanced(candidates, rng, now)
        loads = [r.load(now) / r.weight for r in self.replicas if r.available(now)]
        chosen = self.affinity.choose(prompt, candidates, loads, lambda r: r.load(now) / r.weight)
        if chosen is None:
            chosen = self.balanced(candidates, rng, now)
        self.affinity.learn(prompt, chosen.name)
        return chosen

    def balanced(self, candidates: list[Replica], rng: random.Random, now: float) -> Replica:
        if self.config.routing.pick == "round-robin":
            self.turn += 1
            return candidates[self.turn % len(candidates)]
        return two_choices(candidates, rng, now)

    def pick_ejected(
        self, exclude: set[str], never: set[str], rng: random.Random, slots: int = 1
    ) -> Replica | None:
        """A replica with room when none is available (every one ejected), chosen as `pick`
        chooses, one not tried yet if there is one: panic routing, as Envoy's panic threshold
        does it. `never`: replicas this request must not go back to."""
        allowed = [r for r in self.replicas if r.name not in never and r.has_room_for(slots)]
        fresh = [r for r in allowed if r.name not in exclude]
        return two_choices(fresh or allowed, rng, time.monotonic()) if allowed else None

    def full(self, never: set[str], slots: int = 1) -> bool:
        """A replica this request may still go to has no room now (so waiting is worth it)."""
        return any(not r.has_room_for(slots) for r in self.replicas if r.name not in never)

    def drain_seconds(self) -> int:
        """About how long the requests waiting now take to be served (for Retry-After): each
        replica's slots free at its average request's pace; at least 1."""
        pace = sum(r.limit / r.latency for r in self.replicas if r.latency > 0)  # slots a second
        if not pace:
            return 1
        return max(1, math.ceil((len(self.queue) + 1) / pace))

    def start(self) -> None:
        """Begin reading its replicas' load (in the running event loop), where it does."""
        if self.watch is not None:
            self.watch.start()

    async def aclose(self) -> None:
        """Stop reading its replicas' load, and close their backends."""
        if self.watch is not None:
            await self.watch.aclose()
        for replica in self.replicas:
            await replica.backend.aclose()

    def chain(self) -> list[RoutedDeployment]:
        """This deployment, then its fallbacks in preference order."""
        return [self, *self.fallbacks]


def two_choices(candidates: list[Replica], rng: random.Random, now: float) -> Replica:
    if len(candidates) == 1:
        return candidates[0]
    first = rng.choices(candidates, weights=[r.weight for r in candidates])[0]
    others = [r for r in candidates if r is not first]
    second = rng.choices(others, weights=[r.weight for r in others])[0]
    return min((first, second), key=lambda r: ((r.load(now) + 1) / r.weight, r.latency))


def pool_size(backend: Backend) -> int | None:
    """The most connections an HTTP backend opens to its upstream at once (its options'
    `max_connections`); None: no cap of its own."""
    return getattr(getattr(backend, "options", None), "max_connections", None)


def load_watch(config: Deployment, replicas: list[Replica]) -> LoadWatch | None:
    """The reads of the replicas' /metrics, where the deployment routes on them: each at its
    `metrics_url`, else at its base URL's /metrics, with its key where it has one."""
    routing = config.routing
    if routing.load_from != "metrics":
        return None
    targets = []
    for replica, url in zip(replicas, config.metrics_urls(), strict=True):
        options = getattr(replica.backend, "options", None)
        base = getattr(options, "base_url", None) or getattr(options, "url", None)
        if url is None and not isinstance(base, str):
            raise ConfigError(
                f"deployment {config.name!r}, replica {replica.name!r}: routing.load_from is metrics, "
                "but its backend has no base URL: give the replica a metrics_url"
            )
        secret = getattr(options, "api_key", None)
        key = (
            secret.get_secret_value()
            if secret is not None and hasattr(secret, "get_secret_value")
            else secret
        )
        headers = {"authorization": f"Bearer {key}"} if isinstance(key, str) and key else {}
        targets.append(Target(replica, url or metrics_url(str(base)), headers))
        replica.stale_after = routing.stale_after * routing.scrape_interval + routing.scrape_timeout
    return LoadWatch(targets, routing.scrape_interval, routing.scrape_timeout, config.served_model)


class Router:
    def __init__(
        self,
        deployments: list[Deployment],
        kept: Mapping[str, RoutedDeployment] | None = None,
        proxy_environment: Mapping[str, str] | None = None,
    ) -> None:
        """`kept`: a previous router's deployments, reused where their config is unchanged (a
        reload keeps their backends, pools and health). `proxy_environment`: the proxy variables
        (the settings' environment), for backends with `proxy: env`."""
        kept = kept or {}
        proxies = proxy_environment or {}
        self.deployments = {
            d.name: kept[d.name] if d.name in kept and kept[d.name].config == d else self.build(d, proxies)
            for d in deployments
        }
        for routed in self.deployments.values():
            routed.fallbacks = [self.deployments[name] for name in routed.config.fallback]
        self.by_model: dict[str, RoutedDeployment] = {}
        self.catch_all: RoutedDeployment | None = None
        for routed in self.deployments.values():
            for model in (routed.name, routed.model, *routed.config.models):
                if model == WILDCARD:
                    self.catch_all = self.catch_all or routed
                else:
                    self.by_model.setdefault(model, routed)
        self.rng = random.Random()

    @staticmethod
    def build(config: Deployment, proxy_environment: Mapping[str, str]) -> RoutedDeployment:
        replicas = []
        limits = config.max_concurrent()
        for (name, weight, options), limit in zip(config.replica_options(), limits, strict=True):
            try:
                backend = create_backend(config.backend, config.served_model, options, proxy_environment)
            except (ValueError, TypeError, OSError, ImportError) as error:
                raise ConfigError(
                    f"deployment {config.name!r}, replica {name!r}: the {config.backend} backend "
                    f"cannot start: {error}"
                ) from None
            # a pool smaller than the limit would make admitted requests wait for a connection
            # and fail after `connect`: the limit is the pool's size then, and the rest queue here
            pool = pool_size(backend)
            replicas.append(
                Replica(
                    name, weight, backend, config.health.failures, config.health.cooldown,
                    limit=min(limit, pool) if pool else limit,
                )
            )  # fmt: skip
        return RoutedDeployment(config, replicas, watch=load_watch(config, replicas))

    def model_names(self, visible: Callable[[str], bool] = lambda deployment: True) -> list[str]:
        """The models served, those of deployments `visible` lets through (a key's)."""
        return [model for model, routed in self.by_model.items() if visible(routed.name)]

    @property
    def default(self) -> RoutedDeployment:
        return next(iter(self.deployments.values()))

    def route(self, model: str | None, deployment_name: str | None = None) -> RoutedDeployment:
        if deployment_name:
            routed = self.deployments.get(deployment_name)
            if routed is None:
                raise DeploymentNotFound(deployment_name)
            return routed
        if model is None:  # dialects where `model` is optional: the first deployment serves
            return self.default
        routed = self.by_model.get(model) or self.catch_all
        if routed is None:
            raise ModelNotFound(model)
        return routed

    def unhealthy(self) -> list[str]:
        """Deployments with no healthy replica (for /ready: degraded; requests still try them)."""
        return [name for name, routed in self.deployments.items() if not routed.healthy]

    def start(self) -> None:
        """Start what runs in the background (the load reads), in the running event loop."""
        for routed in self.deployments.values():
            routed.start()

    async def aclose(self) -> None:
        for routed in self.deployments.values():
            await routed.aclose()
