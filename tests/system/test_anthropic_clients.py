"""The real clients of Anthropic's Messages API against a running, keyed `chatgate serve` at its
/anthropic mount: @anthropic-ai/sdk for Node (create, the stream helpers, a forced tool call
and the turn that sends its result back, countTokens, the typed errors of a 400 and a 401),
LangChain's ChatAnthropic (invoke, stream, bind_tools), each on the echo backend and in front
of llama.cpp's server (an openai-compatible deployment); and Claude Code headless: on echo a
plain turn of its whole default agent, a turn that runs Bash and sends its output back, and
`/context`; in front of llama.cpp a bare turn (what the tiny model's window holds).

Each answer is held to a reference: on echo, what the gateway's own OpenAI dialect answers to
the same request; in front of llama.cpp, what the server answers to the same request sent to it
directly (greedy, so the same tokens). The heavy clients run from their npm folder or venv
(tests/support/client_libraries.py), a script each under tests/support/clients/ that prints
what it got as JSON; Claude Code runs with its home and config in tmp_path, its nonessential
traffic off and stdin closed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.echo import PREFIX
from gateway.policy.auth import new_key
from tests.support.client_libraries import AGENT_CLIENTS, CLIENTS, node_environment, node_folder
from tests.support.real_server_fixtures import DEPLOYMENT, Upstream, model_dir, probed
from tests.support.real_servers import cached_gguf, llama_server
from tests.support.servers import started_gateway

__all__ = ["model_dir"]  # a fixture this module uses

KEY, KEY_SHA = new_key()
ECHO = "echo"
PROMPTS = {"echo": "Hello from a client", "llama.cpp": "Tell me about the river."}
# the whole echo; a few tokens of the tiny model (greedy: the same ones every time)
MAX_TOKENS = {"echo": 64, "llama.cpp": 10}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
FORCED = {"type": "function", "function": {"name": "get_weather"}}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
TOOL_RESULT = "Sunny, 21 C"
CLAUDE_TIMEOUT = 120
CLAUDE_OUTPUT_LIMIT = 8  # output tokens a turn of Claude Code's asks of the tiny model
LLAMA_CPP_CONTEXT = 4096  # tokens: Claude Code's turns after the first add a note each
# Claude Code without the traffic that is not the turn itself (telemetry, update checks, the MCP
# registry, the HEAD probe of the base URL), nor retries that would hide a refusal
CLAUDE_ENVIRONMENT = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_MAX_RETRIES": "0",
}


@dataclass(frozen=True)
class Served:
    """A keyed gateway: `url` its base, `model` the name clients send, `upstream` the real
    server behind it (None on echo)."""

    name: str
    url: str
    log: Path
    model: str
    upstream: Upstream | None = None

    @property
    def anthropic(self) -> str:
        return f"{self.url}/anthropic"

    @property
    def prompt(self) -> str:
        return PROMPTS[self.name]

    @property
    def max_tokens(self) -> int:
        return MAX_TOKENS[self.name]

    def reference(self, body: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI chat completion the same request gets from the reference: the gateway's own
        OpenAI dialect on echo, the real server itself in front of one."""
        body = {"temperature": 0, "max_tokens": self.max_tokens, **body}
        if self.upstream is not None:
            return self.upstream.direct(body)
        response = httpx.post(
            f"{self.url}/v1/chat/completions",
            json={"model": self.model, **body},
            headers={"authorization": f"Bearer {KEY}"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return response.json()

    def streamed_usage(self) -> dict[str, Any]:
        """The usage the gateway's OpenAI dialect reports for the prompt streamed: in front of a
        server that sends no usage in a stream (llama.cpp's), the gateway's own count."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt}],
            "temperature": 0,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"authorization": f"Bearer {KEY}"}
        with httpx.stream(
            "POST", f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=30
        ) as sent:
            assert sent.status_code == 200
            chunks = [json.loads(line[6:]) for line in sent.iter_lines() if line.startswith("data: {")]
        return {"usage": chunks[-1]["usage"]}

    def asked(self, **body: Any) -> dict[str, Any]:
        return self.reference({"messages": [{"role": "user", "content": self.prompt}], **body})

    def messages_logged(self, path: str = "/anthropic/v1/messages") -> list[dict[str, Any]]:
        """The access log's lines of requests to `path`, in order."""
        lines = (json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{"))
        return [line for line in lines if line.get("path") == path]


def keyed_config(folder: Path, deployment: dict[str, Any]) -> Path:
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump({"keys": [{"name": "clients", "sha256": KEY_SHA}], "deployments": [deployment]})
    )
    return config


@pytest.fixture(scope="module")
def echo_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("anthropic-echo")
    config = keyed_config(folder, {"name": ECHO, "backend": "echo"})
    with started_gateway(folder, config) as (_, url, log):
        yield Served("echo", url, log, ECHO)


@pytest.fixture(scope="module")
def llama_cpp_gateway(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("anthropic-llama.cpp")
    # the tiny model with a window of LLAMA_CPP_CONTEXT: llama.cpp's server caps its own at the model's
    with llama_server(cached_gguf("tiny-long"), folder, LLAMA_CPP_CONTEXT) as server:
        options = {"base_url": server.base_url, "upstream_model": server.model, "probe": True}
        deployment = {
            "name": DEPLOYMENT,
            "backend": "openai-compatible",
            "tokenizer": str(model_dir / "tokenizer.json"),  # counts tokens as the server does
            "options": options,
        }
        config = keyed_config(folder, deployment)
        with started_gateway(folder, config) as (_, url, log):
            probed(url, key=KEY)
            yield Served("llama.cpp", url, log, DEPLOYMENT, Upstream("llama.cpp", server, url, log))


@pytest.fixture(scope="module", params=["echo", "llama.cpp"])
def served(request: pytest.FixtureRequest) -> Served:
    return request.getfixturevalue(f"{request.param.replace('.', '_')}_gateway")


def run_json(command: list[str], **options: Any) -> Any:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, **options
    )
    assert result.returncode == 0, f"{command[1]} failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def text_of(choice: dict[str, Any]) -> str:
    return choice["message"]["content"] or ""


def tool_input(arguments: str) -> Any:
    """A tool call's arguments as the `input` an Anthropic client reads."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return {"_arguments": arguments}


def same_usage(usage: dict[str, Any], reference: dict[str, Any]) -> None:
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        reference["usage"]["prompt_tokens"],
        reference["usage"]["completion_tokens"],
    )


# ----- @anthropic-ai/sdk for Node (the npm folder) ---------------------------------------------


@pytest.fixture(scope="module")
def node(served: Served) -> dict[str, Any]:
    folder = node_folder()
    script = folder / "anthropic_node.mjs"  # beside its node_modules: ES modules resolve from there
    shutil.copy(CLIENTS / "anthropic_node.mjs", script)
    node_program = shutil.which("node")
    assert node_program is not None, "node is not installed: ./scripts/run-tests installs npm with it"
    asked = {
        "baseURL": served.anthropic,
        "apiKey": KEY,
        "model": served.model,
        "prompt": served.prompt,
        "maxTokens": served.max_tokens,
        "toolResult": TOOL_RESULT,
    }
    return run_json([node_program, str(script), json.dumps(asked)], env=node_environment())


def test_node_sdk_create(node: dict[str, Any], served: Served):
    reference = served.asked()
    (choice,) = reference["choices"]
    answer = node["create"]
    assert answer["id"].startswith("msg_") and answer["type"] == "message" and answer["role"] == "assistant"
    assert answer["content"] == [{"type": "text", "text": text_of(choice), "citations": None}]
    assert answer["stop_reason"] == STOP_REASONS[choice["finish_reason"]]
    assert answer["model"] == served.model
    same_usage(answer["usage"], reference)
    if served.name == "echo":
        assert text_of(choice) == f"{PREFIX} {served.prompt}"


def test_node_sdk_stream_helpers(node: dict[str, Any], served: Served):
    reference = served.asked()
    (choice,) = reference["choices"]
    streamed = node["stream"]
    assert len(streamed["texts"]) > 1 and "".join(streamed["texts"]) == text_of(choice)
    events = streamed["events"]
    assert events[:2] == ["message_start", "content_block_start"]
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[2:-3]) == {"content_block_delta"}
    final = streamed["final"]
    assert final["id"].startswith("msg_")
    assert final["content"] == [{"type": "text", "text": text_of(choice), "citations": None}]
    assert final["stop_reason"] == STOP_REASONS[choice["finish_reason"]]
    same_usage(final["usage"], served.streamed_usage())


def test_node_sdk_forced_tool_then_its_result(node: dict[str, Any], served: Served):
    reference = served.asked(tools=[WEATHER], tool_choice=FORCED)
    (choice,) = reference["choices"]
    (call,) = choice["message"]["tool_calls"]
    forced = node["forced"]
    (block,) = forced["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_")
    assert (block["name"], block["input"]) == ("get_weather", tool_input(call["function"]["arguments"]))
    assert forced["stop_reason"] == STOP_REASONS[choice["finish_reason"]]
    if served.name == "echo":
        assert forced["stop_reason"] == "tool_use" and block["input"] == {"city": served.prompt}
    # the next turn carries the call and its result: the reference is asked the same conversation
    conversation = [
        {"role": "user", "content": served.prompt},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(block["input"])},
                }
            ],
        },
        {"role": "tool", "tool_call_id": block["id"], "content": TOOL_RESULT},
    ]
    answered_reference = served.reference({"messages": conversation, "tools": [WEATHER]})
    (answered_choice,) = answered_reference["choices"]
    answered = node["answered"]
    assert answered["content"] == [{"type": "text", "text": text_of(answered_choice), "citations": None}]
    assert answered["stop_reason"] == STOP_REASONS[answered_choice["finish_reason"]]
    same_usage(answered["usage"], answered_reference)
    assert answered["usage"]["input_tokens"] > forced["usage"]["input_tokens"]


def test_node_sdk_count_tokens(node: dict[str, Any], served: Served):
    counted = node["countTokens"]
    assert set(counted["plain"]) == {"input_tokens"}
    assert counted["withTools"]["input_tokens"] > counted["plain"]["input_tokens"] > 0
    if served.upstream is not None:  # the deployment's tokenizer: the count admission makes too
        assert counted["plain"]["input_tokens"] == served.streamed_usage()["usage"]["prompt_tokens"]


def test_node_sdk_reads_a_400_and_a_401_as_its_typed_errors(node: dict[str, Any]):
    for case, (kind, status, error_type, says) in {
        "badRequest": ("BadRequestError", 400, "invalid_request_error", "max_tokens"),
        "badRole": ("BadRequestError", 400, "invalid_request_error", "messages.0.role"),
        "unauthorized": ("AuthenticationError", 401, "authentication_error", "key"),
    }.items():
        error = node[case]
        assert error is not None, f"{case}: no error"
        assert error["class"] == kind and error["typed"][kind] and error["status"] == status, case
        body = error["body"]
        assert body["type"] == "error" and body["error"]["type"] == error_type, case
        assert says in body["error"]["message"], (case, body)
        assert error["requestID"] and error["requestID"] == body["request_id"], case


# ----- LangChain's ChatAnthropic (the agent clients' venv) -------------------------------------


@pytest.fixture(scope="module")
def langchain(served: Served) -> dict[str, Any]:
    python = AGENT_CLIENTS.program("python")
    script = str(CLIENTS / "anthropic_langchain.py")
    return run_json(
        [str(python), script, served.anthropic, KEY, served.model, served.prompt, str(served.max_tokens)]
    )


def test_langchain_invoke_and_stream(langchain: dict[str, Any], served: Served):
    reference = served.asked()
    (choice,) = reference["choices"]
    for call, usage in (("invoke", reference["usage"]), ("stream", served.streamed_usage()["usage"])):
        answer = langchain[call]
        assert answer["content"] == text_of(choice), call
        got = answer["usage"]
        assert (got["input_tokens"], got["output_tokens"], got["total_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["prompt_tokens"] + usage["completion_tokens"],
        ), call
    assert langchain["invoke"]["stop_reason"] == STOP_REASONS[choice["finish_reason"]]
    assert langchain["stream"]["pieces"] > 1  # streamed, token by token


def test_langchain_bound_tool_forced(langchain: dict[str, Any], served: Served):
    (choice,) = served.asked(tools=[WEATHER], tool_choice=FORCED)["choices"]
    (call,) = choice["message"]["tool_calls"]
    (got,) = langchain["tool_calls"]
    assert (got["name"], got["args"]) == ("get_weather", tool_input(call["function"]["arguments"]))
    assert got["id"].startswith("toolu_")
    assert langchain["tool_stop_reason"] == STOP_REASONS[choice["finish_reason"]]
    if served.name == "echo":
        assert got["args"] == {"city": served.prompt}


# ----- Claude Code headless (its native binary, from the npm folder) ---------------------------


def claude(
    served: Served, home: Path, *arguments: str, limit: int | None = None
) -> subprocess.CompletedProcess[str]:
    """`claude -p …` with the gateway as its API, its home and config under `home`, on loopback;
    `limit` the output tokens it asks for (else its own default)."""
    program = node_folder() / "node_modules" / ".bin" / "claude"
    home.mkdir()
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "TMPDIR": str(home),
        "ANTHROPIC_BASE_URL": served.anthropic,
        "ANTHROPIC_API_KEY": KEY,
        "NO_PROXY": "127.0.0.1,localhost",
        **CLAUDE_ENVIRONMENT,
    }
    if limit is not None:
        environment["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(limit)
    command = [str(program), "--model", served.model, *arguments]
    return subprocess.run(
        command,
        cwd=home,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLAUDE_TIMEOUT,
    )


def logged_since(served: Served, before: int) -> list[dict[str, Any]]:
    return served.messages_logged()[before:]


def test_claude_code_plain_turn(echo_gateway: Served, tmp_path: Path):
    """The whole default agent: its system prompt, a dozen tools, its betas and extra fields, a
    `system` message in `messages`; streamed."""
    before = len(echo_gateway.messages_logged())
    ran = claude(echo_gateway, tmp_path / "home", "-p", echo_gateway.prompt, "--output-format", "json")
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    result = json.loads(ran.stdout)
    assert result["is_error"] is False and result["type"] == "result" and result["num_turns"] == 1, result
    # the echo of the user's message: Claude Code's reminders, then the prompt
    assert result["result"].startswith(PREFIX) and result["result"].endswith(echo_gateway.prompt)
    assert result["stop_reason"] == "end_turn"
    (logged,) = logged_since(echo_gateway, before)
    assert (logged["status"], logged["key"], logged["deployment"], logged["stream"]) == (
        200,
        "clients",
        ECHO,
        True,
    )
    assert result["usage"]["output_tokens"] == logged["completion_tokens"] > 0
    assert result["usage"]["input_tokens"] == logged["prompt_tokens"]


def test_claude_code_context_counts_its_tokens_through_the_gateway(echo_gateway: Served, tmp_path: Path):
    """`/context` asks count_tokens for each part of its context at once (`?beta=true`), and
    sends no message."""
    counts = "/anthropic/v1/messages/count_tokens"
    before = len(echo_gateway.messages_logged()), len(echo_gateway.messages_logged(counts))
    ran = claude(echo_gateway, tmp_path / "home", "-p", "/context", "--output-format", "json")
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    result = json.loads(ran.stdout)
    assert result["is_error"] is False and result["result"].startswith("## Context Usage"), result
    counted = echo_gateway.messages_logged(counts)[before[1] :]
    assert len(counted) > 10 and {line["status"] for line in counted} == {200}
    assert len(echo_gateway.messages_logged()) == before[0]


def test_claude_code_turn_in_front_of_llama_cpp(llama_cpp_gateway: Served, tmp_path: Path):
    """Bare, with no tools and a short system prompt, so that the tiny model's turns fit its
    window. A random model hardly ever ends a turn by itself: each answer stops at Claude Code's
    output limit, and Claude Code asks it to go on (three times), then says so. Every one of
    those turns is relayed to llama.cpp and streamed back whole."""
    served = llama_cpp_gateway
    before = len(served.messages_logged())
    ran = claude(
        served,
        tmp_path / "home",
        *("--bare", "--tools", "", "--system-prompt", "Be brief."),
        *("-p", served.prompt, "--output-format", "stream-json", "--verbose"),
        limit=CLAUDE_OUTPUT_LIMIT,
    )
    events = [json.loads(line) for line in ran.stdout.splitlines() if line.strip()]
    answers = [
        event["message"]
        for event in events
        if event["type"] == "assistant" and event["message"]["model"] != "<synthetic>"  # its own notes
    ]
    texts = [block["text"] for answer in answers for block in answer["content"] if block["type"] == "text"]
    logged = logged_since(served, before)
    assert logged and len(texts) == len(logged), (ran.stderr[-2000:], logged)
    for line in logged:
        assert (line["status"], line["key"], line["deployment"], line["stream"]) == (
            200,
            "clients",
            DEPLOYMENT,
            True,
        )
        assert line["completion_tokens"] > 0
    assert any(text.strip() for text in texts)
    final = events[-1]
    assert final["type"] == "result" and final.get("api_error_status") is None, final  # no error answer
    if final["is_error"]:
        assert final.get("api_error") == "max_output_tokens", final
    else:  # the model sampled its end of turn (seldom): that ended the run
        assert final["stop_reason"] == "end_turn", final


def test_claude_code_runs_a_tool_and_sends_its_result_back(echo_gateway: Served, tmp_path: Path):
    before = len(echo_gateway.messages_logged())
    ran = claude(
        echo_gateway,
        tmp_path / "home",
        "-p",
        'call Bash {"command": "echo tool-$((6 * 7))"}',
        "--allowedTools",
        "Bash",
        "--output-format",
        "stream-json",
        "--verbose",
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    events = [json.loads(line) for line in ran.stdout.splitlines() if line.strip()]
    blocks = [
        (event["type"], block)
        for event in events
        if event["type"] in ("assistant", "user")
        for block in event["message"]["content"]
    ]
    (call,) = [block for kind, block in blocks if block["type"] == "tool_use"]
    assert call["name"] == "Bash" and call["input"]["command"] == "echo tool-$((6 * 7))"
    assert call["id"].startswith("toolu_")
    (result,) = [block for kind, block in blocks if block["type"] == "tool_result"]
    assert result["tool_use_id"] == call["id"] and result["is_error"] is False
    assert result["content"] == "tool-42"  # the shell ran it: the text is nowhere in the prompt
    final = events[-1]
    assert final["type"] == "result" and final["is_error"] is False and final["num_turns"] == 2, final
    assert final["result"].startswith(PREFIX)
    # two requests, the second one longer by the call and its result
    first, second = logged_since(echo_gateway, before)
    assert first["status"] == second["status"] == 200
    assert second["prompt_tokens"] > first["prompt_tokens"]
