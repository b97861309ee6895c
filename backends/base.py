"""The Backend interface: declared capabilities plus an async generator of canonical events.

A backend's parameter table (canonical name → `Param`) is both what the policy checks and the
mapping `mapped` applies to build what the backend sends, so the two cannot disagree.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.canonical import ChatRequest, EventStream
from gateway.core.errors import UnprocessableContent
from gateway.core.parameters import requested, unasked

Transform = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Param:
    """How a backend takes one canonical parameter: the name it sends it under, the range it
    accepts and how the value is converted; or why it takes it without sending it; or why it
    cannot take it. Tables of these are the mapping `mapped` applies and the policy checks.

    - `target` set: sent under that name, the value converted by `transform` (a transform that
      returns None means "not sent", e.g. a value that means "off");
    - `target` None: taken but not sent, the backend handles it itself (`note` says how);
    - `supported` False: a request that sets it gets a 422 (`note` says why).
    """

    target: str | None
    minimum: float | None = None
    maximum: float | None = None
    note: str = ""
    transform: Transform | None = None
    supported: bool = True

    def __post_init__(self) -> None:
        if self.target is None and not self.note:
            raise ValueError("a parameter that is not sent needs a note saying why")
        if self.transform is not None and self.target is None:
            raise ValueError("a transform needs a target to send its value under")

    def converted(self, value: Any) -> Any:
        """The value as the backend sends it; None: not sent."""
        if self.target is None:
            return None
        return value if self.transform is None else self.transform(value)


def taken(note: str, minimum: float | None = None, maximum: float | None = None) -> Param:
    """A parameter the backend honours itself, without sending it on (`note` says how)."""
    return Param(None, minimum, maximum, note)


def refused(note: str) -> Param:
    """A parameter the backend cannot honour: a request that sets it gets a 422."""
    return Param(None, note=note, supported=False)


def same_names(*names: str) -> dict[str, Param]:
    """A parameter table for a backend that takes these canonical parameters under the same names."""
    return {name: Param(name) for name in names}


def unsupported(note: str, *names: str) -> dict[str, Param]:
    """Table entries for parameters a backend cannot honour (a request setting one gets 422)."""
    return {name: refused(note) for name in names}


def mapped(table: Mapping[str, Param], values: Mapping[str, Any]) -> dict[str, Any]:
    """The requested canonical parameters (`gateway.core.parameters.requested`) under the
    backend's names, with its values; parameters it takes without sending are left out.

    The policy has refused what the table lacks; one that still arrives here is refused the same way.
    """
    sent: dict[str, Any] = {}
    for name, value in values.items():
        param = table.get(name)
        if param is None or not param.supported:
            why = param.note if param is not None else "not in this backend's parameter table"
            raise UnprocessableContent(
                f"The model does not support this parameter: {why} (parameter '{name}').",
                param=name,
                loc=["body", name],
                value=value,
                code="UnsupportedParameter",
            )
        converted = param.converted(value)
        if param.target is not None and converted is not None:
            sent[param.target] = converted
    return sent


def takes(param: Param | None, value: Any) -> bool:
    """Whether a table's entry takes this value: supported, and a number within its range."""
    if param is None or not param.supported:
        return False
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    low, high = param.minimum, param.maximum
    return (low is None or value >= low) and (high is None or value <= high)


def taken_or_asked(
    table: Mapping[str, Param], values: Mapping[str, Any], quiet: frozenset[str]
) -> dict[str, Any]:
    """`values` less those that ask for nothing (`quiet`: gateway.core.parameters.unasked) which
    the table cannot take: left out as if the client had not sent them. The rest go to `mapped`
    (temperature 1 sent is sent on)."""
    return {k: v for k, v in values.items() if k not in quiet or takes(table.get(k), v)}


