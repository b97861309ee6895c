"""Today's OpenAI-speaking clients against a real `chatgate serve` on its default configuration
(every dialect on echo), as a new user would try them (issue 26), and through a second one
whose deployment relays to it (openai-compatible): the official SDKs for Python
and Node, LangChain's ChatOpenAI, llama-index's OpenAILike, litellm as a client and the Vercel
AI SDK. Each answer is held to what the gateway says: the echo's text, the usage the gateway
reported, the forced tool call, the parsed Pydantic object.

The heavy clients run from their own venv or npm folder (tests/support/client_libraries.py), a script
each under tests/support/clients/ that prints what it got as JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml
from pydantic import BaseModel

from bench import litellm_proxy
from tests.support.client_libraries import CLIENTS, PYTHON_CLIENTS, node_environment, node_folder
from tests.support.real_servers import INSTALL_HINT
from tests.support.servers import running_gateway

PREFIX = "[chatgate echo backend, not a language model] You said: "
MODEL = "echo"


@pytest.fixture(scope="module", params=["echo", "openai-compatible"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The default gateway (echo); and one whose `echo` is an openai-compatible deployment in
    front of it, so each client also reads what the gateway relays from an upstream."""
    with running_gateway(tmp_path_factory.mktemp("clients")) as url:
        if request.param == "echo":
            yield url
            return
        deployment = {"name": MODEL, "backend": "openai-compatible", "options": {"base_url": f"{url}/v1"}}
        config = tmp_path_factory.mktemp("relay") / "config.yaml"
        config.write_text(yaml.safe_dump({"deployments": [deployment]}))
        with running_gateway(config.parent, config) as relayed:
            yield relayed


def usage_of(gateway: str, prompt: str) -> dict[str, int]:
    """The usage the gateway reports for this prompt (asked with plain HTTP)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    usage = httpx.post(f"{gateway}/v1/chat/completions", json=body, timeout=30).json()["usage"]
    return {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def run_json(command: list[str], **options: Any) -> dict[str, Any]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, **options)
    assert result.returncode == 0, f"{command[1]} failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


# ----- openai for Python (chatgate's own test dependency) -------------------------------------


@pytest.fixture(scope="module")
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)


class City(BaseModel):
    name: str
    population: int


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_openai_python_create(client: openai.OpenAI, gateway: str):
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi there"}])
    assert answer.choices[0].message.content == PREFIX + "Hi there"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert answer.usage.model_dump(
        include={"prompt_tokens", "completion_tokens", "total_tokens"}
    ) == usage_of(gateway, "Hi there")


def test_openai_python_stream_with_usage_on_the_last_chunk(client: openai.OpenAI, gateway: str):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream me"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == PREFIX + "Stream me"
    *before, last = chunks
    assert last.choices == [] and last.usage is not None
    assert all(chunk.usage is None for chunk in before)
    assert last.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}) == usage_of(
        gateway, "Stream me"
    )


def test_openai_python_forced_tool_call(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert answer.choices[0].finish_reason == "tool_calls"
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Weather in Paris?"}


def test_openai_python_parse_into_a_pydantic_model(client: openai.OpenAI):
    answer = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Name a city"}], response_format=City
    )
    assert answer.choices[0].message.parsed == City(name="Name a city", population=0)


def test_openai_python_stream_helper(client: openai.OpenAI):
    with client.chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": "Name a city"}], response_format=City
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(deltas) > 1 and "".join(deltas) == final.choices[0].message.content
    assert final.choices[0].message.parsed == City(name="Name a city", population=0)


# ----- LangChain's ChatOpenAI and llama-index's OpenAILike (their own venv) --------------------


@pytest.fixture(scope="module")
def frameworks(gateway: str) -> dict[str, Any]:
    python = PYTHON_CLIENTS.program("python")
    return run_json([str(python), str(CLIENTS / "python_frameworks.py"), f"{gateway}/v1", MODEL])


def test_langchain_invoke_and_stream(frameworks: dict[str, Any], gateway: str):
    expected = usage_of(gateway, "Hello from a framework")
    for call in ("invoke", "stream"):
        answer = frameworks["langchain"][call]
        assert answer["content"] == PREFIX + "Hello from a framework"
        usage = answer["usage"]
        assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == tuple(
            expected.values()
        )
    assert frameworks["langchain"]["stream"]["pieces"] > 3  # streamed, token by token


def test_langchain_structured_output_and_bound_tools(frameworks: dict[str, Any]):
    assert frameworks["langchain"]["structured"] == {"name": "Name a city", "population": 0}
    assert frameworks["langchain"]["tool_calls"] == [
        {"name": "get_weather", "args": {"city": "Weather in Paris?"}}
    ]


def test_llama_index_chat_and_stream_chat(frameworks: dict[str, Any], gateway: str):
    expected = usage_of(gateway, "Hello from a framework")
    chat = frameworks["llama_index"]["chat"]
    assert chat["content"] == PREFIX + "Hello from a framework"
    assert {k: chat["usage"][k] for k in expected} == expected
    streamed = frameworks["llama_index"]["stream_chat"]
    assert streamed["content"] == PREFIX + "Hello from a framework"
    assert "".join(streamed["deltas"]) == streamed["content"] and len(streamed["deltas"]) > 3


# ----- litellm 1.80.0 as a client (the benchmark's venv) ---------------------------------------


def test_litellm_openai_provider_plain_and_streamed_with_usage(gateway: str):
    python = litellm_proxy.VENV / "bin" / "python"
    stamp = litellm_proxy.VENV / litellm_proxy.STAMP
    assert python.exists() and stamp.exists(), f"{litellm_proxy.VENV} is not installed: {INSTALL_HINT}"
    got = run_json([str(python), str(CLIENTS / "litellm_client.py"), f"{gateway}/v1", MODEL])
    expected = usage_of(gateway, "Hello from litellm")
    for call in ("plain", "stream"):
        assert got[call]["content"] == PREFIX + "Hello from litellm"
        assert {k: got[call]["usage"][k] for k in expected} == expected


# ----- openai for Node and the Vercel AI SDK (an npm folder) ----------------------------------


@pytest.fixture(scope="module")
def node(gateway: str) -> dict[str, Any]:
    folder = node_folder()
    script = folder / "node_clients.mjs"  # beside its node_modules: ES modules resolve from there
    shutil.copy(CLIENTS / "node_clients.mjs", script)
    node_program = shutil.which("node")
    assert node_program is not None, "node is not installed: ./scripts/run-tests installs npm with it"
    return run_json([node_program, str(script), f"{gateway}/v1", MODEL], env=node_environment())


def test_openai_node_create_and_stream(node: dict[str, Any], gateway: str):
    expected = usage_of(gateway, "Hello from Node")
    for call in ("create", "stream"):
        answer = node["openai"][call]
        assert answer["content"] == PREFIX + "Hello from Node"
        assert {k: answer["usage"][k] for k in expected} == expected


@pytest.mark.parametrize("provider", ["openaiCompatible", "openaiChat"])
def test_vercel_ai_sdk_generate_and_stream_text(node: dict[str, Any], gateway: str, provider: str):
    expected = usage_of(gateway, "Hello from Node")
    for call in ("generateText", "streamText"):
        answer = node[provider][call]
        assert answer["text"] == PREFIX + "Hello from Node"
        usage = answer["usage"]
        assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == tuple(expected.values())
