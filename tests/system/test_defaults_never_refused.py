"""A request carrying every default its dialect's served document declares is never refused.

For each dialect's chat operations (the Responses API's too), the running gateway's own
`<mount>/openapi.json` is walked, `$ref`s resolved, for every `default` its request body
declares: top-level ones in a plain request, and those of objects that carry only defaults (an
`stream_options: {include_usage: false}`, `web_search_options: {search_context_size: ...}`) in a
streamed one, where a document's rules let them go. Both go to a `tgi` deployment (TGI's
stand-in, checked against TGI's document) and to a `local` deployment (a tiny model built here):
each is answered, never refused (the 422 "does not support this parameter" generated clients
got for `reasoning_effort: "medium"` or `ignore_eos: false`). The request is built from the
document, so the test keeps holding when the documents change.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.config.settings import Settings
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document, resolve
from tests.support.client_libraries import AGENT_CLIENTS, CLIENTS
from tests.support.dialect_routes import chat_routes
from tests.support.servers import running_gateway
from tests.support.tgi_server import TGIStandIn, running_tgi
from tests.support.tiny_model import save_tiny_model

pytestmark = pytest.mark.slow
MODEL = "tiny"
NO_DEFAULT = object()


# ----- the defaults, from the served document ---------------------------------------------------


def parts(document: dict[str, Any], schema: Any) -> list[dict[str, Any]]:
    """A schema and its `allOf` parts, resolved."""
    node = resolve(document, schema)
    if not isinstance(node, dict):
        return []
    return [node, *(p for part in node.get("allOf", ()) for p in parts(document, part))]


def default_of(document: dict[str, Any], schema: Any) -> Any:
    """The default a schema declares: its own, an `allOf` part's, or an `anyOf`/`oneOf` branch's."""
    for node in parts(document, schema):
        if "default" in node:
            return node["default"]
    for node in parts(document, schema):
        for branch in (*node.get("anyOf", ()), *node.get("oneOf", ())):
            if (found := default_of(document, branch)) is not NO_DEFAULT:
                return found
    return NO_DEFAULT


def properties(document: dict[str, Any], schema: Any) -> tuple[dict[str, Any], set[str]]:
    found: dict[str, Any] = {}
    required: set[str] = set()
    for node in parts(document, schema):
        found.update(node.get("properties") or {})
        required.update(node.get("required") or ())
    return found, required


def carried(document: dict[str, Any], schema: Any, depth: int = 0) -> dict[str, Any] | None:
    """An object built of its members' defaults alone, where it needs nothing else (every
    required member has a default): the schema's own, or one of its branches'."""
    if depth > 4:
        return None
    candidates = [schema] + [
        branch
        for node in parts(document, schema)
        for branch in (*node.get("anyOf", ()), *node.get("oneOf", ()))
    ]
    for candidate in candidates:
        members, required = properties(document, candidate)
        built = {}
        for name, member in members.items():
            if (value := default_of(document, member)) is not NO_DEFAULT:
                built[name] = value
            elif (inner := carried(document, member, depth + 1)) is not None:
                built[name] = inner
        if built and required <= set(built):
            return built
    return None


def documented_defaults(document: dict[str, Any], schema: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the body's fields that declare a default → it, its objects built of defaults alone)."""
    own: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    for name, member in properties(document, schema)[0].items():
        if (value := default_of(document, member)) is not NO_DEFAULT:
            own[name] = value
        elif (built := carried(document, member)) is not None:
            nested[name] = built
    return own, nested


def operation(document: dict[str, Any], operation_id: str) -> tuple[str, dict[str, Any]]:
    for path, item in document["paths"].items():
        for found in item.values():
            if isinstance(found, dict) and found.get("operationId") == operation_id:
                return path, found
    raise AssertionError(f"{operation_id} is not in the served document")


def request_schema(document: dict[str, Any], found: dict[str, Any]) -> Any:
    body = resolve(document, found["requestBody"])
    return body["content"]["application/json"]["schema"]


# ----- what is sent ---------------------------------------------------------------------------


