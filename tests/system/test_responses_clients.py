"""The real clients of OpenAI's Responses API against a running `chatgate serve`: openai for Node
(create, stream), the OpenAI Agents SDK with its default model (a run with a function tool,
streamed and not), the Vercel AI SDK's default OpenAI provider (generateText, streamText) and
Codex CLI headless (a plain turn, and a turn that runs a shell command and sends its output
back). Each runs on the echo backend behind a gateway that requires a key, and in front of
llama.cpp's real server (the tiny model: the Agents SDK's tool turns are forced, Codex CLI's turn
is plain).

A recording relay sits between the clients and each gateway, so the tests read what a client
sent on its second turn (the tool's output) and what the gateway answered. The clients run from
their venv or npm folder (tests/support/client_libraries.py), a script each under
tests/support/clients/ that prints what it got as JSON; Codex CLI runs with its home in a
temporary folder, nothing but loopback configured.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.client_libraries import AGENT_CLIENTS, CLIENTS, node_environment, node_folder
from tests.support.real_server_fixtures import DEPLOYMENT, probed
from tests.support.real_servers import RunningServer, cached_gguf, llama_server
from tests.support.recording_relay import Exchange, RecordingRelay
from tests.support.servers import running_gateway

PREFIX = "[chatgate echo backend, not a language model] You said: "
KEY = "sk-chatgate-responses-clients-test"  # each gateway's one key
MAX_TOKENS = 16  # of each answer of the tiny model (echo's answers are whole)
TIMEOUT = 180  # seconds a client may take, a slow machine included
NODE_INPUT = "Hello from Node"
AGENT_TOOL_ASK = "call get_x {} and tell me"  # echo calls the tool; its output is "the x is 42"


@dataclass(frozen=True)
class Target:
    """A gateway with a recording relay in front: `url` is the relay's (clients go there)."""

    name: str
    url: str
    model: str
    relay: RecordingRelay
    server: RunningServer | None = None  # the real server behind the gateway, where there is one

    @property
    def echo(self) -> bool:
        return self.server is None

    def max_tokens(self) -> list[str]:
        return [] if self.echo else [str(MAX_TOKENS)]

    def chat_usage(self, text: str) -> dict[str, int]:
        """The usage the gateway reports for this input on its chat completions API."""
        body = {"model": self.model, "messages": [{"role": "user", "content": text}]}
        answer = httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=auth(), timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]


def auth() -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}"}


@contextmanager
def keyed_gateway(folder: Path, deployment: dict[str, Any]) -> Iterator[str]:
    """A gateway whose one deployment is this, that requires KEY."""
    key = {"name": "clients", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "deployments": ["*"]}
    (folder / "config.yaml").write_text(yaml.safe_dump({"deployments": [deployment], "keys": [key]}))
    with running_gateway(folder, folder / "config.yaml") as url:
        yield url


@pytest.fixture(scope="module")
def echo_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with keyed_gateway(tmp_path_factory.mktemp("responses-echo"), {"name": "echo", "backend": "echo"}) as url:
        yield url


@pytest.fixture(scope="module")
def llama_cpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RunningServer]]:
    """llama.cpp's server on the tiny model, and a gateway in front whose deployment `tiny`
    answers a request that names no limit with MAX_TOKENS at most (Codex CLI names none, and the
    tiny model never ends a turn by itself: without it, it writes to the end of its context)."""
    folder = tmp_path_factory.mktemp("responses-llama.cpp")
    with llama_server(cached_gguf("tiny"), folder) as server:
        options = {"base_url": server.base_url, "upstream_model": server.model, "probe": True}
        deployment = {
            "name": DEPLOYMENT,
            "backend": "openai-compatible",
            "options": options,
            "capabilities": {"default_max_tokens": MAX_TOKENS},
        }
        with keyed_gateway(folder, deployment) as url:
            probed(url, key=KEY)
            yield url, server


