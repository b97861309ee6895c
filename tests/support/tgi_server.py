"""A Text Generation Inference stand-in for tests: TGI's routes on loopback, deterministic, and
checked against TGI's own OpenAPI document, `tgi-openapi.json` among the vendor documents
(tests/conftest.py finds them: `$CHATGATE_REFSPECS`, or `refspecs/` as scripts/fetch-refspecs
writes it). Without that document the stand-in still serves, unchecked.

With the document, every request body it receives and every response body and stream event it
sends is validated against the refspec's schemas; a mismatch is recorded in `failures` (the
tests assert there are none), so the stand-in cannot drift from what real TGI accepts and
sends. Where the refspec leaves behaviour open it follows TGI 3.x's router code: `POST /`
streams with `data:` lines and no `[DONE]`, errors inside a stream are `{error, error_type}`
events, the Messages API applies the chat template itself and streams a tool call as `{` plus
argument fragments without a finish reason, and generated text keeps a matched stop string.

The "model" answers `You said: <last user text>` (plus ` (seed N)` when a seed is given), one
word or punctuation mark per token, then an end-of-sequence token. A JSON grammar makes it answer
a JSON value matching the schema. Directives in the last user message make it misbehave:

    tgi:fail=422|424|429|503   answer that HTTP error (TGI's error body) instead of generating
    tgi:event=424@N            stream N tokens, then a generation-error event
    tgi:drop=N                 stream N tokens, then drop the connection
    tgi:cut=N                  stream N tokens, then end the stream cleanly without a finish
                               (what TGI 2.x's Messages API did when generation failed)
    tgi:sleep=S                wait S seconds before answering
    tgi:pace=S                 wait S seconds before each streamed token
    tgi:done=nospace           end the Messages API stream with `data:[DONE]` (valid SSE, which
                               huggingface_hub 2.4 fails to parse: its issue #4536)
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from jsonschema import Draft4Validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from backends.echo import instance_for

REFSPEC_FILE = "tgi-openapi.json"
MODEL_ID = "chatgate/tiny-tgi-stand-in"
VERSION = "3.3.6"
BOS, EOS = "<s>", "</s>"
SPECIAL_IDS = {BOS: 1, EOS: 2}
TOKEN = re.compile(r"<s>|</s>|<\|\w+\|>|\s*\w+|\s*[^\w\s]|\s+")
DIRECTIVE = re.compile(r"tgi:(fail|event|drop|cut|sleep|pace|done)=([\w.@]+)")
MAX_STOP_SEQUENCES = 4
MAX_TOP_N_TOKENS = 5
ERRORS = {
    422: ("Input validation error: `temperature` must be strictly positive", "validation"),
    424: ("Request failed during generation: Server error: CUDA out of memory", "generation"),
    429: ("Model is overloaded", "overloaded"),
    503: ("unhealthy", "healthcheck"),
}


# ----- the refspec as validators --------------------------------------------------------------


def with_nullable(schema: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` → JSON Schema's "or null" (recursively)."""
    if isinstance(schema, list):
        return [with_nullable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: with_nullable(value) for key, value in schema.items()}
    if converted.pop("nullable", False):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


class RefSpec:
    """Validators for the refspec's component schemas, read with OpenAPI 3.0 (Draft 4) semantics."""

    def __init__(self, path: Path) -> None:
        document = json.loads(path.read_text(encoding="utf-8"))
        self.components = with_nullable(document["components"])
        self.validators: dict[str, Draft4Validator] = {}

    def errors(self, schema_name: str, instance: Any) -> list[str]:
        validator = self.validators.get(schema_name)
        if validator is None:
            if schema_name.startswith("["):  # a JSON array of the named schema (POST / answers one)
                schema = {"type": "array", "items": {"$ref": f"#/components/schemas/{schema_name[1:-1]}"}}
            else:
                schema = {"$ref": f"#/components/schemas/{schema_name}"}
            validator = Draft4Validator({**schema, "components": self.components})
            self.validators[schema_name] = validator
        return [
            f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in validator.iter_errors(instance)
        ]


