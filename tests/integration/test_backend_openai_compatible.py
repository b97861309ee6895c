"""The openai-compatible backend, end to end.

The upstream is a second chatgate process (echo backend, default config); the gateway under
test relays to its /v1. Every client dialect, through its own SDK where one fits, must get
exactly what the same client gets from the upstream directly. Upstream failures and stalls
come from a small raw-asyncio stub server on loopback.
"""

from __future__ import annotations

import asyncio
import functools
import http
import json
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pydantic
import pytest
import yaml
from aleph_alpha_client import AsyncClient as AlephAlphaAsyncClient
from aleph_alpha_client import Client as AlephAlphaClient
from aleph_alpha_client.chat import ChatRequest as AlephAlphaChatRequest
from aleph_alpha_client.chat import Message, Role, StreamOptions
from azure.ai.inference import ChatCompletionsClient
from azure.core.credentials import AzureKeyCredential

from backends.openai_compatible import OpenAICompatibleBackend, StreamState, finish_reason, matched_stop
from gateway.core.canonical import ChatRequest, Finish, ToolCallDelta, Usage
from gateway.core.errors import BadGateway
from tests.support.loopback_server import LoopbackServer
from tests.support.readers import reader, registered
from tests.support.servers import CHAT_PATHS, free_port, running_gateway

CLIENT_TIMEOUT = 20.0  # every request is bounded: a hang fails the test instead of stalling it
PROMPT = "what is the weather in Lisbon"
MESSAGES = [{"role": "user", "content": PROMPT}]
SECRET = "sk-test-secret-4711"
PATHS = CHAT_PATHS
DIALECTS = registered()  # every one: each has a reader
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


# ----- the stub upstream ------------------------------------------------------------------------