def chat_cases() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(dialect, operationId, URL on the default mounts, the smallest body) per chat operation."""
    cases = []
    for route in chat_routes():
        extra = {"max_tokens": 8} if route.dialect == "anthropic" else {}
        cases.append((route.dialect, route.operation_id, route.url, route.body(model=MODEL, **extra)))
    mounts = Settings().mounts
    for name, dialect in DIALECTS.items():
        for operation_id in dialect.own_chat:  # the Responses API: input, not messages
            body = {"model": MODEL, "input": "Hello!", "max_output_tokens": 16}
            cases.append((name, operation_id, mounts[name] or "", body))
    return cases


CASES = chat_cases()


def bodies_carrying_defaults(
    gateway: str, dialect: str, operation_id: str, base: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """(the operation's path, [every top-level default in a plain body; the objects built of
    defaults in a streamed one]), read from the document the gateway serves."""
    mount = Settings().mounts[dialect] or ""
    document = httpx.get(f"{gateway}{mount}/openapi.json", timeout=10).json()
    path, found = operation(document, operation_id)
    own, nested = documented_defaults(document, request_schema(document, found))
    bodies = [{**base, **own}]
    if nested:
        bodies.append({**base, **nested, "stream": True})
    return mount + path, bodies


@pytest.fixture(scope="module")
def tgi(refspecs_dir: Path | None) -> Iterator[TGIStandIn]:
    with running_tgi(refspecs_dir) as stand_in:
        yield stand_in
    assert stand_in.failures == [], "\n".join(stand_in.failures)


@pytest.fixture(scope="module", params=["tgi", "local"])
def gateway(
    request: pytest.FixtureRequest, tgi: TGIStandIn, log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    directory = tmp_path_factory.mktemp(f"defaults-{request.param}")
    if request.param == "tgi":
        options: dict[str, Any] = {"url": tgi.url, "timeout": 10}
    else:
        model = save_tiny_model(directory / "model")
        options = {"path": str(model), "device": "cpu", "torch_threads": 1, "default_max_tokens": 8}
    deployment = {"name": MODEL, "backend": request.param, "models": ["*"], "options": options}
    config = directory / "chatgate.yaml"
    config.write_text(yaml.safe_dump({"deployments": [deployment]}), encoding="utf-8")
    # the local backend imports torch and loads the model before it is healthy: slow on a busy machine
    with running_gateway(log_dir, config, healthy_within=120) as url:
        yield url


def test_the_documents_are_walked_for_their_defaults():
    """The walk finds what generated clients sent and were refused for (the test is not empty)."""
    found: dict[str, set[str]] = {}
    for dialect in DIALECTS.values():
        document = load_document(dialect.document)
        for operation_id in (*dialect.chat_operations, *dialect.own_chat):
            own, nested = documented_defaults(
                document, request_schema(document, operation(document, operation_id)[1])
            )
            found.setdefault(dialect.name, set()).update(own, nested)
    assert {"reasoning_effort", "verbosity", "store", "service_tier", "web_search_options"} <= found["openai"]
    assert "ignore_eos" in found["lmi"] and {"ignore_eos", "stream_options", "best_of"} <= found["ovms"]


@pytest.mark.parametrize(
    ("dialect", "operation_id", "url", "base"), CASES, ids=[f"{c[0]}.{c[1]}" for c in CASES]
)
def test_every_documented_default_is_answered(
    gateway: str, dialect: str, operation_id: str, url: str, base: dict[str, Any]
):
    path, bodies = bodies_carrying_defaults(gateway, dialect, operation_id, base)
    query = url.partition("?")[2]
    for body in bodies:
        answer = httpx.post(f"{gateway}{path}" + (f"?{query}" if query else ""), json=body, timeout=60)
        assert answer.status_code == 200, (body, answer.status_code, answer.text[:500])
        assert answer.content


# ----- the OpenAI Agents SDK's default Agent(), in chat completions mode --------------------------


def agents_run(gateway: str, settings: str) -> dict[str, Any]:
    python = AGENT_CLIENTS.program("python")
    script = str(CLIENTS / "agents_chat_defaults.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    done = subprocess.run(
        [str(python), script, f"{gateway}/v1", settings], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_agents_sdk_reasoning_effort_none_is_answered(gateway: str):
    """`reasoning_effort: "none"` asks for no reasoning, which a model without reasoning honours."""
    assert "final_output" in agents_run(gateway, "effort-none")


def test_agents_sdk_default_verbosity_low_is_refused_naming_it(gateway: str):
    """Its default settings also send `verbosity: "low"`, away from the document's default: a
    shorter answer no backend here can be told to give, refused naming it (not its effort)."""
    answer = agents_run(gateway, "default")
    assert answer["status"] == 422 and answer["body"]["param"] == "verbosity"