@pytest.fixture(scope="module", params=["echo", "llama.cpp"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    server = None
    if request.param == "echo":
        gateway, model = request.getfixturevalue("echo_gateway"), "echo"
    else:
        (gateway, server), model = request.getfixturevalue("llama_cpp"), DEPLOYMENT
    with RecordingRelay(gateway) as relay:
        yield Target(request.param, relay.url, model, relay, server)


def run_json(command: list[str], **options: Any) -> dict[str, Any]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, **options)
    assert result.returncode == 0, f"{command[1]} failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def responses_posted(target: Target, marker: str) -> list[Exchange]:
    """The Responses requests the relay passed on whose input mentions `marker`, in order."""
    quoted = json.dumps(marker)[1:-1]  # as it is in the input's JSON
    return [e for e in target.relay.posted("/v1/responses") if quoted in json.dumps(e.body.get("input"))]


ENDINGS = ("response.completed", "response.incomplete", "response.failed")  # a stream's last event


def completed(exchange: Exchange) -> dict[str, Any]:
    """The response an exchange ended with: the body, or a stream's last event's."""
    if exchange.body.get("stream"):
        (done,) = [e for e in exchange.events() if e["type"] in ENDINGS]
        return done["response"]
    return json.loads(exchange.answer)


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def assert_usage_adds_up(usage: dict[str, Any], answered: int) -> None:
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert 0 < usage["output_tokens"] <= answered


# ----- openai for Node and the Vercel AI SDK's default provider (the npm folder) -----------------


@pytest.fixture(scope="module")
def node(target: Target) -> dict[str, Any]:
    folder = node_folder()
    script = folder / "responses_node.mjs"  # beside its node_modules: ES modules resolve from there
    shutil.copy(CLIENTS / "responses_node.mjs", script)
    node_program = shutil.which("node")
    assert node_program is not None, "node is not installed: ./scripts/run-tests installs npm with it"
    command = [node_program, str(script), f"{target.url}/v1", target.model, KEY, *target.max_tokens()]
    return run_json(command, env=node_environment())


def test_openai_node_responses_create(node: dict[str, Any], target: Target):
    created = node["openai"]["create"]
    assert created["object"] == "response" and created["id"].startswith("resp_")
    assert created["status"] in ("completed", "incomplete")
    (message,) = created["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    chat = target.chat_usage(NODE_INPUT)
    assert created["usage"]["input_tokens"] == chat["prompt_tokens"]
    if target.echo:
        assert created["status"] == "completed"
        assert created["output_text"] == PREFIX + NODE_INPUT
        assert created["usage"]["output_tokens"] == chat["completion_tokens"]
    answered = [completed(e) for e in responses_posted(target, NODE_INPUT) if not e.body.get("stream")]
    assert created["output_text"] == output_text(answered[0])  # the first: openai's create
    assert_usage_adds_up(created["usage"], chat["completion_tokens"] if target.echo else MAX_TOKENS)


def test_openai_node_responses_stream_to_the_final_response(node: dict[str, Any], target: Target):
    streamed = node["openai"]["stream"]
    types = [event["type"] for event in streamed["events"]]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    for needed in ("output_item.added", "content_part.added", "output_text.done", "output_item.done"):
        assert f"response.{needed}" in types
    numbers = [event["sequence_number"] for event in streamed["events"]]
    assert numbers == sorted(set(numbers)), "sequence numbers strictly increase"
    final = streamed["final"]
    assert final["id"].startswith("resp_") and final["output_text"] == streamed["deltas"]
    if target.echo:
        assert final["output_text"] == PREFIX + NODE_INPUT
        assert types.count("response.output_text.delta") > 3  # token by token
        assert final["usage"] == node["openai"]["create"]["usage"]
    assert_usage_adds_up(final["usage"], final["usage"]["output_tokens"])


@pytest.mark.parametrize("call", ["generateText", "streamText"])
def test_vercel_ai_sdk_default_provider(node: dict[str, Any], target: Target, call: str):
    answer = node["aiSdk"][call]
    # the gateway's answer it read: the relay's one of its kind (streamed or not) with its text
    streamed = call == "streamText"
    (gateway,) = [
        completed(e)
        for e in responses_posted(target, NODE_INPUT)
        if bool(e.body.get("stream")) == streamed and output_text(completed(e)) == answer["text"]
    ][-1:]
    usage = answer["usage"]
    assert usage["inputTokens"] == gateway["usage"]["input_tokens"]
    assert usage["outputTokens"] == gateway["usage"]["output_tokens"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    if target.echo:
        chat = target.chat_usage(NODE_INPUT)
        assert answer["text"] == PREFIX + NODE_INPUT
        assert (usage["inputTokens"], usage["outputTokens"]) == (
            chat["prompt_tokens"],
            chat["completion_tokens"],
        )
        assert answer["finishReason"] == "stop"
        assert not streamed or answer["pieces"] > 3
    else:
        assert 0 < usage["outputTokens"] <= MAX_TOKENS
        assert answer["finishReason"] == ("length" if gateway["status"] == "incomplete" else "stop")


# ----- the OpenAI Agents SDK (the agent clients' venv) ------------------------------------------


@pytest.fixture(scope="module")
def agents(target: Target) -> dict[str, Any]:
    python = AGENT_CLIENTS.program("python")
    prompt = AGENT_TOOL_ASK if target.echo else "Give me the x."
    forced = [] if target.echo else ["forced"]
    script = str(CLIENTS / "responses_agents.py")
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    return {"prompt": prompt} | run_json(
        [str(python), script, f"{target.url}/v1", target.model, KEY, prompt, *forced], env=env
    )


@pytest.mark.parametrize("run", ["run", "run_streamed"])
def test_agents_sdk_runs_its_function_tool_and_sends_the_output_back(
    agents: dict[str, Any], target: Target, run: str
):
    result = agents[run]
    assert result["calls"] == 1
    # the second request of each run carried the tool's output, for the call the first answered
    streamed = run == "run_streamed"
    turns = [e for e in responses_posted(target, agents["prompt"]) if bool(e.body.get("stream")) == streamed]
    first, second = turns
    (call,) = [item for item in completed(first)["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_x"
    outputs = [item for item in second.body["input"] if item.get("type") == "function_call_output"]
    expected = {"type": "function_call_output", "call_id": call["call_id"], "output": agents["tool_output"]}
    assert outputs == [expected]
    if target.echo:  # which answers the tool's output in words: the run's final output
        assert result["items"] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
        assert result["final_output"] == PREFIX + agents["prompt"]
        assert output_text(completed(second)) == result["final_output"]
        assert not streamed or "".join(result["deltas"]) == result["final_output"]
    else:  # the second turn is forced to call `done`, which ends the run
        assert result["items"] == ["tool_call_item", "tool_call_output_item"] * 2
        (ending,) = [item for item in completed(second)["output"] if item["type"] == "function_call"]
        assert ending["name"] == "done" and result["final_output"] == "done"


# ----- Codex CLI, headless -------------------------------------------------------------------------

# nothing but the gateway: no analytics, update check, plugins or apps; a short system prompt and
# few tools (the tiny model's context is 512 tokens)
CODEX_QUIET = [
    "-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false",
    "--disable", "plugins", "--disable", "remote_plugin", "--disable", "apps",
    "-c", "include_permissions_instructions=false", "-c", "include_environment_context=false",
    "-c", "include_apps_instructions=false", "-c", "web_search=disabled",
    "-c", "skills.include_instructions=false",
    "--disable", "goals", "--disable", "multi_agent", "--disable", "view_image",
    "--disable", "skill_search", "--disable", "image_generation",
]  # fmt: skip


def codex(target: Target, home: Path, prompt: str, *options: str) -> subprocess.CompletedProcess[str]:
    """`codex exec` with a custom provider whose base_url is the gateway (the relay in front)."""
    program = node_folder() / "node_modules" / ".bin" / "codex"
    home.mkdir()
    instructions = home / "instructions.md"
    instructions.write_text("Answer briefly.\n")
    provider = (
        f'model_providers.chatgate={{name="chatgate",base_url="{target.url}/v1",'
        'env_key="CHATGATE_KEY",wire_api="responses",request_max_retries=0,stream_max_retries=0}'
    )
    command = [
        str(program), "exec", "--skip-git-repo-check", "-c", "model_provider=chatgate", "-c", provider,
        *CODEX_QUIET, "-c", f"model_instructions_file={instructions}", *options, "-m", target.model, prompt,
    ]  # fmt: skip
    environment = {**node_environment(), "HOME": str(home), "CODEX_HOME": str(home), "CHATGATE_KEY": KEY}
    environment.pop("OPENAI_API_KEY", None)
    result = subprocess.run(
        command,
        cwd=home,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    return result


def succeeded(result: subprocess.CompletedProcess[str]) -> bool:
    assert result.returncode == 0, f"codex failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return True


def test_codex_cli_plain_turn(target: Target, tmp_path: Path):
    prompt = f"Say hi to the {target.name} gateway"
    result = codex(target, tmp_path / "codex", prompt)
    (turn,) = responses_posted(target, prompt)
    assert turn.status == 200 and turn.body["stream"] is True
    response = completed(turn)
    answered = output_text(response)
    assert answered.strip()
    assert "response.output_item.done" in [event["type"] for event in turn.events()]  # Codex reads it
    if target.echo:
        assert succeeded(result) and answered == PREFIX + prompt
    elif response["status"] == "incomplete":
        # the tiny model wrote to the deployment's limit: the gateway says so, Codex reports it
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
        assert 0 < response["usage"]["output_tokens"] <= MAX_TOKENS  # a stream's: counted by chunks
        assert result.returncode == 1
        assert "Incomplete response returned, reason: max_output_tokens" in result.stderr
        return
    else:  # it ended its turn by itself
        assert succeeded(result) and response["status"] == "completed"
    assert result.stdout.strip() == answered.strip()


def test_codex_cli_runs_a_shell_tool_and_sends_its_output_back(echo_gateway: str, tmp_path: Path):
    """On echo, which calls the tool the prompt asks for: Codex runs the command (its output is
    not in the prompt: the shell computes it) and sends the output back on its second request."""
    with RecordingRelay(echo_gateway) as relay:
        target = Target("echo", relay.url, "echo", relay)
        prompt = 'call exec_command {"cmd": "echo tool-$((6*7))"}'
        result = codex(target, tmp_path / "codex", prompt, "--dangerously-bypass-approvals-and-sandbox")
        assert succeeded(result)
        first, second = responses_posted(target, prompt)
    offered = {tool.get("name") for tool in first.body["tools"] if tool.get("type") == "function"}
    assert "exec_command" in offered
    (call,) = [item for item in completed(first)["output"] if item["type"] == "function_call"]
    assert call["name"] == "exec_command" and json.loads(call["arguments"]) == {"cmd": "echo tool-$((6*7))"}
    (output,) = [item for item in second.body["input"] if item.get("type") == "function_call_output"]
    assert output["call_id"] == call["call_id"] and "tool-42" in json.dumps(output["output"])
    assert result.stdout.strip() == PREFIX + prompt  # the answer to the second turn