@dataclass
class StubConnection:
    """One request the stub received, and whether the gateway has since closed the connection."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    closed: threading.Event = field(default_factory=threading.Event)


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    return sse({"id": "stub", "object": "chat.completion.chunk", "created": 0, "model": "stub",
                "choices": choices, **extra})  # fmt: skip


def delta(index: int = 0, finish_reason: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": fields, "logprobs": None, "finish_reason": finish_reason}


# A streamed answer whose tool calls arrive in fragments, with no usage at the end.
FRAGMENTED_STREAM = [
    chunk([delta(role="assistant", content="")]),
    chunk([delta(content="Hel")]),
    chunk([delta(content="lo")]),
    chunk([delta(tool_calls=[{"index": 0, "id": "call_a", "type": "function",
                              "function": {"name": "lookup", "arguments": ""}}])]),
    chunk([delta(tool_calls=[{"index": 0, "function": {"arguments": '{"q": '}}])]),
    chunk([delta(tool_calls=[{"index": 0, "function": {"arguments": '"x"}'}}])]),
    chunk([delta(tool_calls=[{"index": 1, "id": "call_b", "type": "function",
                              "function": {"name": "other", "arguments": "{}"}}])]),
    chunk([delta(finish_reason="tool_calls")]),
    b"data: [DONE]\n\n",
]  # fmt: skip
FRAGMENTED_CHUNKS_SEEN = 6  # two content chunks, four tool-call fragments
BURSTS = {
    "burst": FRAGMENTED_STREAM,
    "burst-failing": [chunk([delta(role="assistant", content="Hel")]), chunk([delta(content="lo")]),
                      sse({"error": {"message": "overloaded"}})],
}  # fmt: skip


class StubUpstream(LoopbackServer):
    """A raw asyncio HTTP/1.1 server in a thread; the first path segment picks what it does."""

    thread_name = "stub-upstream"

    def __init__(self) -> None:
        super().__init__()
        self.connections: list[StubConnection] = []

    def connection_with(self, marker: str) -> StubConnection:
        found = [c for c in self.connections if marker in orjson.dumps(c.body).decode()]
        assert len(found) == 1, f"expected one upstream request carrying {marker!r}"
        return found[0]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            path = request_line.split(" ")[1]
            headers = {}
            for line in header_lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            connection = StubConnection(path, headers, orjson.loads(raw))
            self.connections.append(connection)
            await self.answer(path.strip("/").split("/")[0], connection, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.tasks.discard(task)

    async def answer(
        self,
        behaviour: str,
        connection: StubConnection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        if behaviour.startswith("status-"):
            status = int(behaviour.removeprefix("status-"))
            message = f"stub upstream says {status}"
            if status in (401, 403):  # what a real upstream says about a wrong key
                message = f"Incorrect API key provided: {SECRET}"
            param = "temperature" if status in (400, 422) else None
            extra = {"Retry-After": "7"} if status == 429 else {}
            body = {"error": {"message": message, "type": "stub", "param": param, "code": None}}
            await respond(writer, status, orjson.dumps(body), extra)
        elif behaviour == "quotes-key":  # a 4xx whose words quote the credentials it was sent
            message = f"the key {SECRET} may not use tenant t1 (authorization: Bearer {SECRET})"
            body = {"error": {"message": message, "type": "stub", "param": None, "code": None}}
            await respond(writer, 400, orjson.dumps(body))
        elif behaviour in RETRY_AFTERS:
            body = {"error": {"message": "slow down", "type": "stub", "param": None, "code": None}}
            await respond(writer, 429, orjson.dumps(body), {"Retry-After": RETRY_AFTERS[behaviour][0]})
        elif behaviour == "malformed":
            await respond(writer, 200, b'{"id": "x", "choices": [{"index": 0, "mess')
        elif behaviour == "capture":
            await self.capture(connection, writer)
        elif behaviour == "fragments":
            await start_stream(writer)
            for piece in FRAGMENTED_STREAM:
                writer.write(piece)
                await writer.drain()
        elif behaviour in BURSTS:  # the whole stream in one write: the gateway reads it at once
            await start_stream(writer)
            writer.write(b"".join(BURSTS[behaviour]))
            await writer.drain()
        elif behaviour in ("stall", "midstream"):
            if behaviour == "midstream":
                await start_stream(writer)
                writer.write(chunk([delta(role="assistant", content="partial")]))
                await writer.drain()
            await reader.read()  # answers no more; returns when the gateway hangs up
            connection.closed.set()
        elif behaviour in ("refusing", "detailed"):
            await self.say_everything(behaviour, connection, writer)
        elif behaviour == "stream-malformed":  # an event whose data is not JSON, first
            await start_stream(writer)
            writer.write(b'data: {"id": "x", "choices": [{"index": 0, "delta\n\n')
            await writer.drain()
        elif behaviour == "truncated":
            await start_stream(writer)
            writer.write(chunk([delta(role="assistant", content="partial")]))
            await writer.drain()
        else:
            await respond(writer, 404, b'{"error": {"message": "no such stub"}}')

    async def capture(self, connection: StubConnection, writer: asyncio.StreamWriter) -> None:
        """Answer "ok" for each of n choices, without usage (the gateway must estimate it)."""
        n = connection.body.get("n", 1)
        if not connection.body.get("stream"):
            choices = [
                {"index": i, "message": {"role": "assistant", "content": "ok"},
                 "logprobs": None, "finish_reason": "stop"}
                for i in range(n)
            ]  # fmt: skip
            body = {"id": "x", "object": "chat.completion", "created": 0, "model": "stub",
                    "choices": choices}  # fmt: skip
            await respond(writer, 200, orjson.dumps(body))
            return
        await start_stream(writer)
        for i in range(n):
            writer.write(chunk([delta(i, content="ok")]))
            writer.write(chunk([delta(i, finish_reason="stop")]))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()

    async def say_everything(
        self, behaviour: str, connection: StubConnection, writer: asyncio.StreamWriter
    ) -> None:
        """An answer with every field a client could read besides the text: a refusal (or text)
        with its logprobs and their bytes, the fingerprint, the tier, usage details."""
        part = "refusal" if behaviour == "refusing" else "content"
        served = {"system_fingerprint": "fp_stub", "service_tier": "default"}
        if not connection.body.get("stream"):
            logprobs = {"content": None, "refusal": None, part: EVERYTHING_LOGPROBS}
            message = {"role": "assistant", "content": None, "refusal": None, part: EVERYTHING_TEXT}
            body = {"id": "x", "object": "chat.completion", "created": 0, "model": "stub",
                    "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                                 "finish_reason": "stop"}],
                    "usage": EVERYTHING_USAGE, **served}  # fmt: skip
            await respond(writer, 200, orjson.dumps(body))
            return
        await start_stream(writer)
        writer.write(chunk([delta(role="assistant", content=None)], **served))
        for entry in EVERYTHING_LOGPROBS:
            piece = {"index": 0, "delta": {part: entry["token"]}, "finish_reason": None,
                     "logprobs": {"content": None, "refusal": None, part: [entry]}}  # fmt: skip
            writer.write(chunk([piece], **served))
        writer.write(chunk([delta(finish_reason="stop")], **served))
        writer.write(chunk([], usage=EVERYTHING_USAGE, **served))
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()


EVERYTHING_LOGPROBS = [
    {"token": "No", "logprob": -0.1, "bytes": [78, 111],
     "top_logprobs": [{"token": "No", "logprob": -0.1, "bytes": [78, 111]},
                      {"token": "<|x|>", "logprob": -3.0, "bytes": None}]},
    {"token": ", sorry", "logprob": -0.2, "bytes": None, "top_logprobs": []},
]  # fmt: skip
EVERYTHING_TEXT = "No, sorry"
EVERYTHING_USAGE = {
    "prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13,
    "completion_tokens_details": {"reasoning_tokens": 7, "accepted_prediction_tokens": 0,
                                  "rejected_prediction_tokens": 0, "audio_tokens": 0},
    "prompt_tokens_details": {"cached_tokens": 3, "audio_tokens": 0},
}  # fmt: skip


async def respond(
    writer: asyncio.StreamWriter, status: int, body: bytes, headers: dict[str, str] | None = None
) -> None:
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
             "content-type: application/json", f"content-length: {len(body)}",
             "connection: close"]  # fmt: skip
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()


async def start_stream(writer: asyncio.StreamWriter) -> None:
    """SSE response headers; the body runs until the connection closes."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
    await writer.drain()


# ----- servers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream(log_dir: Path) -> Iterator[str]:
    """A second chatgate: default config, every dialect on the echo backend."""
    with running_gateway(log_dir) as url:
        yield url


@pytest.fixture(scope="module")
def stub() -> Iterator[StubUpstream]:
    with StubUpstream() as server:
        yield server


STUB_BEHAVIOURS = ["status-400", "status-401", "status-403", "status-404", "status-422",
                   "status-429", "status-500", "status-503", "malformed", "capture",
                   "fragments", "stall", "midstream", "truncated", "stream-malformed", "refusing",
                   "detailed", "retry-after-abc", "retry-after-negative", "retry-after-markup",
                   "retry-after-huge", "retry-after-date", "quotes-key", "burst",
                   "burst-failing"]  # fmt: skip
