"""The document a running gateway serves at `<mount>/openapi.json` (and `.yaml`) is the committed one in
openapi/, apart from `servers`, which names the mount it is served at, and `security`, which a
gateway without keys declares optional (`{}` among the alternatives: it enforces none, and a
client generated from it still has a place for a key)."""

from __future__ import annotations

import httpx
import orjson
import pytest
import yaml

from gateway.config.settings import Settings
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
from gateway.policy.auth import new_key
from tests.support.servers import ROOT, running_gateway, started_gateway

MOUNTS = Settings().mounts


def optional_security(document: dict) -> dict:
    """The document with `{}` (no credentials) added to every `security` that names a scheme."""

    def optional(node: dict) -> dict:
        security = node.get("security")
        return {**node, "security": [*security, {}]} if security else node

    document = optional(document)
    document["paths"] = {
        path: {method: optional(op) if isinstance(op, dict) else op for method, op in item.items()}
        for path, item in document["paths"].items()
    }
    return document


def as_json(document: dict) -> dict:
    """The document as JSON sees it (YAML may hold values JSON has no type for)."""
    return orjson.loads(orjson.dumps(document))


@pytest.mark.parametrize("dialect", DIALECTS.values(), ids=lambda d: d.name)
def test_served_document_is_the_committed_one(dialect, gateway_url: str):
    mount = MOUNTS[dialect.name]
    response = httpx.get(f"{gateway_url}{mount}/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    served = response.json()
    assert served.pop("servers") == [{"url": mount}]
    committed = as_json(load_document(dialect.document))
    committed.pop("servers")
    assert served == optional_security(committed)  # no keys: security optional


@pytest.mark.parametrize("dialect", DIALECTS.values(), ids=lambda d: d.name)
def test_swagger_ui_still_answers(dialect, gateway_url: str):
    response = httpx.get(f"{gateway_url}{MOUNTS[dialect.name]}/ui/", timeout=10)
    assert response.status_code == 200
    assert "openapi.json" in response.text


def test_yaml_document_is_the_committed_one_too(gateway_url: str):
    response = httpx.get(f"{gateway_url}/v1/openapi.yaml")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/yaml")
    served = yaml.safe_load(response.text)
    committed = load_document("openai.yaml")
    assert served["servers"] == [{"url": "/v1"}]
    assert {k: v for k, v in served.items() if k != "servers"} == optional_security(
        {k: v for k, v in committed.items() if k != "servers"}
    )


def test_the_swagger_ui_is_public_as_documented(tmp_path, log_dir):
    """With keys configured, the UI (a static page over the public document) answers without one,
    as the docs say; a chat operation does not."""
    _key, sha = new_key()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"keys": [{"name": "k", "sha256": sha}]}))
    with running_gateway(log_dir, config) as url:
        assert httpx.get(f"{url}/v1/ui/").status_code == 200
        served = httpx.get(f"{url}/v1/openapi.json")
        assert served.status_code == 200
        assert served.json()["security"] == load_document("openai.yaml")["security"]  # enforced: declared
        assert httpx.get(f"{url}/v1/models").status_code == 401
    keys_page = (ROOT / "docs" / "configuration" / "keys.md").read_text()
    assert "(`<mount>/ui/`" in keys_page


def test_what_the_swagger_ui_does_not_serve_is_a_plain_404(log_dir):
    """A file the UI does not have (a path climbing out of it too), its page template and its
    source maps: 404 in the mount's dialect, with a request id, and no traceback in the log."""
    paths = [
        "/v1/ui/..%2f..%2fetc%2fpasswd",
        "/v1/ui/swagger-ui-config.json",
        "/v1/ui/no-such-file.js",
        "/v1/ui/index.j2",
        "/v1/ui/swagger-ui-bundle.js.map",
    ]
    with started_gateway(log_dir) as (_process, url, log):
        for path in paths:
            response = httpx.get(url + path)
            assert response.status_code == 404, path
            assert response.json()["error"]["code"] == "NotFound", path
            assert response.headers["x-request-id"], path
        azure = httpx.get(f"{url}/azure/ui/no-such-file.js")
        assert azure.status_code == 404
        assert azure.json()["error"]["code"] == "NotFound"  # Azure's shape: its own error object
        assert httpx.get(f"{url}/v1/ui/swagger-ui-bundle.js").status_code == 200  # what it has, it serves
        assert "Traceback" not in log.read_text()
