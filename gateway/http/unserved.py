"""What a request to a path nothing here serves is told: where this gateway serves what the
client was after, when the path says, else what it serves.

Clients reach such paths for a few known reasons, each with its way forward: a base URL that
ends in `/v1` once too often (`/v1/v1/chat/completions`); a base URL without the mount (Anthropic's
SDKs pointed at the gateway's root send `/v1/messages`); openai's `AzureOpenAI` client, which
speaks Azure OpenAI (the deployment in the path) where chatgate serves Azure AI Model Inference
(the deployment as `model`); an API of the vendor's that chatgate does not serve (embeddings,
audio, …). Everything is built at start from the configured mounts and their documents, and read
only when a request found nothing, so a served request pays nothing for it.

An answer names only what the served documents publish to anyone (mounts, paths, required query
parameters): a gateway with keys tells a caller without one nothing more than its documents do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.core.terminal import bounded
from gateway.http.documents import HTTP_METHODS, resolve
from gateway.http.served_documents import SPEC_PATH

PATH_SHOWN = 200  # characters of the asked path an answer repeats
UNMATCHED = "unmatched"  # the metrics' one route label for every path nothing serves
EDGE = "edge"  # the route label of a request the connection refused before it was routed
SAFE_HOST = re.compile(r"^[A-Za-z0-9.:\[\]-]{1,255}$")
SOME_GATEWAY = "http://<host>:<port>"

# vendors' APIs clients call on a chat gateway's mounts that chatgate does not serve:
# the path's first segments under the mount (after an optional /v1) → what it is
OTHER_APIS: dict[str, str] = {
    "embeddings": "embeddings",
    "completions": "text completions (the legacy completions API)",
    "complete": "text completions (Anthropic's legacy complete API)",
    "messages/batches": "message batches",
    "audio": "audio (speech, transcriptions, translations)",
    "images": "images",
    "moderations": "moderations",
    "files": "files",
    "uploads": "uploads",
    "batches": "batches",
    "fine_tuning": "fine-tuning",
    "fine-tunes": "fine-tuning",
    "assistants": "assistants",
    "threads": "assistants' threads",
    "vector_stores": "vector stores",
    "realtime": "the Realtime API",
    "conversations": "conversations",
    "evals": "evals",
    "containers": "containers",
    "videos": "videos",
    "rerank": "reranking",
}
# how a dialect's clients are pointed at its mount ({base}: the mount's URL); others: "base URL {base}"
CLIENT_SETUP: dict[str, str] = {
    "openai": 'OpenAI(base_url="{base}")',
    "azure": 'OpenAI(base_url="{base}", default_query={query})',
    "anthropic": "ANTHROPIC_BASE_URL={base}",
}
AZURE = "azure"
# openai's AzureOpenAI client: `<endpoint>/openai/deployments/{d}/…` (`azure_endpoint`),
# `<base_url>/deployments/{d}/…`, and Azure's v1 style `<endpoint>/openai/v1/…`
AZURE_OPENAI_PATHS = (
    re.compile(r"^(?P<prefix>.*?)(?:/openai)?/deployments/(?P<deployment>[^/]+)/(?P<operation>.+)$"),
    re.compile(r"^(?P<prefix>.*?)/openai/v1/(?P<operation>.+)$"),
)


def template_regex(path: str) -> str:
    """`/models/{model}` → a regular expression whose groups are the path parameters."""
    parts = re.split(r"\{([^}]+)\}", path)
    return "".join(re.escape(part) if i % 2 == 0 else "[^/]+" for i, part in enumerate(parts))


@dataclass(frozen=True, slots=True)
class Route:
    """One served path: its methods, where it is mounted, and how its document writes it."""

    methods: tuple[str, ...]
    path: str  # as mounted: "/azure/chat/completions"
    own: str  # as the document writes it: "/chat/completions"
    query: tuple[tuple[str, str], ...]  # required query parameters, each with a value the document gives
    pattern: re.Pattern[str]  # the mounted path, whole
    tail: re.Pattern[str]  # the document's path, as the end of another

    def shown(self) -> str:
        query = "&".join(f"{name}={value}" for name, value in self.query)
        return f"{'|'.join(self.methods)} {self.path}{'?' + query if query else ''}"


@dataclass(frozen=True, slots=True)
class Mount:
    """One dialect's mount and what its document serves there."""

    dialect: str
    name: str  # from the document's title
    mount: str  # "" at the root
    routes: tuple[Route, ...]

    def holds(self, path: str) -> bool:
        return not self.mount or path == self.mount or path.startswith(self.mount + "/")

    def listing(self) -> str:
        return ", ".join(route.shown() for route in self.routes)

    def query(self) -> dict[str, str]:
        return {name: value for route in self.routes for name, value in route.query}

    def setup(self, base: str) -> str:
        """How a client is pointed at this mount."""
        template = CLIENT_SETUP.get(self.dialect, "base URL {base}")
        return template.format(base=base + self.mount, query=json.dumps(self.query()))

    @property
    def shown(self) -> str:
        return self.mount or "/"