# ----- the "model" ----------------------------------------------------------------------------


def tokenize(text: str) -> list[tuple[str, int, int]]:
    """(text, start, stop) pieces; joining the texts gives back `text`."""
    return [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(text)]


def token_id(text: str) -> int:
    return SPECIAL_IDS.get(text, 100 + zlib.crc32(text.encode()) % 30000)


def token_logprob(text: str) -> float:
    return -round(0.01 + (zlib.crc32(text.encode()) % 1000) / 1000, 3)


def token_body(text: str, special: bool = False) -> dict[str, Any]:
    return {"id": token_id(text), "text": text, "logprob": token_logprob(text), "special": special}


def top_tokens(text: str, count: int) -> list[dict[str, Any]]:
    """The chosen token first, then made-up alternatives, less likely each."""
    tops = [token_body(text)]
    for rank in range(1, count):
        alternative = token_body(f"{text.strip() or '_'}~{rank}")
        alternative["logprob"] = round(tops[0]["logprob"] - 0.5 * rank, 3)
        tops.append(alternative)
    return tops[:count]


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if part.get("type") == "text")
    return content or ""


def chat_template(messages: list[dict[str, Any]]) -> str:
    """The stand-in's chat template: BOS, then `<|role|>\\ntext</s>\\n` per message."""
    turns = []
    for message in messages:
        text = message_text(message)
        if message.get("tool_calls"):
            text = json.dumps([call["function"] for call in message["tool_calls"]])
        turns.append(f"<|{message['role']}|>\n{text}{EOS}\n")
    return BOS + "".join(turns) + "<|assistant|>\n"


def last_user_text_of_prompt(prompt: str) -> str:
    """The generate API gets a templated prompt: find the last user turn in it."""
    _, _, tail = prompt.rpartition("<|user|>\n")
    return tail.split(EOS, 1)[0]


@dataclass(slots=True)
class Generation:
    """What TGI's router knows after generating: tokens, the finish and the counts."""

    tokens: list[dict[str, Any]]
    finish_reason: str
    input_length: int
    seed: int | None
    top_n_tokens: int

    @property
    def text(self) -> str:
        return "".join(t["text"] for t in self.tokens if not t["special"])


def generate(
    heard: str, params: dict[str, Any], input_length: int, grammar: dict[str, Any] | None = None
) -> Generation:
    """Decode token by token, checking EOS, stop strings (kept in the text) and max_new_tokens."""
    if grammar is not None and grammar.get("type") == "json":
        schema = grammar["value"]
        schema = json.loads(schema) if isinstance(schema, str) else schema
        reply = json.dumps(instance_for(schema, heard))
    else:
        reply = f"You said: {heard}"
        if params.get("seed") is not None:
            reply += f" (seed {params['seed']})"
    pieces = [text for text, _, _ in tokenize(reply)] + [EOS]
    stops = params.get("stop") or []
    max_new_tokens = params.get("max_new_tokens")
    tokens: list[dict[str, Any]] = []
    reason = "eos_token"
    for piece in pieces:  # the order of TGI's StoppingCriteria: length, then EOS, then stop strings
        tokens.append(token_body(piece, special=piece == EOS))
        text = "".join(t["text"] for t in tokens if not t["special"])
        if max_new_tokens is not None and len(tokens) >= max_new_tokens:
            reason = "length"
            break
        if piece == EOS:
            reason = "eos_token"
            break
        if any(text.endswith(stop) for stop in stops):
            reason = "stop_sequence"
            break
    return Generation(tokens, reason, input_length, params.get("seed"), params.get("top_n_tokens") or 0)


