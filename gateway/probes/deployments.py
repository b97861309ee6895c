"""The deployments that ask for it (`options.probe: true`), probed in the background at start
and on reload: each replica gets the dialect's probes, and the deployment's capabilities are
narrowed by what any replica does not honour (a request may go to any of them). Start is never
delayed: until the probes are done, and while the upstream cannot be probed (it is down, or
refuses the gateway's key), the capabilities are as declared, and the probes are tried again."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from backends.http.status import redacted
from gateway.fleet.router import Replica, RoutedDeployment, Router
from gateway.probes.findings import ProbeReport, ProbeUnavailable
from gateway.probes.narrowing import narrowed, not_honoured, refused_requests
from gateway.probes.sets import PROBE_SETS

if TYPE_CHECKING:
    from backends.openai_compatible import OpenAICompatibleBackend
    from gateway.probes.runner import Target

log = logging.getLogger("chatgate.probes")
RETRY_SECONDS = (5.0, 15.0, 60.0)  # waits after failed tries; the last, for good


@dataclass(slots=True)
class DeploymentProbe:
    """A deployment's probing: where it stands, and what each replica's probes found."""

    state: Literal["probing", "done", "failed"] = "probing"
    reports: dict[str, ProbeReport] = field(default_factory=dict)  # by replica
    # by replica: why it was not probed, as anyone may read it (the plain request's HTTP status,
    # never the upstream's words or address: those are in the log, its secrets redacted)
    failures: dict[str, str] = field(default_factory=dict)
    features: set[str] = field(default_factory=set)  # not honoured by some replica: narrowed

    def as_json(self) -> dict[str, Any]:
        replicas: dict[str, Any] = {name: {"error": why} for name, why in self.failures.items()}
        for name, report in self.reports.items():
            replicas[name] = {"findings": report.verdicts()}
        return {
            "state": self.state,
            "narrowed": sorted(self.features),
            "refused": refused_requests(self.features),
            "replicas": replicas,
        }


PROBED_KIND = "openai-compatible"  # the one backend whose upstream is probed


def probed_backend(routed: RoutedDeployment, replica: Replica) -> OpenAICompatibleBackend | None:
    """The replica's backend when it is probed. Its module (and the HTTP client with it) is
    imported only where a deployment has such a backend: it already has, by then."""
    if routed.config.backend != PROBED_KIND:
        return None
    from backends.openai_compatible import OpenAICompatibleBackend

    backend = replica.backend
    if isinstance(backend, OpenAICompatibleBackend) and backend.options.probe:
        return backend
    return None


def target_of(backend: OpenAICompatibleBackend) -> Target:
    """The replica's upstream, reached as the backend reaches it (its headers and key, proxy, TLS)."""
    from gateway.probes.runner import Target

    return Target(
        backend.shown_url,
        backend.upstream_model,
        backend.client.headers,
        timeout=backend.options.probe_timeout,
        connect=backend.options.connect,
        proxy=backend.proxy,
        tls=backend.tls,
    )


def unavailable(status: int) -> str:
    if not status:
        return "the upstream did not answer a plain request"
    return f"the upstream answered a plain request with HTTP {status}"


async def probe_deployment(routed: RoutedDeployment) -> DeploymentProbe:
    from gateway.probes.runner import probe

    found = DeploymentProbe()
    probes = PROBE_SETS["openai"]  # what the openai-compatible backend speaks upstream

    async def one(replica: Replica, backend: OpenAICompatibleBackend) -> None:
        target = target_of(backend)
        try:
            found.reports[replica.name] = await probe(target, probes)
        except ProbeUnavailable as error:
            found.failures[replica.name] = unavailable(error.status)
            log.warning(
                "deployment %s, replica %s: %s",
                routed.name,
                replica.name,
                redacted(str(error), target.headers.values()),
            )
        except Exception as error:  # a background task: a bug here must not end the probing unseen
            log.error(
                "deployment %s, replica %s: probing failed: %s",
                routed.name,
                replica.name,
                redacted(f"{type(error).__name__}: {error}", target.headers.values()),
            )
            found.failures[replica.name] = "the probes failed (see the gateway's log)"

    await asyncio.gather(
        *(one(r, b) for r in routed.replicas if (b := probed_backend(routed, r)) is not None)
    )
    for report in found.reports.values():
        found.features |= not_honoured(report.findings)
    found.state = "done" if found.reports else "failed"
    return found


class DeploymentProbes:
    """The probing of one runtime's deployments; `previous`: the one a reload replaces (what it
    found shows until the new probes are done)."""

    def __init__(self, router: Router, previous: DeploymentProbes | None = None) -> None:
        self.deployments = {
            name: routed
            for name, routed in router.deployments.items()
            if any(probed_backend(routed, r) is not None for r in routed.replicas)
        }
        # a deployment the reload kept shows what was found until its new probes are done
        kept = previous.results if previous is not None else {}
        self.results: dict[str, DeploymentProbe] = {
            name: DeploymentProbe(reports=dict(last.reports), features=set(last.features))
            if (last := kept.get(name)) is not None
            and last.reports
            and previous is not None
            and previous.deployments.get(name) is routed
            else DeploymentProbe()
            for name, routed in self.deployments.items()
        }
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        for name, routed in self.deployments.items():
            task = asyncio.get_running_loop().create_task(self.keep_probing(name, routed))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def keep_probing(self, name: str, routed: RoutedDeployment) -> None:
        declared = routed.declared()
        tries = 0
        while True:
            found = await probe_deployment(routed)
            if found.state == "done":
                self.results[name] = found
                routed.capabilities = narrowed(declared, found.features)
                log.info(
                    "deployment %s: probed; not honoured: %s",
                    name,
                    ", ".join(sorted(found.features)) or "none",
                )
                return
            wait = RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)]
            tries += 1
            current = self.results[name]
            current.failures = found.failures
            if not current.reports:  # nothing found yet: as declared
                current.state = "failed"
            log.warning(
                "deployment %s: cannot probe (%s); capabilities as declared, trying again in %g s",
                name,
                "; ".join(sorted(set(found.failures.values()))),
                wait,
            )
            await asyncio.sleep(wait)

    def summary(self) -> dict[str, Any]:
        return {name: result.as_json() for name, result in self.results.items()}

    async def aclose(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
