"""What the target of a conformance run is, and what it is held to: chatgate (its served
document says which keys it enforces) or another server (never held to chatgate's own headers,
keys checked only where it asks for one); its model, and its features, probed as `chatgate
probe` probes them (gateway/probes)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from gateway.dialects.registry import DIALECTS
from gateway.http.documents import DialectSpec, load_document
from gateway.probes.probe_set import Listing
from gateway.tools.conformance_examples import KEY_HEADERS
from gateway.tools.conformance_report import NOT_PROBED, Feature


def served_document(url: str, document: dict[str, Any]) -> dict[str, Any] | None:
    """The dialect's document as the endpoint serves it (`<url>/openapi.json`, as chatgate does),
    when it serves this one; None otherwise (a real upstream serves none)."""
    import httpx

    from gateway.tools.bounded_http import DOCUMENT_BYTES, bounded

    try:
        response = bounded("GET", url.rstrip("/") + "/openapi.json", seconds=10, limit=DOCUMENT_BYTES)
        served = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    same = isinstance(served, dict) and served.get("info", {}).get("title") == document["info"]["title"]
    return served if same else None


def enforced(node: dict[str, Any]) -> bool:
    """Whether a node's `security` asks for a key: declared, and without `{}` (no credentials)
    among its alternatives, which a gateway with no keys adds to declare them optional."""
    return "security" in node and {} not in node["security"]


def with_served_security(document: dict[str, Any], served: dict[str, Any]) -> dict[str, Any]:
    """The document with the security the endpoint enforces: a gateway with no keys serves its
    document with every scheme optional (or, before, without `security`), and is tested as the
    open endpoint it is."""
    document = dict(document)
    document.pop("security", None)
    if enforced(served):
        document["security"] = served["security"]
    paths = {}
    for path, item in document.get("paths", {}).items():
        paths[path] = dict(item)
        for method, operation in item.items():
            if isinstance(operation, dict) and "security" in operation:
                served_operation = served.get("paths", {}).get(path, {}).get(method, {})
                operation = {k: v for k, v in operation.items() if k != "security"}
                if enforced(served_operation):
                    operation["security"] = served_operation["security"]
                paths[path][method] = operation
    document["paths"] = paths
    return document


def declares_security(document: dict[str, Any]) -> bool:
    operations = [
        op for item in document.get("paths", {}).values() for op in item.values() if isinstance(op, dict)
    ]
    return bool(document.get("security")) or any(op.get("security") for op in operations)


# chatgate's own request headers: a target that is not chatgate is not held to them (llama.cpp
# answers an x-request-id that is not a UUID with an empty 400)
CHATGATE_HEADERS = frozenset({"x-request-id", "extra-parameters"})


def without_chatgate_headers(document: dict[str, Any]) -> dict[str, Any]:
    """The document without chatgate's own headers (x-request-id, extra-parameters), for a
    target that is not chatgate: the seed's contract, not the gateway's extensions."""
    document = copy.deepcopy(document)
    named = {
        f"#/components/parameters/{name}"
        for name, parameter in document.get("components", {}).get("parameters", {}).items()
        if parameter.get("in") == "header" and parameter.get("name", "").lower() in CHATGATE_HEADERS
    }

    def ours(parameter: Any) -> bool:
        if not isinstance(parameter, dict):
            return False
        header = parameter.get("in") == "header" and parameter.get("name", "").lower() in CHATGATE_HEADERS
        return header or parameter.get("$ref") in named

    for item in document.get("paths", {}).values():
        for operation in [item, *item.values()]:
            if not isinstance(operation, dict):
                continue
            if isinstance(operation.get("parameters"), list):
                operation["parameters"] = [p for p in operation["parameters"] if not ours(p)]
            for response in operation.get("responses", {}).values():
                if isinstance(response, dict) and isinstance(response.get("headers"), dict):
                    response["headers"] = {
                        k: v for k, v in response["headers"].items() if k.lower() not in CHATGATE_HEADERS
                    }
    for response in document.get("components", {}).get("responses", {}).values():
        if isinstance(response, dict) and isinstance(response.get("headers"), dict):
            response["headers"] = {
                k: v for k, v in response["headers"].items() if k.lower() not in CHATGATE_HEADERS
            }
    return document


def chat_path(dialect: str, document: dict[str, Any]) -> str | None:
    """The path of the dialect's chat operation in `document`."""
    chat = DIALECTS[dialect].chat_operations
    for path, item in document.get("paths", {}).items():
        for operation in item.values():
            if isinstance(operation, dict) and operation.get("operationId") in chat:
                return str(path)
    return None


