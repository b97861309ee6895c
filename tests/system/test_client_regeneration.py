"""A client generated from each dialect's document in openapi/ by a standard generator
(openapi-python-client) completes a chat against a running gateway, with no hand edits.

The generator runs as a user would run it (README, "Generate a client"):

    openapi-python-client generate --path openapi/<dialect>.yaml --output-path <package> --meta none

and each generated package is imported from a temporary folder by a fresh interpreter, which
sends one non-streaming chat with the generated request model, authenticated with the generated
`AuthenticatedClient` (a Bearer key), and reads the answer through the generated response model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.echo import PREFIX
from gateway.config.settings import Settings
from gateway.policy.auth import new_key
from tests.support.dialect_routes import ChatRoute, main_routes
from tests.support.readers import reader
from tests.support.servers import ROOT, running_gateway

GENERATOR = "openapi-python-client==0.29.1"
KEY, KEY_SHA = new_key()


@dataclass(frozen=True)
class Dialect:
    name: str
    mount: str
    api_module: str  # <tag>.<operationId in snake_case>
    request_model: str  # the chat request schema's name
    response_model: str  # the 200 JSON schema's name
    arguments: dict[str, Any] = field(default_factory=dict)  # other parameters of the operation
    body: dict[str, Any] = field(default_factory=dict)  # the chat request, in the dialect's shape

    @property
    def package(self) -> str:
        return f"chatgate_{self.name}_client"


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).replace("-", "_").lower()


PROMPT = "Hello from a generated client"


def generated_client_of(route: ChatRoute) -> Dialect:
    """What a client generated from the document is called, all read off the document."""
    return Dialect(
        name=route.dialect,
        mount=Settings().mounts[route.dialect] or "",
        api_module=f"{route.tag}.{snake_case(route.operation_id)}",
        request_model=route.request_schema,
        response_model=route.response_schema,
        arguments={snake_case(name): value for name, value in route.query},
        body=route.body(PROMPT),
    )


DIALECTS = [generated_client_of(route) for route in main_routes().values()]

# What the fresh interpreter runs: only generated code talks to the gateway.
CHAT = """
import json, sys
from importlib import import_module

package, api_module, request_model, base_url, key, arguments, body = sys.argv[1:]
client_module = import_module(package)
operation = import_module(f"{package}.api.{api_module}")
models = import_module(f"{package}.models")
client = client_module.AuthenticatedClient(base_url=base_url, token=key, raise_on_unexpected_status=True)
request = getattr(models, request_model).from_dict(json.loads(body))
response = operation.sync_detailed(client=client, body=request, **json.loads(arguments))
parsed = response.parsed
answer = {"status": response.status_code, "model": type(parsed).__name__, "answer": parsed.to_dict()}
print(json.dumps(answer))
"""


@pytest.fixture(scope="module")
def generator(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, str]]:
    """How to run openapi-python-client: installed with the test extra, or else installed now
    into a temporary folder (it pins typer<0.28, so it may not share an environment)."""
    command = [sys.executable, "-m", "openapi_python_client"]
    if importlib.util.find_spec("openapi_python_client") is not None:
        return command, {}
    target = tmp_path_factory.mktemp("generator")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--target", str(target), GENERATOR],
        check=True, capture_output=True,
    )  # fmt: skip
    return command, {"PYTHONPATH": str(target)}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[str]:
    config = tmp_path_factory.mktemp("clients") / "config.yaml"
    config.write_text(yaml.safe_dump({"keys": [{"name": "generated-client", "sha256": KEY_SHA}]}))
    with running_gateway(log_dir, config) as url:
        yield url


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_generated_client_completes_a_chat(dialect: Dialect, generator, gateway: str, tmp_path: Path):
    command, generator_env = generator
    generated = subprocess.run(
        [*command, "generate", "--path", str(ROOT / "openapi" / f"{dialect.name}.yaml"),
         "--output-path", str(tmp_path / dialect.package), "--meta", "none"],
        capture_output=True, text=True, env={**os.environ, **generator_env}, timeout=120,
    )  # fmt: skip
    output = generated.stdout + generated.stderr
    assert generated.returncode == 0, output
    assert "Warning" not in output and "Unable" not in output, output  # nothing was left out

    body = dialect.body
    chat = subprocess.run(
        [sys.executable, "-c", CHAT, dialect.package, dialect.api_module, dialect.request_model,
         gateway + dialect.mount, KEY, json.dumps(dialect.arguments), json.dumps(body)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60,
    )  # fmt: skip
    assert chat.returncode == 0, chat.stdout + chat.stderr
    result = json.loads(chat.stdout)
    assert result["status"] == 200
    assert result["model"] == dialect.response_model
    assert reader(dialect.name).text(result["answer"]) == f"{PREFIX} {PROMPT}"