def routes_of(document: dict[str, Any], mount: str) -> tuple[Route, ...]:
    found = []
    for own, item in document["paths"].items():
        methods = tuple(method.upper() for method in HTTP_METHODS if method in item)
        if not methods:
            continue
        query: dict[str, str] = {}
        for method in HTTP_METHODS:
            for raw in [*item.get("parameters", []), *item.get(method, {}).get("parameters", [])]:
                parameter = resolve(document, raw)
                if parameter.get("in") == "query" and parameter.get("required"):
                    query.setdefault(parameter["name"], value_for(document, parameter))
        regex = template_regex(own)
        found.append(
            Route(
                methods=methods,
                path=mount + own,
                own=own,
                query=tuple(query.items()),
                pattern=re.compile(f"^{re.escape(mount)}{regex}$"),
                tail=re.compile(f"{regex}$"),
            )
        )
    return tuple(found)


def value_for(document: dict[str, Any], parameter: dict[str, Any]) -> str:
    """A value the document gives for a required parameter: its one allowed value, its default or
    its example."""
    schema = resolve(document, parameter.get("schema", {}))
    for value in [*(schema.get("enum") or [None])[:1], schema.get("default"), parameter.get("example")]:
        if value is not None:
            return str(value)
    return "…"


def gateway_address(scheme: str, host: bytes | None) -> str:
    """The gateway as this client reached it, for a copyable hint (a Host that looks odd: a
    placeholder, not the client's text)."""
    text = host.decode("latin-1") if host is not None else ""
    return f"{scheme}://{text}" if SAFE_HOST.match(text) else SOME_GATEWAY