def asks_for_key(url: str, path: str | None, headers: dict[str, str], timeout: float) -> bool:
    """A chat request without a key is answered 401 or 403: the server asks for one."""
    import httpx

    from gateway.tools.bounded_http import bounded

    if path is None:
        return False
    keyless = {k: v for k, v in headers.items() if k.lower() not in KEY_HEADERS}
    try:
        answer = bounded("POST", url.rstrip("/") + path, json={}, headers=keyless, seconds=timeout)
    except httpx.HTTPError:
        return False
    return answer.status_code in (401, 403)


@dataclass(frozen=True)
class Model:
    """The model a run names: given, found through the dialect's own listing, or none (`said`
    tells how it was found, or why there is none)."""

    name: str | None
    said: str
    needed: bool = True  # the dialect's chat requests must name one (LMI's need not)

    @property
    def usable(self) -> bool:
        return self.name is not None or not self.needed


def operation_path(document: dict[str, Any], operation_id: str) -> str | None:
    """The path of the GET operation `operation_id` in `document`."""
    for path, item in document.get("paths", {}).items():
        if isinstance(item.get("get"), dict) and item["get"].get("operationId") == operation_id:
            return str(path)
    return None


def names_a_model(dialect: str, document: dict[str, Any]) -> bool:
    """Whether the dialect's chat requests must name a model (`model` among their required)."""
    chat = DIALECTS[dialect].chat_operations
    spec = DialectSpec(document, frozenset())
    for item in document.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and operation.get("operationId") in chat:
                schema = spec.request_schema(operation["operationId"])
                return "model" in (schema.get("required") or []) if isinstance(schema, dict) else True
    return True


def model_of(
    url: str, dialect: str, headers: dict[str, str], timeout: float, given: str | None = None
) -> Model:
    """The model the run names: `given`, else the first the dialect's own listing names (the
    operation its probe set names, at the path its document gives: OpenAI's `/models`, Aleph
    Alpha's `/models_available`, Azure's `/info`, Anthropic's `/v1/models`), else none and why."""
    if given is not None:
        return Model(given, "--model")
    from gateway.probes.sets import probe_set_of

    document = load_document(DIALECTS[dialect].document)
    probes = probe_set_of(dialect)
    listing = probes.listing if probes is not None else None
    path = operation_path(document, listing.operation) if listing is not None else None
    if listing is None or path is None:
        if not names_a_model(dialect, document):
            return Model(None, f"the {dialect} document lists no models, and needs none named", False)
        return Model(
            None,
            f"the {dialect} document lists no models, and its chat requests must name one: pass --model NAME",
        )
    return listed_model(url, path, listing, headers, timeout)