# what the stub's 429 says in Retry-After, by behaviour; and what the client may be told
RETRY_AFTERS = {
    "retry-after-abc": ("abc", None),
    "retry-after-negative": ("-5", None),
    "retry-after-markup": ("<script>alert(1)</script>", None),
    "retry-after-huge": ("999999999", "86400"),
    "retry-after-date": ("Wed, 21 Oct 2015 07:28:00 GMT", "0"),  # past: at once
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, log_dir: Path, upstream: str, stub: StubUpstream):
    relay = {"base_url": f"{upstream}/v1", "first_byte": 20, "total": 60}
    deployments: list[dict[str, Any]] = [
        {"name": "relay", "backend": "openai-compatible", "models": ["*"], "options": relay},
        # the client may send extra parameters; the upstream (extra-parameters: error) refuses them
        {"name": "relay-open", "backend": "openai-compatible",
         "extra_parameters": "pass-through", "options": relay},
        # ... unless the deployment's own headers ask the upstream to let them through
        {"name": "relay-lenient", "backend": "openai-compatible",
         "extra_parameters": "pass-through",
         "options": {**relay, "headers": {"extra-parameters": "pass-through"}}},
        # an LMI upstream: its streams are JSON lines, and it refuses stream_options
        {"name": "relay-lmi", "backend": "openai-compatible",
         "options": {**relay, "base_url": f"{upstream}/lmi/v1", "stream_usage": False}},
        {"name": "unreachable", "backend": "openai-compatible",
         "options": {"base_url": f"http://127.0.0.1:{free_port()}/v1", "connect": 2},
         "health": {"failures": 1000}},
    ]  # fmt: skip
    for behaviour in STUB_BEHAVIOURS:
        options = {
            "base_url": f"{stub.url}/{behaviour}/v1",
            "api_key": SECRET,
            "headers": {"x-tenant": "t1"},
            "upstream_model": "stub-model",
            "max_tokens_parameter": "max_completion_tokens",
            "first_byte": 0.5,
            "total": 1.5,
        }
        deployments.append(
            {"name": f"stub-{behaviour}", "backend": "openai-compatible",
             "extra_parameters": "pass-through", "options": options,
             # each test sees its own failure, not the circuit breaker's or a retry's
             # (both tested in test_fleet.py)
             "health": {"failures": 1000}, "retries": {"attempts": 1}}
        )  # fmt: skip
    config = tmp_path_factory.mktemp("relay") / "config.yaml"
    config.write_text(yaml.safe_dump({"deployments": deployments}))
    with running_gateway(log_dir, config) as url:
        yield url


# ----- what a client saw, folded the same way in every dialect --------------------------------


def logprob_list(logprobs: Any) -> list[tuple] | None:
    if isinstance(logprobs, list):  # LMI streams the object inside a list
        logprobs = logprobs[0] if logprobs else None
    if not logprobs or logprobs.get("content") is None:
        return None
    return [
        (e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e.get("top_logprobs") or []])
        for e in logprobs["content"]
    ]


def usage_tuple(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    if not usage:
        return None
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


def tool_calls_of(calls: list[dict[str, Any]] | None) -> list[tuple[str, str, str]]:
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls or []]


def fold_completion(body: dict[str, Any]) -> dict[str, Any]:
    choices = {
        c["index"]: {
            "text": c["message"].get("content") or "",
            "finish": c["finish_reason"],
            "logprobs": logprob_list(c.get("logprobs")),
            "tool_calls": tool_calls_of(c["message"].get("tool_calls")),
        }
        for c in body["choices"]
    }
    return {"choices": choices, "usage": usage_tuple(body.get("usage"))}


def fold_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    choices: dict[int, dict[str, Any]] = defaultdict(
        lambda: {"text": "", "finish": None, "logprobs": None, "tool_calls": []}
    )
    usage = None
    for body in chunks:
        assert "error" not in body, body
        usage = usage_tuple(body.get("usage")) or usage
        for c in body.get("choices") or []:
            choice, d = choices[c["index"]], c.get("delta") or {}
            choice["text"] += d.get("content") or ""
            if (logprobs := logprob_list(c.get("logprobs"))) is not None:
                choice["logprobs"] = (choice["logprobs"] or []) + logprobs
            choice["tool_calls"] += tool_calls_of(d.get("tool_calls"))
            choice["finish"] = c.get("finish_reason") or choice["finish"]
    return {"choices": dict(choices), "usage": usage}


# ----- one client per dialect, each returning the folded answer --------------------------------


@functools.cache
def openai_client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="test", max_retries=0, timeout=CLIENT_TIMEOUT)


@functools.cache
def http_client() -> httpx.Client:
    return httpx.Client(timeout=CLIENT_TIMEOUT)


def openai_sdk_chat(base: str, mount: str, model: str, stream: bool, **params: Any) -> dict:
    client = openai_client(base + mount)
    if not stream:
        completion = client.chat.completions.create(model=model, messages=MESSAGES, **params)
        return fold_completion(completion.model_dump())
    chunks = client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **params
    )
    return fold_chunks([c.model_dump() for c in chunks])


def azure_sdk_chat(base: str, model: str, stream: bool, **params: Any) -> dict:
    if (params.get("response_format") or {}).get("type") == "json_object":
        params["response_format"] = "json_object"
    client = ChatCompletionsClient(
        endpoint=base + "/azure", credential=AzureKeyCredential("test"), read_timeout=CLIENT_TIMEOUT
    )
    with client:
        result = client.complete(messages=MESSAGES, model=model, stream=stream, **params)
        if not stream:
            return fold_completion(result.as_dict())
        return fold_chunks([update.as_dict() for update in result])