class Unserved:
    """The mounts this gateway serves, and what a request to a path none of them serves is told."""

    def __init__(self) -> None:
        self.mounts: list[Mount] = []

    def add(self, dialect: str, mount: str, document: dict[str, Any]) -> None:
        title = str(document.get("info", {}).get("title", dialect))
        name = title.removeprefix("chatgate — ").removesuffix(" dialect")
        self.mounts.append(Mount(dialect, name, mount, routes_of(document, mount)))
        self.mounts.sort(key=lambda found: len(found.mount), reverse=True)  # longest first

    def holder(self, path: str) -> Mount | None:
        """The mount the path lies under (the longest), if any."""
        return next((mount for mount in self.mounts if mount.holds(path)), None)

    def dialect_at(self, path: str) -> str:
        holder = self.holder(path)
        return holder.dialect if holder is not None else ""

    def route_at(self, path: str) -> Route | None:
        for mount in self.mounts:
            for route in mount.routes:
                if route.pattern.match(path):
                    return route
        return None

    def message(self, path: str, base: str = SOME_GATEWAY) -> str:
        """The 404's text: the path (bounded, terminal-safe), then the way forward."""
        why = (
            self.doubled(path)
            or self.azure_openai(path, base)
            or self.other_api(path)
            or self.elsewhere(path, base)
            or self.listing(path)
        )
        return f"Not found: {bounded(path, PATH_SHOWN)}. {why}"

    def doubled(self, path: str) -> str:
        """A segment said twice in a row (`/v1/v1/…`) where the path with it once is served."""
        segments = path.split("/")
        for at in range(1, len(segments) - 1):
            segment = segments[at]
            if segment and segment == segments[at + 1]:
                route = self.route_at("/".join(segments[:at] + segments[at + 1 :]))
                if route is not None:
                    return (
                        f"The path repeats /{segment}: the client's base URL ends in /{segment} once "
                        f"too often. This gateway serves {route.shown()}."
                    )
        return ""

    def azure_openai(self, path: str, base: str) -> str:
        """openai's AzureOpenAI client's paths: pointed at the Azure AI Model Inference mount."""
        holder = self.holder(path)
        if holder is not None and holder.mount and holder.dialect != AZURE:
            return ""  # under another dialect's mount: that dialect's path
        match = next((m for p in AZURE_OPENAI_PATHS if (m := p.match(path)) is not None), None)
        if match is None:
            return ""
        said = (
            "This is an Azure OpenAI path (openai's AzureOpenAI client); chatgate does not serve "
            "Azure OpenAI's deployment paths."
        )
        azure = next((mount for mount in self.mounts if mount.dialect == AZURE), None)
        if azure is None:
            return f"{said} This gateway serves: {self.everything()}."
        chat = next((r for r in azure.routes if r.own == "/chat/completions"), azure.routes[0])
        deployment = match.groupdict().get("deployment")
        model = f' ("model": "{bounded(deployment, 100)}")' if deployment else ""
        said += (
            f" Its {azure.name} API is at {azure.shown}: {chat.shown()}, the deployment named as "
            f"`model` in the body{model}. With the openai SDK: {azure.setup(base)}."
        )
        if match.group("operation") != "chat/completions":
            said += f" On {azure.shown} this gateway serves: {azure.listing()}."
        return said

    def other_api(self, path: str) -> str:
        """A vendor's API chatgate does not serve (embeddings, audio, …), asked under a mount or
        at the root."""
        holder = self.holder(path)
        rest = path[len(holder.mount) :] if holder is not None else path
        rest = rest.removeprefix("/v1") if rest.startswith("/v1/") else rest
        for prefix, what in OTHER_APIS.items():
            if rest == f"/{prefix}" or rest.startswith(f"/{prefix}/"):
                if holder is None:
                    return f"chatgate does not serve {what}. This gateway serves: {self.everything()}."
                return (
                    f"chatgate does not serve {what}. On {holder.shown} ({holder.name}) this gateway "
                    f"serves: {holder.listing()}."
                )
        return ""

    def elsewhere(self, path: str, base: str) -> str:
        """A served path asked under another base (a client pointed at the root, or at another
        mount): where each dialect that has it serves it, and how its clients are pointed there."""
        found = [
            (mount, route)
            for mount in self.mounts
            for route in mount.routes
            if route.path != path and route.tail.search(path)
        ]
        if not found:
            return ""
        places = "; ".join(f"{route.shown()} ({mount.name}: {mount.setup(base)})" for mount, route in found)
        return f"This gateway serves this path under its mount{'s' if len(found) > 1 else ''}: {places}."

    def listing(self, path: str) -> str:
        holder = self.holder(path)
        if holder is not None and holder.mount:
            return f"On {holder.shown} ({holder.name}) this gateway serves: {holder.listing()}."
        return f"This gateway serves: {self.everything()}."

    def everything(self) -> str:
        if not self.mounts:
            return "no API (every dialect is unmounted)"
        mounts = sorted(self.mounts, key=lambda mount: mount.mount)
        shown = ", ".join(f"{mount.shown} ({mount.name})" for mount in mounts)
        return f"{shown}; each mount's document is at <mount>{SPEC_PATH}"