def validation_error(params: dict[str, Any], chat: bool) -> str | None:
    """TGI's own parameter checks (router/src/validation.rs), with its messages."""
    temperature = params.get("temperature")
    if temperature is not None and temperature <= 0 and not (chat and temperature == 0):
        return "`temperature` must be strictly positive"
    top_p = params.get("top_p")
    if top_p is not None and not 0 < top_p < 1:
        return "`top_p` must be > 0.0 and < 1.0"
    typical_p = params.get("typical_p")
    if typical_p is not None and not 0 < typical_p < 1:
        return "`typical_p` must be > 0.0 and < 1.0"
    top_k = params.get("top_k")
    if top_k is not None and top_k <= 0:
        return "`top_k` must be strictly positive"
    if (params.get("repetition_penalty") or 1) <= 0:
        return "`repetition_penalty` must be strictly positive"
    if not -2 <= (params.get("frequency_penalty") or 0) <= 2:
        return "`frequency_penalty` must be >= -2.0 and <= 2.0"
    if params.get("max_new_tokens") == 0:
        return "`max_new_tokens` must be strictly positive"
    stops = params.get("stop") or []
    if len(stops) > MAX_STOP_SEQUENCES:
        return f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(stops)}"
    top_n = params.get("top_n_tokens") or 0
    if top_n > MAX_TOP_N_TOKENS:
        return f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {top_n}"
    return None


def directives(text: str) -> dict[str, str]:
    return {kind: value for kind, value in DIRECTIVE.findall(text)}