def aleph_alpha_chat(base: str, model: str, stream: bool, **params: Any) -> dict:
    if params:  # the SDK has no n, logprobs or max_tokens: those go as plain HTTP
        return raw_chat(base, "aleph_alpha", model, stream, **params)
    host = base + "/aleph-alpha"
    message = Message(role=Role.User, content=PROMPT)
    if not stream:
        client = AlephAlphaClient(token="test", host=host, total_retries=0)
        response = client.chat(AlephAlphaChatRequest(model=model, messages=[message]), model=model)
        choice = {"text": response.message.content, "finish": response.finish_reason.value,
                  "logprobs": None, "tool_calls": []}  # fmt: skip
        return {"choices": {0: choice}, "usage": None}

    async def collect() -> dict:
        request = AlephAlphaChatRequest(
            model=model, messages=[message], stream_options=StreamOptions(include_usage=True)
        )
        choice = {"text": "", "finish": None, "logprobs": None, "tool_calls": []}
        usage = None
        async with AlephAlphaAsyncClient(token="test", host=host, total_retries=0) as client:
            async for item in client.chat_with_streaming(request, model=model):
                if hasattr(item, "content"):
                    choice["text"] += item.content
                elif hasattr(item, "total_tokens"):
                    usage = (item.prompt_tokens, item.completion_tokens, item.total_tokens)
                else:
                    choice["finish"] = item.value
        return {"choices": {0: choice}, "usage": usage}

    return asyncio.run(collect())


def raw_chat(base: str, dialect: str, model: str, stream: bool, **params: Any) -> dict:
    """Plain HTTP for what no SDK covers (LMI, and Aleph Alpha's n / logprobs)."""
    body = {"model": model, "messages": MESSAGES, **params}
    if stream:
        body["stream"] = True
        if dialect != "lmi":
            body["stream_options"] = {"include_usage": True}
    client = http_client()
    if not stream:
        response = client.post(base + PATHS[dialect], json=body)
        assert response.status_code == 200, response.text
        return fold_completion(response.json())
    with client.stream("POST", base + PATHS[dialect], json=body) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line]
    if dialect == "lmi":  # JSON lines
        return fold_chunks([json.loads(line) for line in lines])
    assert lines[-1] == "data: [DONE]"
    return fold_chunks([json.loads(line.removeprefix("data: ")) for line in lines[:-1]])


CLIENTS: dict[str, Callable[..., dict]] = {
    "openai": lambda base, model, stream, **p: openai_sdk_chat(base, "/v1", model, stream, **p),
    "ovms": lambda base, model, stream, **p: openai_sdk_chat(base, "/v3", model, stream, **p),
    "azure": azure_sdk_chat,
    "aleph_alpha": aleph_alpha_chat,
    "lmi": lambda base, model, stream, **p: raw_chat(base, "lmi", model, stream, **p),
}

SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {},
    "length": {"max_tokens": 4},
    "n2": {"n": 2, "seed": 7},
    "logprobs": {"logprobs": True, "top_logprobs": 3},
    "tool": {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "json_object": {"response_format": {"type": "json_object"}},
}
# What each dialect's own document lets a client ask for.
DIALECT_SCENARIOS = {
    "openai": ["plain", "length", "n2", "logprobs", "tool", "json_object"],
    # OVMS rejects top_logprobs and response_format; its n above 1 needs best_of (beam search),
    # which the OpenAI upstream here does not take
    "ovms": ["plain", "length", "logprobs", "tool"],
    "azure": ["plain", "length", "tool", "json_object"],  # no n, no logprobs in the Azure API
    "aleph_alpha": ["plain", "length", "n2", "logprobs", "tool"],  # its response_format is json_schema only
    "lmi": ["plain", "length", "n2", "logprobs"],
}


# What OVMS's rules refuse (ovms.yaml x-chatgate-rules): logprobs do not stream.
NOT_STREAMED = {("ovms", "logprobs")}


def scenario_params(dialect: str, scenario: str) -> dict[str, Any]:
    params = dict(SCENARIOS[scenario])
    if dialect == "ovms" and scenario == "logprobs":
        del params["top_logprobs"]
    return params


def check_scenario(scenario: str, params: dict[str, Any], answer: dict[str, Any]) -> None:
    """What the echo upstream's answer must look like, so that equal answers are not vacuous."""
    choices = answer["choices"]
    assert sorted(choices) == list(range(params.get("n", 1)))
    for choice in choices.values():
        if scenario in ("plain", "n2"):
            assert choice["text"].endswith(f"You said: {PROMPT}")
        elif scenario == "length":
            assert len(choice["text"].split()) == 4
            assert choice["finish"] == "length"
        elif scenario == "logprobs":
            tokens = choice["logprobs"]
            assert tokens, "no logprobs relayed"
            assert "".join(token for token, _, _ in tokens) == choice["text"]
            assert all(len(top) == params.get("top_logprobs", 0) for _, _, top in tokens)
        elif scenario == "tool":
            [(call_id, name, arguments)] = choice["tool_calls"]
            assert call_id and name == "get_weather"
            assert json.loads(arguments) == {"city": PROMPT}
        elif scenario == "json_object":
            assert json.loads(choice["text"])["echo"] == PROMPT
    if answer["usage"] is not None:
        prompt, completion, total = answer["usage"]
        assert prompt > 0 and completion > 0 and total == prompt + completion


CASES = [
    pytest.param(dialect, scenario, stream, id=f"{dialect}-{scenario}-{'stream' if stream else 'json'}")
    for dialect, scenarios in DIALECT_SCENARIOS.items()
    for scenario in scenarios
    for stream in (False, True)
    if not (stream and (dialect, scenario) in NOT_STREAMED)
]


@pytest.mark.parametrize(("dialect", "scenario", "stream"), CASES)
def test_relay_answers_as_the_upstream_does(
    gateway: str, upstream: str, dialect: str, scenario: str, stream: bool
) -> None:
    params = scenario_params(dialect, scenario)
    relayed = CLIENTS[dialect](gateway, "relay", stream, **params)
    direct = CLIENTS[dialect](upstream, "relay", stream, **params)
    check_scenario(scenario, params, direct)
    assert relayed == direct
    if stream and dialect in ("openai", "ovms", "aleph_alpha"):
        assert relayed["usage"] is not None  # asked for with stream_options.include_usage


