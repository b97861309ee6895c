"""One client per dialect for tests that send the same request to every dialect and compare what
comes back: each sends an OpenAI-shaped request in its dialect's form, and reads the answer with
the dialect's own SDK (openai, azure-ai-inference, aleph-alpha-client) or, where there is none
(LMI, OVMS), holds it to the dialect's document in openapi/ first. Every answer comes back as the
same small `Answer`, in the dialect's own words (its finish reasons)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import httpx
import jsonschema_rs
import openai
import orjson
from aleph_alpha_client.chat import (
    ChatResponse,
    ChatStreamChunk,
    FinishReason,
    Usage,
    stream_chat_item_from_json,
)
from azure.ai.inference import ChatCompletionsClient
from azure.ai.inference.models import StreamingChatCompletionsUpdate
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError

from tests.support.dialect_routes import main_routes
from tests.support.documents import document, response_errors

TIMEOUT = 60.0  # every request is bounded: a hang fails the test instead of stalling it


@dataclass
class Choice:
    text: str = ""
    finish: str | None = None  # the dialect's word
    logprobs: list[tuple[str, float]] | None = None  # (token, logprob), when asked for
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments)


@dataclass
class Answer:
    choices: list[Choice]
    prompt_tokens: int | None = None  # None: the dialect's answer carries no usage
    completion_tokens: int | None = None

    @property
    def text(self) -> str:
        (choice,) = self.choices
        return choice.text

    @property
    def finish(self) -> str | None:
        (choice,) = self.choices
        return choice.finish


class DialectError(Exception):
    """An error answer: its status and body (already held to the dialect's document), or an error
    event in a stream that began with 200."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


@cache
def schema_validator(spec_file: str, schema: str) -> jsonschema_rs.Draft4Validator:
    """A validator for one of the document's component schemas, objects closed to fields it does
    not define (tests/support/documents.py)."""
    root = document(spec_file)
    return jsonschema_rs.Draft4Validator({"$ref": f"#/components/schemas/{schema}", **root})


def conform(spec_file: str, schema: str, body: Any) -> Any:
    errors = [
        f"{list(e.instance_path)}: {e.message}" for e in schema_validator(spec_file, schema).iter_errors(body)
    ]
    assert errors == [], f"{spec_file} {schema}: {errors}\n{body}"
    return body


def sse_payloads(response: httpx.Response) -> list[Any]:
    """The JSON payloads of a server-sent event stream; an error event raises DialectError."""
    payloads = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
    parsed = [orjson.loads(payload) for payload in payloads if payload != "[DONE]"]
    errors = [payload for payload in parsed if "error" in payload and "choices" not in payload]
    if errors:
        raise DialectError(response.status_code, errors[0])
    assert payloads[-1:] == ["[DONE]"], f"the stream does not end with [DONE]: {payloads[-2:]}"
    return parsed


def grown(choices: list[Choice], index: int) -> Choice:
    while len(choices) <= index:
        choices.append(Choice())
    return choices[index]


def openai_shaped_choices(raw_choices: list[dict[str, Any]]) -> list[Choice]:
    """Choices of a non-streamed OpenAI-shaped answer read as JSON (LMI, OVMS, Aleph Alpha's n)."""
    choices = []
    for choice in sorted(raw_choices, key=lambda c: c["index"]):
        message = choice["message"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, list):  # LMI wraps the object in a list
            logprobs = logprobs[0] if logprobs else None
        entries = (logprobs or {}).get("content")
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
        choices.append(
            Choice(
                message.get("content") or "",
                choice["finish_reason"],
                [(e["token"], e["logprob"]) for e in entries] if entries is not None else None,
                calls,
            )
        )
    return choices


def fold_chunks(chunks: list[dict[str, Any]]) -> Answer:
    """OpenAI-shaped stream chunks folded into an Answer (their dicts, as JSON or from an SDK)."""
    choices: list[Choice] = []
    answer = Answer(choices)
    calls: dict[tuple[int, int], list[str]] = {}
    for chunk in chunks:
        if chunk.get("usage"):
            answer.prompt_tokens = chunk["usage"]["prompt_tokens"]
            answer.completion_tokens = chunk["usage"]["completion_tokens"]
        for raw in chunk["choices"]:
            choice = grown(choices, raw["index"])
            delta = raw.get("delta") or {}
            choice.text += delta.get("content") or ""
            logprobs = raw.get("logprobs")
            if isinstance(logprobs, list):
                logprobs = logprobs[0] if logprobs else None
            if logprobs and logprobs.get("content") is not None:
                choice.logprobs = (choice.logprobs or []) + [
                    (e["token"], e["logprob"]) for e in logprobs["content"]
                ]
            for call in delta.get("tool_calls") or ():
                parts = calls.setdefault((raw["index"], call.get("index", 0)), ["", ""])
                parts[0] += call.get("function", {}).get("name") or ""
                parts[1] += call.get("function", {}).get("arguments") or ""
            choice.finish = raw.get("finish_reason") or choice.finish
    for (index, _), (name, arguments) in sorted(calls.items()):
        choices[index].tool_calls.append((name, arguments))
    return answer


class Dialect:
    """Sends `params` (OpenAI's names: max_tokens, stop, seed, n, logprobs, tools, …) to one
    dialect of a gateway and reads the answer."""

    name: str
    length = "length"  # its finish reason for max_tokens
    stop = "stop"  # for the end of the sequence
    tool_calls = "tool_calls"
    # what its document lets a client ask for (a test asks only for that)
    has_n = True
    has_seed = True
    has_logprobs = True  # with top_logprobs
    has_tools = True
    has_json_mode = True
    stream_usage = True  # whether its streams carry usage

    @property
    def route(self):
        return main_routes()[self.name]

    def complete(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        raise NotImplementedError

    def stream(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        raise NotImplementedError

    def error(self, response: httpx.Response) -> DialectError:
        """An error answer, held to the dialect's document for its status."""
        body = response.json()
        route = self.route
        problems = response_errors(route.document, route.doc_path, "post", response.status_code, body)
        assert problems == [], f"{self.name} {response.status_code} error breaks its document: {problems}"
        return DialectError(response.status_code, body)

    def post(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """The dialect's request sent raw; its JSON answer."""
        response = httpx.post(f"{url}{self.route.url}", json=body, headers=headers, timeout=TIMEOUT)
        if response.status_code != 200:
            raise self.error(response)
        return response.json()

    @contextmanager
    def post_stream(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> Iterator[httpx.Response]:
        """The dialect's streamed request sent raw; its 200 answer, not read yet."""
        with httpx.stream(
            "POST", f"{url}{self.route.url}", json=body, headers=headers, timeout=TIMEOUT
        ) as response:
            if response.status_code != 200:
                response.read()
                raise self.error(response)
            yield response


class OpenAIDialect(Dialect):
    name = "openai"

    def client(self, url: str, headers: dict[str, str]) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT, default_headers=headers
        )

    def complete(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        try:
            completion = self.client(url, headers).chat.completions.create(model=model, **params)
        except openai.APIStatusError as exc:
            raise self.error(exc.response) from None
        choices = [
            Choice(
                c.message.content or "",
                c.finish_reason,
                [(t.token, t.logprob) for t in c.logprobs.content]
                if c.logprobs and c.logprobs.content
                else None,
                [(t.function.name, t.function.arguments) for t in c.message.tool_calls or ()],
            )
            for c in completion.choices
        ]
        usage = completion.usage
        return Answer(choices, usage and usage.prompt_tokens, usage and usage.completion_tokens)

    def stream(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        params = {"stream_options": {"include_usage": True}, **params}
        try:
            chunks = self.client(url, headers).chat.completions.create(model=model, stream=True, **params)
            return fold_chunks([chunk.model_dump() for chunk in chunks])
        except openai.APIStatusError as exc:
            raise self.error(exc.response) from None


class AzureDialect(Dialect):
    name = "azure"
    has_n = False  # only as an extra parameter (`extra-parameters: pass-through`)
    has_logprobs = False

    def client(self, url: str) -> ChatCompletionsClient:
        return ChatCompletionsClient(
            endpoint=f"{url}/azure", credential=AzureKeyCredential("unused"), retry_total=0
        )

    def call(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        try:
            return self.client(url).complete(body=body, headers=headers, timeout=TIMEOUT)
        except HttpResponseError as exc:
            assert exc.response is not None
            response = httpx.Response(exc.response.status_code, content=exc.response.body())
            raise self.error(response) from None

    def complete(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        result = self.call(url, {"model": model, "messages": params.pop("messages"), **params}, headers)
        choices = [
            Choice(
                c.message.content or "",
                c.finish_reason,
                None,
                [(t.function.name, t.function.arguments) for t in c.message.tool_calls or ()],
            )
            for c in result.choices
        ]
        return Answer(choices, result.usage.prompt_tokens, result.usage.completion_tokens)

    def stream(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        body = {"model": model, "messages": params.pop("messages"), "stream": True, **params}
        updates: list[StreamingChatCompletionsUpdate] = list(self.call(url, body, headers))
        return fold_chunks([update.as_dict() for update in updates])


class AlephAlphaDialect(Dialect):
    """Sent raw (the client's ChatRequest has no stop, seed, n or logprobs); read by the client's
    own parsers."""

    name = "aleph_alpha"
    has_seed = has_tools = has_json_mode = False  # accepted and ignored, or refused (400)

    def complete(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        body = self.post(url, {"model": model, **params}, headers)
        choices = openai_shaped_choices(body["choices"])
        for choice, raw in zip(choices, sorted(body["choices"], key=lambda c: c["index"]), strict=True):
            parsed = ChatResponse.from_json({"choices": [raw]})  # the client reads the first choice
            assert (parsed.message.content or "", parsed.finish_reason.value) == (choice.text, choice.finish)
        return Answer(choices, body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])

    def stream(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, **params}
        with self.post_stream(url, body, headers) as response:
            payloads = sse_payloads(response)
        answer = Answer([Choice()])
        for payload in payloads:
            if any(choice["index"] > 0 for choice in payload["choices"]):  # n > 1: the client reads one
                return fold_chunks(payloads)
            item = stream_chat_item_from_json(payload)
            if isinstance(item, Usage):
                answer.prompt_tokens, answer.completion_tokens = item.prompt_tokens, item.completion_tokens
            elif isinstance(item, FinishReason):
                answer.choices[0].finish = item.value
            elif isinstance(item, ChatStreamChunk):
                answer.choices[0].text += item.content or ""
        folded = fold_chunks(payloads)  # the logprobs and tool calls the client's chunk leaves out
        answer.choices[0].logprobs = folded.choices[0].logprobs if folded.choices else None
        answer.choices[0].tool_calls = folded.choices[0].tool_calls if folded.choices else []
        return answer


class LMIDialect(Dialect):
    """No SDK: every answer and JSON line held to lmi.yaml."""

    name = "lmi"
    stop = "eos_token"
    has_tools = has_json_mode = False
    stream_usage = False  # LMI's JSON lines have no usage

    def complete(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        body = self.post(url, {"model": model, **params}, headers)
        conform("lmi.yaml", "ChatCompletion", body)
        choices = openai_shaped_choices(body["choices"])
        return Answer(choices, body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])

    def stream(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        with self.post_stream(url, {"model": model, "stream": True, **params}, headers) as response:
            assert response.headers["content-type"].startswith("application/jsonlines")
            lines = [orjson.loads(line) for line in response.iter_lines() if line.strip()]
        errors = [line for line in lines if "choices" not in line]
        if errors:
            raise DialectError(response.status_code, errors[0])
        for line in lines:
            conform("lmi.yaml", "ChatCompletionChunk", line)
        return fold_chunks(lines)


class OVMSDialect(Dialect):
    """No SDK: every answer and event held to ovms.yaml."""

    name = "ovms"
    tool_calls = "stop"  # OVMS documents only stop and length
    has_logprobs = has_json_mode = False  # OVMS refuses top_logprobs

    def complete(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        if params.get("n", 1) > 1:
            params = {"best_of": params["n"], **params}  # OVMS: n ≤ best_of
        body = self.post(url, {"model": model, **params}, headers)
        conform("ovms.yaml", "CreateChatCompletionResponse", body)
        choices = openai_shaped_choices(body["choices"])
        return Answer(choices, body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])

    def stream(self, url: str, model: str, params: dict[str, Any], headers: dict[str, str]) -> Answer:
        body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, **params}
        with self.post_stream(url, body, headers) as response:
            chunks = sse_payloads(response)
        for chunk in chunks:
            conform("ovms.yaml", "CreateChatCompletionStreamResponse", chunk)
        return fold_chunks(chunks)


DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect
    for dialect in (OpenAIDialect(), AzureDialect(), AlephAlphaDialect(), LMIDialect(), OVMSDialect())
}