def chosen_tool(body: dict[str, Any], heard: str) -> dict[str, Any] | None:
    """The tool the "model" calls: a forced one, else the first whose name the user said."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        wanted = choice["function"]["name"]
        return next((t for t in tools if t["function"]["name"] == wanted), None)
    if choice == "required":
        return tools[0]
    return next((t for t in tools if t["function"]["name"] in heard), None)


# ----- the server -----------------------------------------------------------------------------


class DroppedConnection(Exception):
    """Raised inside a stream to make uvicorn drop the connection mid-response."""


@dataclass
class TGIStandIn:
    spec: RefSpec | None = None  # TGI's document; None: nothing is checked
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    url: str = ""

    def take_requests(self) -> list[tuple[str, dict[str, Any]]]:
        taken, self.requests[:] = list(self.requests), []
        return taken

    # ----- checking what goes in and out ---------------------------------------------------

    def errors(self, schema: str, instance: Any) -> list[str]:
        return [] if self.spec is None else self.spec.errors(schema, instance)

    def check(self, where: str, schema: str, instance: Any) -> None:
        for error in self.errors(schema, instance):
            self.failures.append(f"{where} does not match {schema}: {error}")

    def json(self, where: str, schema: str, body: Any, status: int = 200) -> JSONResponse:
        self.check(where, schema, body)
        return JSONResponse(body, status_code=status)

    def error(self, where: str, status: int, message: str, error_type: str) -> JSONResponse:
        return self.json(where, "ErrorResponse", {"error": message, "error_type": error_type}, status)

    async def read(self, request: Request, schema: str) -> dict[str, Any] | JSONResponse:
        body = await request.json()
        where = f"request to {request.url.path}"
        self.requests.append((request.url.path, body))
        problems = self.errors(schema, body)
        if problems:
            self.failures += [f"{where} does not match {schema}: {p}" for p in problems]
            return self.error(where, 422, f"Failed to deserialize the JSON body: {problems[0]}", "validation")
        return body

    def sse(self, where: str, schema: str, events: AsyncIterator[dict[str, Any] | str]) -> Response:
        async def frames() -> AsyncIterator[bytes]:
            finished = False
            try:
                async for event in events:
                    if isinstance(event, str):  # TGI >= 2.2 ends the Messages API stream with "data: [DONE]"
                        yield f"data: {event}\n\n".encode() if event == "[DONE]" else event.encode()
                        continue
                    self.check(f"{where} event", "ErrorResponse" if "error" in event else schema, event)
                    yield f"data:{json.dumps(event)}\n\n".encode()
                finished = True
            finally:
                if not finished:
                    self.abandoned.append(where)  # the client went away (or a drop was asked for)

        return StreamingResponse(frames(), media_type="text/event-stream")

    # ----- routes ---------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def info(self, request: Request) -> JSONResponse:
        body = {
            "model_id": MODEL_ID,
            "model_sha": None,
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": 128,
            "max_best_of": 2,
            "max_stop_sequences": MAX_STOP_SEQUENCES,
            "max_input_tokens": 4095,
            "max_total_tokens": 4096,
            "validation_workers": 2,
            "max_client_batch_size": 4,
            "router": "text-generation-router",
            "version": VERSION,
            "sha": None,
            "docker_label": None,
        }
        return self.json("/info", "Info", body)

    async def tokenize(self, request: Request) -> JSONResponse:
        body = await self.read(request, "GenerateRequest")
        if isinstance(body, JSONResponse):
            return body
        tokens = [{"id": 1, "text": "", "start": 0, "stop": 0}]  # the BOS the tokenizer adds
        tokens += [
            {"id": token_id(t), "text": t, "start": a, "stop": b} for t, a, b in tokenize(body["inputs"])
        ]
        return self.json("/tokenize", "TokenizeResponse", tokens)

    async def chat_tokenize(self, request: Request) -> JSONResponse:
        body = await self.read(request, "ChatRequest")
        if isinstance(body, JSONResponse):
            return body
        text = chat_template(body["messages"])
        tokens = [{"id": token_id(t), "text": t, "start": a, "stop": b} for t, a, b in tokenize(text)]
        body = {"tokenize_response": tokens, "templated_text": text}
        return self.json("/chat_tokenize", "ChatTokenizeResponse", body)

    async def compat_generate(self, request: Request) -> Response:
        """POST / — what huggingface_hub's text_generation calls (stream or not)."""
        body = await self.read(request, "CompatGenerateRequest")
        if isinstance(body, JSONResponse):
            return body
        return await self.generate_api(body, stream=bool(body.get("stream")), compat=True)

    async def generate_route(self, request: Request) -> Response:
        body = await self.read(request, "GenerateRequest")
        if isinstance(body, JSONResponse):
            return body
        return await self.generate_api(body, stream=request.url.path.endswith("_stream"), compat=False)

    async def generate_api(self, body: dict[str, Any], stream: bool, compat: bool) -> Response:
        params = body.get("parameters") or {}
        where = "/generate_stream" if stream else "/generate"
        heard = last_user_text_of_prompt(body["inputs"])
        wanted = directives(heard)
        if "sleep" in wanted:
            await asyncio.sleep(float(wanted["sleep"]))
        failure = self.refusal(where, wanted, validation_error(params, chat=False))
        if failure is not None:
            return failure
        input_length = 1 + len(tokenize(body["inputs"]))  # the tokenizer adds a BOS
        generation = generate(heard, params, input_length, params.get("grammar"))
        if stream:
            return self.sse(where, "StreamResponse", self.stream_tokens(generation, params, wanted))
        details = {
            "finish_reason": generation.finish_reason,
            "generated_tokens": len(generation.tokens),
            "seed": generation.seed,
            "prefill": [],
            "tokens": generation.tokens,
        }
        if generation.top_n_tokens:
            details["top_tokens"] = [
                top_tokens(t["text"], generation.top_n_tokens) for t in generation.tokens
            ]
        response = {"generated_text": generation.text}
        if params.get("details"):
            response["details"] = details
        if compat:
            return self.json("/", "[GenerateResponse]", [response])
        return self.json(where, "GenerateResponse", response)

    async def stream_tokens(
        self, generation: Generation, params: dict[str, Any], wanted: dict[str, str]
    ) -> AsyncIterator[dict[str, Any]]:
        for index, token in enumerate(generation.tokens, start=1):
            failure = await self.misbehave(index - 1, wanted)
            if failure is not None:
                if failure:
                    yield failure
                return
            event: dict[str, Any] = {"index": index, "token": token, "generated_text": None, "details": None}
            if generation.top_n_tokens:
                event["top_tokens"] = top_tokens(token["text"], generation.top_n_tokens)
            if index == len(generation.tokens):
                event["generated_text"] = generation.text
                if params.get("details"):
                    event["details"] = {
                        "finish_reason": generation.finish_reason,
                        "generated_tokens": len(generation.tokens),
                        "seed": generation.seed,
                        "input_length": generation.input_length,
                    }
            yield event

    async def chat_completions(self, request: Request) -> Response:
        body = await self.read(request, "ChatRequest")
        if isinstance(body, JSONResponse):
            return body
        where = "/v1/chat/completions"
        users = [m for m in body["messages"] if m["role"] == "user"]
        heard = message_text(users[-1]) if users else ""
        wanted = directives(heard)
        if "sleep" in wanted:
            await asyncio.sleep(float(wanted["sleep"]))
        params = {
            "max_new_tokens": body.get("max_tokens"),
            "stop": body.get("stop"),
            "seed": body.get("seed"),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "frequency_penalty": body.get("frequency_penalty"),
            "top_n_tokens": body.get("top_logprobs") if body.get("logprobs") else None,
        }
        failure = self.refusal(where, wanted, validation_error(params, chat=True))
        if failure is not None:
            return failure
        input_length = len(tokenize(chat_template(body["messages"])))
        tool = chosen_tool(body, heard)
        if tool is not None:
            arguments = instance_for(tool["function"].get("arguments") or {}, heard)
            generation = self.tool_generation(tool["function"]["name"], arguments, input_length)
        else:
            generation = generate(heard, params, input_length, body.get("response_format"))
        logprobs = bool(body.get("logprobs"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if body.get("stream"):
            if tool is not None:
                events = self.tool_chunks(tool["function"]["name"], arguments, generation, include_usage)
            else:
                events = self.chat_chunks(generation, logprobs, include_usage, wanted)
            return self.sse(where, "ChatCompletionChunk", events)
        return self.json(
            where,
            "ChatCompletion",
            self.chat_completion(generation, logprobs, tool, arguments if tool else None),
        )

    @staticmethod
    def tool_generation(name: str, arguments: Any, input_length: int) -> Generation:
        """TGI's tool grammar output: `{"function": {"_name": …, <arguments>}}`, then EOS."""
        text = json.dumps({"function": {"_name": name, **arguments}})
        tokens = [token_body(t) for t, _, _ in tokenize(text)] + [token_body(EOS, special=True)]
        return Generation(tokens, "eos_token", input_length, None, 0)

    def refusal(self, where: str, wanted: dict[str, str], invalid: str | None) -> JSONResponse | None:
        if invalid is not None:
            return self.error(where, 422, f"Input validation error: {invalid}", "validation")
        if "fail" in wanted:
            status = int(wanted["fail"])
            message, error_type = ERRORS[status]
            return self.error(where, status, message, error_type)
        return None

    async def misbehave(self, position: int, wanted: dict[str, str]) -> dict[str, str] | None:
        """Before the token at `position`: drop the connection, end the stream, or return an error
        event, as asked (an empty dict means: end here)."""
        if "pace" in wanted:
            await asyncio.sleep(float(wanted["pace"]))
        if "drop" in wanted and position == int(wanted["drop"]):
            raise DroppedConnection("dropping the connection mid-stream, as asked")
        if "cut" in wanted and position == int(wanted["cut"]):
            return {}
        if "event" in wanted:
            status, _, after = wanted["event"].partition("@")
            if position == int(after or 0):
                message, error_type = ERRORS[int(status)]
                return {"error": message, "error_type": error_type}
        return None

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
        return {
            "id": "",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODEL_ID,
            "system_fingerprint": f"{VERSION}-native",
            "choices": choices,
            "usage": usage,
        }

    @staticmethod
    def usage(generation: Generation) -> dict[str, int]:
        completion = len(generation.tokens)
        return {
            "prompt_tokens": generation.input_length,
            "completion_tokens": completion,
            "total_tokens": generation.input_length + completion,
        }

    @staticmethod
    def logprobs(token: dict[str, Any], top: int) -> dict[str, Any]:
        tops = (
            [{"token": t["text"], "logprob": t["logprob"]} for t in top_tokens(token["text"], top)]
            if top
            else []
        )
        return {"content": [{"token": token["text"], "logprob": token["logprob"], "top_logprobs": tops}]}

    async def chat_chunks(
        self, generation: Generation, logprobs: bool, include_usage: bool, wanted: dict[str, str]
    ) -> AsyncIterator[dict[str, Any] | str]:
        last = len(generation.tokens) - 1
        for position, token in enumerate(generation.tokens):
            failure = await self.misbehave(position, wanted)
            if failure == {}:
                break
            if failure is not None:
                yield failure
                return
            choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": "" if token["special"] else token["text"]},
                "logprobs": self.logprobs(token, generation.top_n_tokens) if logprobs else None,
                "finish_reason": (
                    "stop" if generation.finish_reason == "eos_token" else generation.finish_reason
                )
                if position == last
                else None,
            }
            yield self.chunk([choice])
        if include_usage:
            yield self.chunk([], self.usage(generation))
        yield "data:[DONE]\n\n" if wanted.get("done") == "nospace" else "[DONE]"

    async def tool_chunks(
        self, name: str, arguments: Any, generation: Generation, include_usage: bool
    ) -> AsyncIterator[dict[str, Any] | str]:
        """TGI 3.x (router/src/chat.rs): the name with `{`, then argument fragments; the EOS that
        ends the call is swallowed, so no chunk carries a finish reason."""
        fragments = ["{"] + [text for text, _, _ in tokenize(json.dumps(arguments)[1:])]
        for position, fragment in enumerate(fragments):
            call = {
                "index": 0,
                "id": "",
                "type": "function",
                "function": {"name": name if position == 0 else None, "arguments": fragment},
            }
            delta = {"role": "assistant", "tool_calls": [call]}
            yield self.chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])
        if include_usage:
            yield self.chunk([], self.usage(generation))
        yield "[DONE]"

    def chat_completion(
        self, generation: Generation, logprobs: bool, tool: dict[str, Any] | None, arguments: Any
    ) -> dict[str, Any]:
        if tool is not None:
            call = {
                "id": "0",
                "type": "function",
                "function": {"name": tool["function"]["name"], "arguments": arguments},
            }
            message: dict[str, Any] = {"role": "assistant", "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": generation.text}
        content = [self.logprobs(t, generation.top_n_tokens)["content"][0] for t in generation.tokens]
        choice = {
            "index": 0,
            "message": message,
            "logprobs": {"content": content} if logprobs else None,
            "finish_reason": "stop" if generation.finish_reason == "eos_token" else generation.finish_reason,
        }
        body = self.chunk([choice], self.usage(generation))
        body["object"] = "chat.completion"
        return body

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/", self.compat_generate, methods=["POST"]),
                Route("/generate", self.generate_route, methods=["POST"]),
                Route("/generate_stream", self.generate_route, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/chat_tokenize", self.chat_tokenize, methods=["POST"]),
                Route("/info", self.info, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
            ]
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_tgi(refspecs: Path | None) -> Iterator[TGIStandIn]:
    """The stand-in served by uvicorn on a free loopback port, in a thread of this process,
    checked against TGI's document in the `refspecs` folder (unchecked when None)."""
    stand_in = TGIStandIn(spec=RefSpec(refspecs / REFSPEC_FILE) if refspecs is not None else None)
    port = free_port()
    config = uvicorn.Config(
        stand_in.app(), host="127.0.0.1", port=port, log_level="critical", lifespan="off", loop="asyncio"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="tgi-stand-in", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the TGI stand-in did not start")
        time.sleep(0.02)
    stand_in.url = f"http://127.0.0.1:{port}"
    try:
        yield stand_in
    finally:
        server.should_exit = True
        thread.join(timeout=10)