def test_stream_and_whole_answer_agree(gateway: str) -> None:
    params = {"n": 2, "logprobs": True, "top_logprobs": 2, "max_tokens": 6}
    whole = openai_sdk_chat(gateway, "/v1", "relay", False, **params)
    streamed = openai_sdk_chat(gateway, "/v1", "relay", True, **params)
    assert streamed == whole


# ----- errors in each dialect's own shape -------------------------------------------------------


def dialect_error(dialect: str, response: httpx.Response) -> str:
    """Check the error body has the dialect's documented shape; return its message."""
    body, dialect_reader = response.json(), reader(dialect)
    assert dialect_reader.error_shaped(body, response.status_code, response.headers), body
    return dialect_reader.error_message(body)


def post(base: str, dialect: str, body: dict[str, Any]) -> httpx.Response:
    return http_client().post(base + PATHS[dialect], json=body)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_upstream_refusal_reaches_the_client_in_its_dialect(gateway: str, dialect: str, stream: bool) -> None:
    """The upstream (extra-parameters: error) answers 400 to a parameter it does not know."""
    body = {**reader(dialect).body(PROMPT, "relay-open", frobnicate=3), "stream": stream}
    response = post(gateway, dialect, body)
    assert response.status_code == 400
    message = dialect_error(dialect, response)
    assert "frobnicate" in message and "not allowed" in message


def test_dialect_options_are_forwarded(gateway: str) -> None:
    """OVMS's top_k reaches the upstream: a strict upstream names it, a lenient one takes it."""
    body = {"messages": MESSAGES, "top_k": 5, "repetition_penalty": 1.1}
    refused = post(gateway, "ovms", {"model": "relay-open", **body})
    assert refused.status_code == 400
    assert "top_k" in dialect_error("ovms", refused)
    taken = post(gateway, "ovms", {"model": "relay-lenient", **body})
    assert taken.status_code == 200, taken.text
    content = taken.json()["choices"][0]["message"]["content"]
    assert f"You said: {PROMPT}" in content
    # the echo upstream reports the pass-through parameters it received
    assert '"repetition_penalty":1.1,"top_k":5' in content


STATUS_CASES = [
    # stub behaviour, status the client gets, text its message must hold
    ("status-400", 400, "stub upstream says 400"),
    ("status-401", 502, "refused the gateway's credentials"),
    ("status-403", 502, "refused the gateway's credentials"),
    ("status-404", 404, "stub upstream says 404"),
    ("status-422", 422, "stub upstream says 422"),
    ("status-429", 429, "is busy or its limits for the gateway are used up"),  # its words are about us
    # a failing server's words stay in the log: the client gets the gateway's
    ("status-500", 502, "The upstream model server failed on this request (HTTP 500)"),
    ("status-503", 503, "The upstream model server is busy (HTTP 503)"),
    ("malformed", 502, "malformed"),
]


@pytest.mark.parametrize(("behaviour", "status", "text"), STATUS_CASES)
@pytest.mark.parametrize("dialect", ["openai", "azure", "lmi"])
def test_upstream_status_becomes_gateway_error(
    gateway: str, dialect: str, behaviour: str, status: int, text: str
) -> None:
    response = post(gateway, dialect, {"model": f"stub-{behaviour}", "messages": MESSAGES})
    assert response.status_code == status
    message = dialect_error(dialect, response)
    assert text in message
    assert "stub upstream says 5" not in message
    assert SECRET not in response.text  # the gateway's upstream key never reaches a client
    if status == 429:
        assert response.headers["retry-after"] == "7"
    if behaviour in ("status-400", "status-422") and dialect == "openai":
        assert response.json()["error"]["param"] == "temperature"


def test_a_streamed_event_that_is_not_json_is_502_with_what_it_held(gateway: str) -> None:
    body = {"model": "stub-stream-malformed", "messages": MESSAGES, "stream": True}
    response = post(gateway, "openai", body)
    assert response.status_code == 502
    message = dialect_error("openai", response)
    assert "sent a malformed response" in message and '{"id": "x", "choices"' in message


@pytest.mark.parametrize("behaviour", sorted(RETRY_AFTERS))
def test_an_upstreams_retry_after_reaches_the_client_only_as_seconds(gateway: str, behaviour: str) -> None:
    """Delay-seconds (at most a day) or an HTTP-date turned into seconds; never `abc`, `-5` or markup."""
    response = post(gateway, "openai", {"model": f"stub-{behaviour}", "messages": MESSAGES})
    assert response.status_code == 429
    assert response.headers.get("retry-after") == RETRY_AFTERS[behaviour][1]


def test_an_upstream_quoting_the_gateways_key_is_relayed_without_it(gateway: str, log_dir: Path) -> None:
    response = post(gateway, "openai", {"model": "stub-quotes-key", "messages": MESSAGES})
    assert response.status_code == 400
    assert "may not use tenant" in response.json()["error"]["message"]  # the words still reach the client
    assert SECRET not in response.text
    assert not any(SECRET in log.read_text() for log in log_dir.glob("gateway-*.log"))


def test_unreachable_upstream_is_503(gateway: str) -> None:
    response = post(gateway, "openai", {"model": "unreachable", "messages": MESSAGES})
    assert response.status_code == 503
    assert "cannot be reached" in dialect_error("openai", response)


