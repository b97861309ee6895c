"""Today's Azure clients against a running gateway's /azure: the azure-ai-inference SDK reads
every error into `HttpResponseError.error` (code and message), and LiteLLM 1.80.0's `azure_ai`
provider (which sends `stream_options`) streams with usage."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from azure.ai.inference import ChatCompletionsClient
from azure.ai.inference.models import ChatCompletionsToolDefinition, FunctionDefinition, UserMessage
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError

from backends.echo import PREFIX
from gateway.policy.auth import new_key
from tests.support.servers import running_gateway

KEY, KEY_SHA = new_key()
CONFIG = {
    "keys": [{"name": "everything", "sha256": KEY_SHA}],
    "deployments": [
        {"name": "echo", "backend": "echo"},
        {"name": "no-tools", "backend": "echo", "capabilities": {"unsupported_parameters": ["tools"]}},
        {"name": "one-per-minute", "backend": "echo", "limits": {"requests_per_minute": 1}},
    ],
}
MESSAGES = [UserMessage("How many moons has Mars?")]
TOOL = ChatCompletionsToolDefinition(
    function=FunctionDefinition(name="moons", parameters={"type": "object", "properties": {}})
)
LITELLM_PYTHON = Path.home() / ".cache/chatgate-bench/litellm-1.80.0/bin/python"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("azure-clients")
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    with running_gateway(folder, config) as base:
        yield base


def client(url: str, key: str = KEY) -> ChatCompletionsClient:
    # no retries: a 429 is what is under test, not what the SDK does after it
    return ChatCompletionsClient(endpoint=f"{url}/azure", credential=AzureKeyCredential(key), retry_total=0)


def refused(call) -> HttpResponseError:
    with pytest.raises(HttpResponseError) as raised:
        call()
    return raised.value


@pytest.mark.parametrize(
    ("status", "code", "says", "call"),
    [
        (400, "BadRequest", "max_tokens", lambda url: client(url).complete(messages=MESSAGES, max_tokens=-1)),
        (401, "Unauthorized", "key", lambda url: client(url, "wrong").complete(messages=MESSAGES)),
        (
            404,
            "DeploymentNotFound",
            "nope",
            lambda url: client(url).complete(messages=MESSAGES, headers={"azureml-model-deployment": "nope"}),
        ),
        (
            422,
            "UnsupportedParameter",
            "tools",
            lambda url: client(url).complete(messages=MESSAGES, model="no-tools", tools=[TOOL]),
        ),
    ],
    ids=["400", "401", "404", "422"],
)
def test_the_sdk_reads_each_error(url: str, status: int, code: str, says: str, call):
    error = refused(lambda: call(url))
    assert error.status_code == status
    assert error.error is not None, error.response.text()
    assert error.error.code == code
    assert says in error.error.message
    body = json.loads(error.response.text())
    assert body["status"] == status and body["message"] == error.error.message  # the seed's fields stay
    assert error.response.headers["x-ms-error-code"] == code


def test_the_sdk_reads_a_rate_limit(url: str):
    limited = client(url)
    limited.complete(messages=MESSAGES, model="one-per-minute")
    error = refused(lambda: limited.complete(messages=MESSAGES, model="one-per-minute"))
    assert error.status_code == 429
    assert error.error is not None and error.error.code == "RateLimitExceeded"
    assert error.error.message
    assert int(error.response.headers["retry-after"]) >= 1


LITELLM_STREAM = """
import json, sys
import litellm
chunks = litellm.completion(
    model="azure_ai/echo", api_base=sys.argv[1], api_key=sys.argv[2],
    api_version="2024-05-01-preview", messages=[{"role": "user", "content": "How many moons has Mars?"}],
    stream=True, stream_options={"include_usage": True}, max_tokens=5,
)
text, usage = "", None
for chunk in chunks:
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
    if getattr(chunk, "usage", None):
        usage = chunk.usage.model_dump()
print(json.dumps({"text": text, "usage": usage}))
"""


def test_litellm_azure_ai_streams_with_usage(url: str):
    assert LITELLM_PYTHON.exists(), f"{LITELLM_PYTHON}: made by python -m tests.support.real_servers"
    done = subprocess.run(
        [str(LITELLM_PYTHON), "-c", LITELLM_STREAM, f"{url}/azure", KEY],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["text"] == " ".join(PREFIX.split()[:5])  # echo: its first 5 tokens
    usage = answer["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5


def test_litellm_runs_in_its_own_venv():
    # chatgate's own environment has no litellm: the client under test is the pinned 1.80.0
    version = subprocess.run(
        [str(LITELLM_PYTHON), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "1.80.0"
    assert sys.executable != str(LITELLM_PYTHON)
