"""What the target of a conformance run is, and what it is held to: chatgate (its served
document says which keys it enforces) or another server (never held to chatgate's own headers,
keys checked only where it asks for one); its model, and its features, probed as `chatgate
probe` probes them (gateway/probes)."""

from __future__ import annotations

import copy
from typing import Any

from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
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


def listed_model(url: str, headers: dict[str, str], timeout: float, dialect: str = "openai") -> str | None:
    """The model the endpoint names: the first `<url>/models` lists (OpenAI's), or the one
    Azure's `/info` describes; None where the dialect has no such operation (name it: --model)."""
    import httpx

    from gateway.probes.azure import API_VERSION
    from gateway.tools.bounded_http import bounded

    try:
        if dialect == "azure":
            query = {"api-version": API_VERSION}
            info = bounded("GET", f"{url.rstrip('/')}/info", params=query, headers=headers, seconds=timeout)
            found = info.json()["model_name"]
        else:
            listed = bounded("GET", url.rstrip("/") + "/models", headers=headers, seconds=timeout).json()
            found = listed["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    return found if isinstance(found, str) else None


def features_of(
    url: str, dialect: str, model: str | None, headers: dict[str, str], timeout: float
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
    if model is None:
        return [], "not probed: name the model with --model (the server lists none at /models)"
    try:
        found = asyncio.run(probe(Target(url.rstrip("/"), model, headers, timeout), probes))
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