# ----- what the upstream receives ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_upstream_request_carries_every_parameter(gateway: str, stub: StubUpstream, stream: bool) -> None:
    marker = uuid.uuid4().hex
    body = {
        "model": "stub-capture",
        "messages": [{"role": "user", "content": marker}],
        "stream": stream,
        "max_tokens": 7,
        "stop": "END",
        "n": 2,
        "seed": 3,
        "temperature": 0.5,
        "top_p": 0.9,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "logit_bias": {"50256": -100},
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {"type": "json_object"},
        "tools": [TOOL],
        "tool_choice": "auto",
        "user": "u-1",
        "parallel_tool_calls": False,  # an OpenAI option: forwarded under its name
        "custom_knob": 1,  # an extra parameter the deployment lets through
    }
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ids = {"x-request-id": f"client-{marker}", "traceparent": traceparent, "tracestate": "vendor=1"}
    response = http_client().post(gateway + PATHS["openai"], json=body, headers=ids)
    assert response.status_code == 200, response.text
    sent = stub.connection_with(marker)
    assert sent.path == "/capture/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {SECRET}"
    assert sent.headers["x-tenant"] == "t1"
    # the trace context goes upstream with the request; the request id the upstream gets is the
    # gateway's own, a UUID (a client's id may be anything an upstream refuses)
    assert uuid.UUID(sent.headers["x-request-id"]).version == 4
    for name, value in ids.items():
        if name != "x-request-id":
            assert sent.headers[name] == value
    expected = {
        **{k: v for k, v in body.items() if k not in ("max_tokens", "stop", "stream")},
        "model": "stub-model",
        "max_completion_tokens": 7,
        "stop": ["END"],
    }
    if stream:
        expected |= {"stream": True, "stream_options": {"include_usage": True}}
    assert sent.body == expected
    if stream:
        lines = [line for line in response.text.splitlines() if line.startswith("data: {")]
        answer = fold_chunks([json.loads(line.removeprefix("data: ")) for line in lines])
    else:
        answer = fold_completion(response.json())
    assert [c["text"] for c in answer["choices"].values()] == ["ok", "ok"]
    if not stream:  # the upstream sent no usage: prompt as counted at admission, completion estimated
        prompt, completion, total = answer["usage"]
        assert prompt > 0 and (completion, total) == (2, prompt + 2)