def listed_model(url: str, path: str, listing: Listing, headers: dict[str, str], timeout: float) -> Model:
    """The first model `GET <url><path>` names; a key refused is named as the cause."""
    import httpx

    from gateway.tools.bounded_http import bounded

    where = f"GET {path}"
    try:
        answer = bounded("GET", url.rstrip("/") + path, params=dict(listing.query), headers=headers,
                         seconds=timeout)  # fmt: skip
    except httpx.HTTPError as error:
        return Model(None, f"{where} failed ({type(error).__name__}): pass --model")
    if answer.status_code in (401, 403):
        keyed = any(name.lower() in KEY_HEADERS for name in headers)
        why = (
            "the key was refused: pass one this server takes (--key KEY, or --header 'api-key: KEY')"
            if keyed
            else "a key is needed: pass --key KEY (or --header 'Authorization: Bearer …')"
        )
        return Model(None, f"{where} answered HTTP {answer.status_code}: {why}")
    if answer.status_code != 200:
        return Model(None, f"{where} answered HTTP {answer.status_code}: pass --model")
    try:
        found = listing.name_of(answer.json())
    except ValueError:
        found = None
    if not isinstance(found, str) or not found:
        return Model(None, f"{where} names no model: pass --model")
    return Model(found, f"named by {where}")


def features_of(
    url: str, dialect: str, model: Model, headers: dict[str, str], timeout: float
) -> tuple[list[Feature], str]:
    """The dialect's feature probes (gateway/probes, as `chatgate probe` runs them): the
    matrix, or none and why."""
    import asyncio

    from gateway.probes.findings import ProbeUnavailable
    from gateway.probes.runner import Target, probe
    from gateway.probes.sets import probe_set_of

    probes = probe_set_of(dialect)
    if probes is None:
        return [], f"not probed: the {dialect} dialect names no probe set"
    if not model.usable:
        return [], f"not probed: {model.said}"
    try:
        found = asyncio.run(probe(Target(url.rstrip("/"), model.name, headers, timeout), probes))
    except ProbeUnavailable as error:
        raise ProbeFailed(str(error)) from None
    features = [Feature(f.feature, f.verdict, f.detail) for f in found.findings]
    features += [Feature(name, NOT_PROBED, why) for name, why in found.not_probed.items()]
    return features, ""


def dialect_of(url: str) -> str:
    """The dialect whose document the endpoint serves (`<url>/openapi.json`, as chatgate serves
    each mount's); OpenAI's, which real upstreams speak, when it serves none of them."""
    import httpx

    from gateway.tools.bounded_http import DOCUMENT_BYTES, bounded

    try:
        response = bounded("GET", url.rstrip("/") + "/openapi.json", seconds=10, limit=DOCUMENT_BYTES)
        served = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return "openai"
    title = served.get("info", {}).get("title") if isinstance(served, dict) else None
    for name, dialect in DIALECTS.items():
        if title is not None and load_document(dialect.document)["info"]["title"] == title:
            return name
    return "openai"


class ProbeFailed(Exception):
    """A plain chat request failed: no feature can be told."""


def without_unserved(
    url: str, document: dict[str, Any], headers: dict[str, str], timeout: float
) -> tuple[dict[str, Any], list[str]]:
    """The document without the paths a server other than chatgate does not serve, and what
    they were: each plain path is asked once (a POST with an empty body, or a GET), and one
    answered 404 or 405 is not served, nor is any templated path beneath it (OpenAI's document
    holds the Responses API, which not every OpenAI-compatible server has)."""
    import httpx

    from gateway.tools.bounded_http import bounded

    unserved: dict[str, str] = {}
    for path, item in document.get("paths", {}).items():
        if "{" in path:
            continue
        method = "post" if "post" in item else "get"
        try:
            answer = bounded(method.upper(), url.rstrip("/") + path, json={} if method == "post" else None,
                             headers=headers, seconds=timeout)  # fmt: skip
        except httpx.HTTPError:
            continue
        if answer.status_code in (404, 405):
            unserved[path] = f"{method.upper()} {path} (HTTP {answer.status_code})"
    if not unserved:
        return document, []
    kept = {
        path: item
        for path, item in document["paths"].items()
        if path not in unserved and not any(path.startswith(gone + "/") for gone in unserved)
    }
    said = [
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        if path not in kept
        for method in item
        if method in ("get", "post", "put", "delete", "patch")
    ]
    return {**document, "paths": kept}, said