def to_send(table: Mapping[str, Param], request: ChatRequest) -> dict[str, Any]:
    """The requested parameters a backend with this table maps (`mapped`)."""
    values = requested(request)
    return taken_or_asked(table, values, unasked(request, values))


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend (and the model behind it) can do; the policy layer reads this table.

    `parameters` maps canonical parameter names (ChatRequest fields, and the dialect options
    such as top_k) to how the backend takes them; a name missing from it is unsupported.
    """

    modalities: frozenset[str] = frozenset({"text"})
    parameters: Mapping[str, Param] = field(default_factory=dict)
    response_formats: frozenset[str] = frozenset({"text"})
    max_n: int = 1
    max_top_logprobs: int = 0
    context_length: int | None = None  # prompt + output; None: not declared, not checked
    # The most tokens one choice may hold (a request asking for more gets 422), and what a
    # request that names no limit gets; None: the backend decides.
    max_output_tokens: int | None = None
    default_max_tokens: int | None = None
    # Takes a conversation whose earlier assistant turns called custom tools (OpenAI's
    # `{"type": "custom"}` calls): it passes the conversation on, or reads only its words.
    custom_calls_in_history: bool = False
    # n choices are made as n upstream requests (a fan-out, TGI's parallel requests): a request
    # takes a replica's slot a choice, so `max_concurrent` bounds what the upstream gets …
    requests_per_choice: bool = False
    # … and where each is charged its prompt (the answer's usage sums them), the limits and
    # budgets count the prompt once a choice at admission
    prompt_per_choice: bool = False
    # The client dialects its upstream speaks too (`messages`, `responses`): a request in one of
    # them goes upstream as it came (`ChatRequest.native`), nothing dropped
    native: frozenset[str] = frozenset()


class Backend(Protocol):
    name: str
    capabilities: Capabilities

    def generate(self, request: ChatRequest) -> EventStream:
        """Yield TextDelta / ToolCallDelta / Finish events, then one Usage event."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BackendKind:
    """One kind of backend, as the config names it: where its class and its options model live
    (imported only when used, so optional extras stay optional) and what it needs installed."""

    name: str
    backend: str  # "module:Class"
    options: str  # "module:OptionsModel", validated at start before anything is built
    requires: tuple[str, ...] = ()  # modules that must be importable
    install: str = ""  # how to get them
    proxied: bool = False  # its constructor takes `proxy_environment` (for its `proxy: env`)

    def load(self, where: str) -> Any:
        module_name, _, attribute = where.partition(":")
        return getattr(importlib.import_module(module_name), attribute)

    def missing(self) -> list[str]:
        """The required modules that cannot be imported here."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


BACKEND_KINDS: dict[str, BackendKind] = {
    kind.name: kind
    for kind in (
        BackendKind("echo", "backends.echo:EchoBackend", "backends.echo:EchoOptions"),
        BackendKind(
            "tgi", "backends.tgi.backend:TGIBackend", "backends.tgi.backend:TGIOptions", proxied=True
        ),
        BackendKind(
            "openai-compatible",
            "backends.openai_compatible:OpenAICompatibleBackend",
            "backends.openai_compatible:Options",
            proxied=True,
        ),
        BackendKind(
            "local",
            "backends.local.backend:LocalBackend",
            "backends.local.backend:LocalOptions",
            requires=("torch", "transformers"),
            install="pip install 'chatgate[local]' plus PyTorch (docs/backends.md, the local backend)",
        ),
    )
}


def create_backend(
    kind: str, model: str, options: dict[str, Any], proxy_environment: Mapping[str, str] | None = None
) -> Backend:
    """Instantiate a backend by its kind name. `proxy_environment`: the proxy variables of the
    process (the settings' snapshot), for a backend that goes through a proxy with `proxy: env`."""
    backend_kind = BACKEND_KINDS[kind]
    backend_class = backend_kind.load(backend_kind.backend)
    if backend_kind.proxied:
        return backend_class(model=model, proxy_environment=proxy_environment or {}, **options)
    return backend_class(model=model, **options)