def test_tool_call_fragments_are_joined(gateway: str) -> None:
    client = openai_client(gateway + "/v1")
    chunks = client.chat.completions.create(
        model="stub-fragments", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    answer = fold_chunks([c.model_dump() for c in chunks])
    assert answer["choices"] == {
        0: {
            "text": "Hello",
            "finish": "tool_calls",
            "logprobs": None,
            "tool_calls": [("call_a", "lookup", '{"q": "x"}'), ("call_b", "other", "{}")],
        }
    }
    # the upstream sent no usage: completion tokens are the chunks seen, prompt tokens as the
    # gateway counted them at admission (never 0: issue 25)
    prompt, completion, total = answer["usage"]
    assert prompt > 0 and (completion, total) == (FRAGMENTED_CHUNKS_SEEN, prompt + FRAGMENTED_CHUNKS_SEEN)


LMI_SCENARIOS = {
    "plain": {},
    "logprobs": {"logprobs": True, "top_logprobs": 2},
    "stop": {"stop": ["Lisbon"]},
    "n2": {"n": 2, "seed": 7},
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("scenario", list(LMI_SCENARIOS))
def test_an_lmi_upstream_is_relayed_as_it_answers(gateway: str, upstream: str, scenario: str, stream: bool):
    """LMI streams JSON lines (no data:, no [DONE]); a matched stop string stays stop_sequence."""
    params = LMI_SCENARIOS[scenario]
    relayed = raw_chat(gateway, "lmi", "relay-lmi", stream, **params)
    direct = raw_chat(upstream, "lmi", "relay-lmi", stream, **params)
    assert relayed["choices"] == direct["choices"]
    if not stream:
        assert relayed["usage"] == direct["usage"]
    finishes = {choice["finish"] for choice in relayed["choices"].values()}
    assert finishes == ({"stop_sequence"} if scenario == "stop" else {"eos_token"})


# ----- stalls and broken streams ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "stream"),
    [*((d, True) for d in DIALECTS), ("openai", False), ("lmi", False)],
)
def test_stalled_upstream_times_out(gateway: str, stub: StubUpstream, dialect: str, stream: bool) -> None:
    marker = uuid.uuid4().hex
    body = {**reader(dialect).body(marker, "stub-stall"), "stream": stream}
    response = post(gateway, dialect, body)
    assert response.status_code == 504
    assert "did not answer in time" in dialect_error(dialect, response)
    # the gateway hung up on the stalled upstream
    assert stub.connection_with(marker).closed.wait(10)


def test_stall_mid_stream_ends_with_an_error_event(gateway: str, stub: StubUpstream) -> None:
    marker = uuid.uuid4().hex
    client = openai_client(gateway + "/v1")
    stream = client.chat.completions.create(
        model="stub-midstream", messages=[{"role": "user", "content": marker}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError, match="did not answer in time"):
        for update in stream:
            received.append(update.choices[0].delta.content)
    assert "".join(received) == "partial"
    assert stub.connection_with(marker).closed.wait(10)


def test_stall_mid_stream_in_json_lines(gateway: str, stub: StubUpstream) -> None:
    marker = uuid.uuid4().hex
    body = {"model": "stub-midstream", "messages": [{"role": "user", "content": marker}], "stream": True}
    with http_client().stream("POST", gateway + PATHS["lmi"], json=body) as response:
        assert response.status_code == 200
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines[0]["choices"][0]["delta"]["content"] == "partial"
    assert lines[-1]["code"] == 504 and lines[-1]["type"] == "TimeoutException"
    assert stub.connection_with(marker).closed.wait(10)


def test_upstream_closing_mid_stream_is_an_error(gateway: str) -> None:
    client = openai_client(gateway + "/v1")
    stream = client.chat.completions.create(model="stub-truncated", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError, match="closed the stream before the answer was finished"):
        for _ in stream:
            pass


# ----- in process -------------------------------------------------------------------------------


def test_options_are_validated_and_the_key_stays_secret() -> None:
    with pytest.raises(pydantic.ValidationError, match="bogus"):
        OpenAICompatibleBackend(model="m", base_url="http://127.0.0.1:1/v1", bogus=1)
    with pytest.raises(pydantic.ValidationError, match="base_url"):
        OpenAICompatibleBackend(model="m", base_url="127.0.0.1:1/v1")
    backend = OpenAICompatibleBackend(model="m", base_url="http://h/v1/", api_key=SECRET)
    assert backend.url == "http://h/v1/chat/completions"
    assert SECRET not in repr(backend) and SECRET not in repr(backend.options)
    assert backend.capabilities.parameters["max_tokens"].target == "max_tokens"
    assert backend.capabilities.max_n == 128 and backend.capabilities.max_top_logprobs == 20


# finish_reason, stop_reason (vLLM) / matched_stop (SGLang), the answer's end → canonical reason
FINISH_CASES = [
    ({"finish_reason": "stop"}, "answer", [], "stop"),
    ({"finish_reason": "stop", "stop_reason": "END"}, "answer", ["END"], "stop_sequence"),
    ({"finish_reason": "stop", "stop_reason": 128001}, "answer", ["END"], "stop"),  # a stop token
    ({"finish_reason": "stop", "stop_reason": None}, "answer END", ["END"], "stop"),  # vLLM: EOS
    ({"finish_reason": "stop", "matched_stop": "END"}, "answer", ["END"], "stop_sequence"),
    ({"finish_reason": "stop"}, "answer END", ["X", "END"], "stop_sequence"),  # the match kept
    ({"finish_reason": "stop"}, "answer", ["END"], "stop"),  # cut and not named: cannot tell
    ({"finish_reason": "stop_sequence"}, "answer", [], "stop_sequence"),  # LMI, TGI
    ({"finish_reason": "eos_token"}, "answer END", ["END"], "stop"),  # LMI said so
    ({"finish_reason": "length"}, "answer END", ["END"], "length"),
    ({"finish_reason": "tool_calls"}, "", [], "tool_calls"),
    ({"finish_reason": "function_call"}, "", [], "tool_calls"),
]


@pytest.mark.parametrize(("choice", "text", "stops", "expected"), FINISH_CASES)
def test_finish_reason(choice: dict[str, Any], text: str, stops: list[str], expected: str) -> None:
    assert finish_reason(choice, text, stops) == expected


@pytest.mark.parametrize(
    ("choice", "text", "stops", "expected"),
    [
        ({"stop_reason": "END"}, "answer", ["END", "STOP"], "END"),  # vLLM names it
        ({"matched_stop": "STOP"}, "answer", ["END", "STOP"], "STOP"),  # SGLang names it
        ({}, "answer. END", ["END", ". END"], ". END"),  # kept in the text: the longest ending
        ({}, "answer", ["END"], "END"),  # cut, and the request's only one
        ({}, "answer", ["END", "STOP"], None),  # cut, one of several: cannot be told
    ],
)
def test_the_stop_string_that_matched(
    choice: dict[str, Any], text: str, stops: list[str], expected: Any
) -> None:
    assert matched_stop(choice, text, stops) == expected


def test_a_streamed_match_is_found_across_chunks_and_lmi_token_ids_are_text() -> None:
    state = StreamState(1, ["STOP"])
    events = []
    for piece in ("say ", "ST", "OP"):
        events += state.feed({"choices": [{"index": 0, "delta": {"content": piece}}]})
    top = [{"token": 4711, "logprob": -0.5}]  # LMI's streamed top_logprobs may name a token id
    logprobs = [{"content": [{"token": "x", "logprob": -0.1, "top_logprobs": top}]}]
    events += state.feed(
        {"choices": [{"index": 0, "delta": {}, "logprobs": logprobs, "finish_reason": "stop"}]}
    )
    assert events[-1] == Finish(0, "stop_sequence", "STOP")  # which one, named
    assert events[-2].logprobs[0].top[0].token == "4711"


def test_an_lmi_error_line_ends_the_stream_as_an_error() -> None:
    with pytest.raises(BadGateway, match="boom"):
        StreamState(1).feed({"code": 424, "type": "ServiceUnavailableException", "message": "boom"})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("behaviour", ["refusing", "detailed"])
def test_nothing_the_upstream_said_is_lost(gateway: str, behaviour: str, stream: bool) -> None:
    """A refusal or text, its logprobs with their bytes (given, or null), the fingerprint, the
    tier and the usage details reach an OpenAI client as the upstream said them."""
    client = openai_client(f"{gateway}/v1")
    params: dict[str, Any] = {"model": f"stub-{behaviour}", "messages": MESSAGES, "logprobs": True,
                              "top_logprobs": 2}  # fmt: skip
    if stream:
        chunks = list(client.chat.completions.create(
            **params, stream=True, stream_options={"include_usage": True}))  # fmt: skip
        assert {c.system_fingerprint for c in chunks} == {"fp_stub"}
        assert {c.service_tier for c in chunks} == {"default"}
        deltas = [c.choices[0] for c in chunks if c.choices]
        part = "refusal" if behaviour == "refusing" else "content"
        said = "".join(getattr(d.delta, part) or "" for d in deltas)
        entries = [e for d in deltas if d.logprobs for e in getattr(d.logprobs, part) or ()]
        usage = chunks[-1].usage
        if behaviour == "refusing":
            assert all(not d.delta.content for d in deltas)
    else:
        answer = client.chat.completions.create(**params)
        assert (answer.system_fingerprint, answer.service_tier) == ("fp_stub", "default")
        message, logprobs = answer.choices[0].message, answer.choices[0].logprobs
        said = message.refusal if behaviour == "refusing" else message.content
        assert message.content is None if behaviour == "refusing" else message.refusal is None
        assert logprobs is not None
        entries = (logprobs.refusal if behaviour == "refusing" else logprobs.content) or []
        usage = answer.usage
    assert said == EVERYTHING_TEXT
    assert [(e.token, e.bytes) for e in entries] == [("No", [78, 111]), (", sorry", None)]
    assert [(t.token, t.bytes) for t in entries[0].top_logprobs] == [("No", [78, 111]), ("<|x|>", None)]
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (11, 2)
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 7
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 3


def test_informational_and_current_openai_fields_reach_the_upstream(gateway: str, stub: StubUpstream) -> None:
    """store, metadata and service_tier were dropped in silence (issue 26); OpenAI's current
    fields (openapi 2.3.0) go on too, under their own names."""
    marker = f"informational-{uuid.uuid4().hex}"
    forwarded = {
        "store": True,
        "metadata": {"run": marker},
        "service_tier": "flex",
        "prompt_cache_key": "cache-1",
        "prompt_cache_retention": "24h",
        "safety_identifier": "hashed-user",
        "verbosity": "low",
        "reasoning_effort": "minimal",
        "web_search_options": {"search_context_size": "low"},
    }
    body = {"model": "stub-capture", "messages": MESSAGES, **forwarded}
    response = http_client().post(gateway + PATHS["openai"], json=body)
    assert response.status_code == 200, response.text
    sent = stub.connection_with(marker).body
    assert {name: sent.get(name) for name in forwarded} == forwarded


def test_file_parts_and_custom_calls_in_the_history_reach_the_upstream(
    gateway: str, stub: StubUpstream
) -> None:
    """OpenAI's current document: a user's file part and an earlier custom tool call go on in the
    messages as they came (issue 26), never dropped."""
    marker = f"file-{uuid.uuid4().hex}"
    file_part = {"type": "file", "file": {"filename": "notes.txt", "file_data": "aGVsbG8="}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": marker}, file_part]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "custom", "custom": {"name": "sql", "input": "SELECT 1"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-abc"}}]},
    ]  # fmt: skip
    response = http_client().post(
        gateway + PATHS["openai"], json={"model": "stub-capture", "messages": messages}
    )
    assert response.status_code == 200, response.text
    assert stub.connection_with(marker).body["messages"] == messages


def test_a_call_given_both_as_tool_calls_and_as_function_call_is_one_call() -> None:
    """llama-cpp-python's server gave a forced call twice: in `tool_calls` and in the legacy
    `function_call`. One call comes back, with the server's id; `function_call` alone is a call."""
    backend = OpenAICompatibleBackend(model="m", base_url="http://h/v1")
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    message = {"role": "assistant", "content": None, "function_call": function}
    both = {**message, "tool_calls": [{"id": "call_7", "type": "function", "function": function}]}
    for said, call_id in ((both, "call_7"), (message, None)):
        body = {"choices": [{"index": 0, "message": said, "finish_reason": "tool_calls"}]}
        calls = [e for e in backend.completion_events(body, request, None) if isinstance(e, ToolCallDelta)]
        assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]
        assert call_id is None or calls[0].id == call_id


def burst_items(stub: StubUpstream, behaviour: str) -> tuple[list[Any], BaseException | None]:
    """The items the backend passes on for one of the stub's bursts (run in process), and what it
    raised after them, if anything."""
    items: list[Any] = []

    async def run() -> BaseException | None:
        backend = OpenAICompatibleBackend(model="m", base_url=f"{stub.url}/{behaviour}/v1")
        request = ChatRequest(model="m", messages=MESSAGES, stream=True)
        try:
            async for item in backend.generate(request):
                items.append(item)
        except BadGateway as error:
            return error
        finally:
            await backend.aclose()
        return None

    return items, asyncio.run(run())


def test_what_one_read_brings_goes_on_as_one_item(stub: StubUpstream) -> None:
    """A stream the upstream sent at once is read at once, and its events pass on as one item, in
    order: one pass of the relay for all of them (a fifth of a streamed request's instructions in
    front of nginx), not one pass each. The client still gets each event as its own chunk.

    The read brought the stream's end too ([DONE]), so the item ends with the usage: the relay
    writes the last text and the end in one write."""
    items, raised = burst_items(stub, "burst")
    assert raised is None
    assert len(items) == 1, items  # what the read brought, the stream's end with it
    said = list(items[0])
    texts = [event.text for event in said if hasattr(event, "text")]
    assert texts == ["Hel", "lo"]
    calls = [(e.id, e.name, e.arguments) for e in said if isinstance(e, ToolCallDelta)]
    assert calls == [("call_a", "lookup", '{"q": "x"}'), ("call_b", "other", "{}")]  # joined, in order
    assert said[-2] == Finish(0, "tool_calls", None)
    assert isinstance(said[-1], Usage) and said[-1].completion_tokens > 0  # estimated: none was sent


def test_what_came_before_a_failure_in_the_same_read_still_goes_on(stub: StubUpstream) -> None:
    """The upstream's error comes in the read that brought text before it: the text passes on
    first, then the error (as when each event was an item of its own)."""
    items, raised = burst_items(stub, "burst-failing")
    assert isinstance(raised, BadGateway) and "overloaded" in str(raised)
    assert len(items) == 1, items
    assert [event.text for event in items[0]] == ["Hel", "lo"]
