"""Hugging Face Text Generation Inference (TGI), through huggingface_hub's AsyncInferenceClient.

Which TGI route serves a request, and why:

* TGI's **Messages API** (`POST /v1/chat/completions`, `client.chat_completion`) is the default.
  There TGI renders the model's own chat template (special tokens exactly as the model expects),
  turns `tools` and `response_format` into its grammar, returns logprobs with top alternatives, and
  (TGI 3.x) reports `stop` (end of sequence), `stop_sequence` and `length` apart. Rendering a prompt
  here instead would guess the template; the Messages API loses nothing the canonical request has.
* Its **generate API** (`POST /` with `stream`, `client.text_generation`) is used only when a
  request sets a knob the Messages API lacks: `top_k`, `typical_p`, `repetition_penalty` (from the
  dialect, or passed through as an extra parameter, like `truncate` and `watermark`). The prompt is
  still TGI's own template, rendered by `POST /chat_tokenize`; the BOS token that the generate API's
  tokenizer would add a second time is removed first. Tokens come with `details` (finish reason and
  token counts) and `top_n_tokens` for logprobs.
* `use_messages_api: true` always uses the Messages API (generate-only knobs are then refused);
  `false` always uses the generate API (tools are then refused); `"auto"` picks per request as
  above. Tools together with a generate-only knob are refused (422 naming the knob).

Both routes are streamed upstream even when the client did not ask for a stream: the events are the
same either way, tokens are relayed as they arrive, and usage comes with the last token.

Mapping details that keep the client's meaning:

* TGI keeps a matched stop string in the output; the dialects here expect it cut. Only text that
  could begin a stop string is held back, and the match is cut at the end (unless the request says
  `include_stop_str_in_output: true`).
* `n > 1` runs n requests in parallel (TGI's `n` is unused); a seed s becomes s, s+1, … per choice.
* `temperature: 0` means greedy decoding (`do_sample: false`); `top_p: 1` and `typical_p: 1` mean
  "off" and are not sent (TGI requires them < 1); `top_k: 0` means "off" too.
* `presence_penalty`: TGI turns p into `repetition_penalty = p + 2` (TGI issue #1796), so p = 0
  would become a heavy penalty. Only 0 is accepted, and it is not sent.
* One pooled HTTP client per backend, and one short-lived AsyncInferenceClient per upstream call:
  the inference client keeps every stream it opens until it is closed, so a long-lived one grows
  without bound. The gateway host's own Hugging Face token is never sent unless configured here.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx2
import orjson
from huggingface_hub import AsyncInferenceClient
from huggingface_hub.errors import (
    GenerationError,
    HfHubHTTPError,
    IncompleteGenerationError,
    InferenceTimeoutError,
    OverloadedError,
    TextGenerationError,
)
from huggingface_hub.errors import ValidationError as TGIValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from backends.base import Capabilities, Param, unsupported
from gateway.core.canonical import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from gateway.core.errors import (
    BadGateway,
    GatewayError,
    GatewayTimeout,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    UnprocessableContent,
)
from gateway.core.options import ConfigError, describe, from_file

# The base model on TGI's Messages API ("tgi"), rather than a LoRA adapter of that name.
BASE_MODEL = "tgi"
# TGI's finish reasons (both APIs) → canonical ones.
FINISH_REASONS: dict[str, FinishReason] = {
    "eos_token": "stop",
    "stop": "stop",
    "stop_sequence": "stop_sequence",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
}
# Generate-API parameters the Messages API lacks: setting one routes the request to the generate API.
GENERATE_ONLY = ("top_k", "typical_p", "repetition_penalty", "truncate", "watermark")
# TGI's parameter names in its validation messages → the canonical names clients sent.
CANONICAL_NAMES = {
    "max_new_tokens": "max_tokens",
    "top_n_tokens": "top_logprobs",
    "grammar": "response_format",
    "inputs": "messages",
    "best_of": "n",
}
BACKTICKED = re.compile(r"`(\w+)`")
RETRY_AFTER_SECONDS = "1"


class TGIOptions(BaseModel):
    """A `tgi` deployment's `options:`; the limits mirror TGI's launcher settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="TGI's base URL, e.g. http://tgi:80")
    timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for a response or token.")
    token: SecretStr | None = Field(default=None, description="Bearer token TGI (or its proxy) wants.")
    token_file: Path | None = Field(default=None, description="A file holding the token instead.")
    use_messages_api: Literal["auto"] | bool = "auto"
    adapter_id: str | None = Field(default=None, description="A LoRA adapter TGI serves (default: base).")
    max_top_n_tokens: int = Field(default=5, ge=0, description="TGI --max-top-n-tokens")
    max_stop_sequences: int = Field(default=4, ge=0, description="TGI --max-stop-sequences")
    max_n: int = Field(default=8, ge=1, description="Most choices per request (parallel requests).")
    context_length: int = Field(default=4096, ge=1, description="TGI --max-total-tokens")
    modalities: frozenset[Literal["text", "image"]] = frozenset({"text"})
    max_connections: int = Field(default=100, ge=1)

    @model_validator(mode="before")
    @classmethod
    def token_from_file(cls, values: Any) -> Any:
        return from_file(values, "token")

    @field_validator("url")
    @classmethod
    def http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url.rstrip("/")


def parameter_table(options: TGIOptions) -> dict[str, Param]:
    """Canonical parameter → TGI's name for it and the range TGI accepts (readable as data)."""
    messages_api = options.use_messages_api is not False
    generate_api = options.use_messages_api is not True
    generate_only = "" if generate_api else "generate API only, and use_messages_api is true"
    tools_note = "Messages API" if messages_api else "Messages API only, and use_messages_api is false"
    return {
        "max_tokens": Param("max_new_tokens", 1, None, "max_tokens on the Messages API"),
        "stop": Param(
            "stop", 0, options.max_stop_sequences,
            "number of stop strings (TGI --max-stop-sequences); TGI keeps a matched stop string, "
            "the backend cuts it",
        ),
        "n": Param("n", 1, options.max_n, "parallel requests, seed s+i for choice i (TGI's n is unused)"),
        "seed": Param("seed", 0, 2**64 - 1),
        "temperature": Param("temperature", 0, None, "0 → greedy decoding (do_sample: false)"),
        "top_p": Param("top_p", 0, 1, "TGI needs 0 < top_p < 1; 1 means off and is not sent"),
        "frequency_penalty": Param("frequency_penalty", -2, 2),
        "presence_penalty": Param(
            "(not sent)", 0, 0,
            "TGI turns p into repetition_penalty p + 2 (TGI issue #1796): only 0 is accepted, not sent",
        ),
        "logit_bias": Param(None, note="TGI does not use logit_bias"),
        "logprobs": Param("logprobs", note="logprobs on the Messages API, details on the generate API"),
        "top_logprobs": Param("top_n_tokens", 0, options.max_top_n_tokens, "TGI --max-top-n-tokens"),
        "response_format": Param(
            "grammar", note="json_object and json_schema → {type: json, value: <JSON schema>}"
        ),
        "tools": Param("tools" if messages_api else None, note=tools_note),
        "tool_choice": Param("tool_choice" if messages_api else None, note=tools_note),
        "parallel_tool_calls": Param(
            "(not sent)", note="TGI makes at most one tool call per choice, which satisfies either value"
        ),
        "user": Param("(not sent)", note="TGI has no end-user field"),
        "include_stop_str_in_output": Param("(gateway)", note="false (default): the backend cuts it"),
        "top_k": Param("top_k" if generate_api else None, 0, None, generate_only or "0 means off"),
        "typical_p": Param("typical_p" if generate_api else None, 0, 1, generate_only or "1 means off"),
        "repetition_penalty": Param(
            "repetition_penalty" if generate_api else None, 0, None, generate_only or "must be > 0"
        ),
        **unsupported("TGI has no such parameter", "best_of", "ignore_eos", "length_penalty", "min_p"),
        **unsupported(
            "speculative and prompt-lookup decoding are TGI launcher settings, not request fields",
            "num_assistant_tokens", "assistant_confidence_threshold", "max_ngram_size",
        ),
        **unsupported(
            "TGI generates text only", "modalities", "audio", "prediction", "reasoning_effort"
        ),
    }  # fmt: skip


# ----- the canonical request → TGI's ----------------------------------------------------------


def tgi_content(content: Any) -> str | list[dict[str, Any]]:
    """OpenAI content → TGI's: a string, or text and image_url chunks when there are images."""
    if content is None or isinstance(content, str):
        return content or ""
    chunks: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "refusal"):
            chunks.append({"type": "text", "text": part.get(kind) or ""})
        elif kind == "image_url":
            chunks.append({"type": "image_url", "image_url": {"url": part["image_url"]["url"]}})
        else:
            raise UnprocessableContent(
                f"TGI takes text and image_url content parts, not '{kind}'.",
                param="messages",
                loc=["body", "messages"],
                value=kind,
            )
    if all(chunk["type"] == "text" for chunk in chunks):
        return "".join(chunk["text"] for chunk in chunks)
    return chunks


def tgi_arguments(arguments: Any) -> Any:
    """Tool-call arguments as TGI's templates want them: a JSON object when the string is one."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def tgi_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shaped messages → TGI's Message schema (content XOR tool_calls; system roles)."""
    converted = []
    for message in messages:
        role = {"developer": "system", "function": "tool"}.get(message["role"], message["role"])
        tgi: dict[str, Any] = {"role": role}
        calls = message.get("tool_calls")
        if not calls and message.get("function_call"):
            calls = [{"id": "", "type": "function", "function": message["function_call"]}]
        if calls:  # TGI takes content or tool_calls; the calls matter to what follows
            tgi["tool_calls"] = [
                {
                    "id": call.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": tgi_arguments(call["function"].get("arguments")),
                    },
                }
                for call in calls
            ]
        else:
            tgi["content"] = tgi_content(message.get("content"))
        if message.get("name"):
            tgi["name"] = message["name"]
        if message.get("tool_call_id"):
            tgi["tool_call_id"] = message["tool_call_id"]
        converted.append(tgi)
    return converted


def tgi_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tools → TGI's (its FunctionDefinition calls the JSON schema `arguments`)."""
    converted = []
    for tool in tools:
        function = tool.get("function") or {}
        definition = {
            "name": function["name"],
            "arguments": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            definition["description"] = function["description"]
        converted.append({"type": "function", "function": definition})
    return converted


def grammar_for(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """response_format → TGI's grammar `{type: json, value: schema}` (None for text)."""
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object":
        return {"type": "json", "value": {"type": "object"}}
    if kind == "json_schema":
        schema = ((response_format or {}).get("json_schema") or {}).get("schema")
        return {"type": "json", "value": schema or {"type": "object"}}
    return None


def generate_knobs(request: ChatRequest) -> dict[str, Any]:
    """The generate-only parameters this request sets, with "off" values (top_k 0, typical_p 1) left out."""
    knobs = {}
    for name in GENERATE_ONLY:
        value = request.options.get(name, request.extra.get(name))
        if value is None or (name == "top_k" and value == 0) or (name == "typical_p" and value >= 1):
            continue
        knobs[name] = value
    return knobs


@dataclass(slots=True)
class Plan:
    """How one request goes to TGI: which route, and the TGI-shaped pieces of the body."""

    route: Literal["messages", "generate"]
    messages: list[dict[str, Any]]
    grammar: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    knobs: dict[str, Any] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)


def plan_request(request: ChatRequest, options: TGIOptions) -> Plan:
    """Route and shape one request; the policy layer has already refused what the table lacks."""
    uses_tools = bool(request.tools) and request.tool_choice != "none"
    grammar = grammar_for(request.response_format)
    if uses_tools and grammar is not None:
        raise UnprocessableContent(
            "TGI takes response_format or tools in one request, not both.",
            param="response_format",
            loc=["body", "response_format"],
            value=request.response_format,
        )
    knobs = generate_knobs(request)
    extra = {k: v for k, v in request.extra.items() if k not in GENERATE_ONLY}
    mode = options.use_messages_api
    to_generate = mode is False or (mode == "auto" and bool(knobs))
    route: Literal["messages", "generate"] = "generate" if to_generate else "messages"
    if route == "messages" and knobs:
        name = next(iter(knobs))
        raise UnprocessableContent(
            f"'{name}' needs TGI's generate API, and this deployment uses its Messages API only.",
            param=name, loc=["body", name], value=knobs[name],
        )  # fmt: skip
    if route == "generate":
        because = next(iter(knobs), "use_messages_api: false")
        if uses_tools and mode is False:
            raise UnprocessableContent(
                "Tools need TGI's Messages API, and this deployment uses its generate API only.",
                param="tools", loc=["body", "tools"], value=None,
            )  # fmt: skip
        if uses_tools:
            raise UnprocessableContent(
                f"'{because}' needs TGI's generate API and tools need its Messages API: "
                "a request can have one or the other.",
                param=because, loc=["body", because], value=knobs[because],
            )  # fmt: skip
        if extra:
            name = next(iter(extra))
            raise UnprocessableContent(
                f"'{name}' cannot be passed to TGI's generate API, which this request needs "
                f"for '{because}'.",
                param=name, loc=["body", name], value=extra[name],
            )  # fmt: skip
    return Plan(
        route=route,
        messages=tgi_messages(request.messages),
        grammar=grammar,
        tools=tgi_tools(request.tools) if uses_tools else None,
        tool_choice=request.tool_choice if uses_tools else None,
        knobs=knobs,
        extra_body=extra,
    )


def sampling(request: ChatRequest) -> dict[str, Any]:
    """temperature / top_p as TGI takes them: 0 → greedy, top_p ≥ 1 → not sent."""
    top_p = request.top_p if request.top_p is not None and request.top_p < 1 else None
    return {"temperature": request.temperature, "top_p": top_p}


# ----- TGI's answers → gateway errors ---------------------------------------------------------


def unprocessable(message: str) -> UnprocessableContent:
    """TGI's 422, with the parameter named when TGI's message names one (`like_this`)."""
    named = BACKTICKED.search(message)
    param = CANONICAL_NAMES.get(named.group(1), named.group(1)) if named else None
    if param is None and message.lower().startswith(("template error", "tool error")):
        param = "messages" if message.lower().startswith("template") else "tools"
    return UnprocessableContent(
        f"TGI refused the request: {message}",
        param=param,
        loc=["body", param] if param else None,
        code="UpstreamValidationError",
    )


def overloaded(message: str, retry_after: str | None) -> TooManyRequests:
    return TooManyRequests(
        f"TGI is overloaded: {message}", headers={"Retry-After": retry_after or RETRY_AFTER_SECONDS}
    )


def error_body(response: httpx2.Response) -> tuple[str, str | None]:
    """TGI's `{error, error_type}` from an error response (read by `read_error_body`)."""
    try:
        body = response.json()
    except Exception:  # not read, not JSON: keep the status line
        return f"HTTP {response.status_code}", None
    if not isinstance(body, dict):
        return str(body)[:500], None
    return str(body.get("error") or body)[:2000], body.get("error_type")


def error_for_response(response: httpx2.Response) -> GatewayError:
    status = response.status_code
    message, error_type = error_body(response)
    if status == 422 or error_type == "validation":
        return unprocessable(message)
    if status == 429 or error_type == "overloaded":
        return overloaded(message, response.headers.get("retry-after"))
    if status == 413:
        return PayloadTooLarge(f"TGI refused the request as too large: {message}")
    if status == 503:
        return ServiceUnavailable(f"TGI is unavailable: {message}")
    if status in (408, 504):
        return GatewayTimeout(f"TGI timed out: {message}")
    if status == 424 or error_type == "generation":
        return BadGateway(f"TGI failed during generation: {message}")
    return BadGateway(f"TGI answered HTTP {status}: {message}")


def upstream_error(error: Exception) -> GatewayError:
    """Any failure talking to TGI → the gateway error the client gets."""
    cause = error.__cause__
    response = getattr(cause, "response", None) if isinstance(cause, HfHubHTTPError) else None
    match error:
        case TGIValidationError():
            return unprocessable(str(error))
        case OverloadedError():
            retry_after = response.headers.get("retry-after") if response is not None else None
            return overloaded(str(error), retry_after)
        case GenerationError() | IncompleteGenerationError():
            return BadGateway(f"TGI failed during generation: {error}")
        case TextGenerationError():
            if response is not None:
                return error_for_response(response)
            return BadGateway(f"TGI reported an error: {error}")
        case InferenceTimeoutError() | httpx2.TimeoutException():
            return GatewayTimeout("TGI did not answer in time.")
        case HfHubHTTPError():
            return error_for_response(error.response)
        case httpx2.ConnectError():
            return ServiceUnavailable("TGI is not reachable (connection refused or no route).")
        case httpx2.TransportError():
            return BadGateway(f"The connection to TGI broke: {type(error).__name__}.")
        case _:
            return BadGateway(f"TGI sent something unexpected: {type(error).__name__}: {error}")


@contextmanager
def translated_errors() -> Iterator[None]:
    try:
        yield
    except GatewayError:
        raise
    except Exception as error:  # CancelledError and GeneratorExit are BaseException: untouched
        raise upstream_error(error) from error


async def read_error_body(response: httpx2.Response) -> None:
    """Read a (small) error body so TGI's `{error, error_type}` can be reported after the stream."""
    if response.status_code >= 400 and int(response.headers.get("content-length") or 0) < 1 << 20:
        await response.aread()


# ----- TGI's tokens → canonical events --------------------------------------------------------

Piece = tuple[str, list[TokenLogprob] | None]


class StopTrimmer:
    """Holds back only text that could begin a stop string, and cuts the matched one at the end."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.longest = max(map(len, self.stops), default=0)
        self.held: list[Piece] = []

    def push(self, piece: Piece) -> list[Piece]:
        if not self.stops:
            return [piece]
        self.held.append(piece)
        text = "".join(t for t, _ in self.held)
        keep_from = self.partial_match_start(text)
        released, position = [], 0
        while self.held and position + len(self.held[0][0]) <= keep_from:
            position += len(self.held[0][0])
            released.append(self.held.pop(0))
        return released

    def partial_match_start(self, text: str) -> int:
        """Where the earliest suffix of `text` that begins a stop string starts (len(text) if none)."""
        for start in range(max(0, len(text) - self.longest), len(text)):
            tail = text[start:]
            if any(stop.startswith(tail) for stop in self.stops):
                return start
        return len(text)

    def ends_with_stop(self) -> bool:
        text = "".join(t for t, _ in self.held)
        return any(text.endswith(s) for s in self.stops)

    def finish(self, cut_stop: bool) -> list[Piece]:
        held, self.held = self.held, []
        text = "".join(t for t, _ in held)
        matched = max((s for s in self.stops if text.endswith(s)), key=len, default="")
        if not cut_stop or not matched:
            return held
        cut_at, position, kept = len(text) - len(matched), 0, []
        for piece_text, logprobs in held:
            if position >= cut_at:
                break
            kept.append((piece_text[: cut_at - position], logprobs))
            position += len(piece_text)
        return kept


def split_tool_call(name: str | None, arguments: str) -> tuple[str | None, str]:
    """A streamed call's name and JSON arguments, also from TGI 2.x's raw `{"function": {"_name": …}}`."""
    text = arguments.strip()
    for candidate in (text, text[:-1] if text.endswith("}") else None):
        if candidate is None:
            continue
        try:
            parsed = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        wrapped = parsed.get("function") if isinstance(parsed, dict) else None
        if isinstance(wrapped, dict) and "_name" in wrapped:
            name = wrapped.pop("_name")
            return name, orjson.dumps(wrapped).decode()
        return name, candidate
    return name, arguments


@dataclass(slots=True)
class ChoiceUsage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_seen: int = 0


class ChoiceEvents:
    """One choice's canonical events from TGI's tokens: stop strings cut, logprobs kept, one tool call."""

    def __init__(self, index: int, request: ChatRequest) -> None:
        self.index = index
        self.want_logprobs = request.logprobs
        self.top = request.top_logprobs
        include_stop = bool(request.options.get("include_stop_str_in_output"))
        self.trimmer = StopTrimmer([] if include_stop else request.stop)
        self.call_id = ""
        self.call_name: str | None = None
        self.call_arguments = ""
        self.finished = False

    def logprob(self, token: str, logprob: float | None, top: list[tuple[str, float]]) -> TokenLogprob:
        return TokenLogprob(token, logprob, [TopLogprob(t, lp) for t, lp in top[: self.top]])

    def text(self, text: str, logprobs: list[TokenLogprob] | None) -> list[Event]:
        if not text:
            return []
        if self.want_logprobs and logprobs is None:
            logprobs = [TokenLogprob(text, None)]
        piece = (text, logprobs if self.want_logprobs else None)
        return [TextDelta(self.index, t, lp) for t, lp in self.trimmer.push(piece)]

    def tool_fragment(self, call_id: str | None, name: str | None, arguments: str) -> None:
        self.call_id = self.call_id or call_id or ""
        self.call_name = self.call_name or name
        self.call_arguments += arguments

    @property
    def has_tool_call(self) -> bool:
        return bool(self.call_name or self.call_arguments)

    def finish(self, reason: FinishReason) -> list[Event]:
        self.finished = True
        if reason == "stop" and self.trimmer.ends_with_stop():
            reason = "stop_sequence"  # TGI 2.x's Messages API reported a stop string as "stop"
        events: list[Event] = [
            TextDelta(self.index, t, lp)
            for t, lp in self.trimmer.finish(cut_stop=reason == "stop_sequence")
            if t
        ]
        if self.has_tool_call:
            name, arguments = split_tool_call(self.call_name, self.call_arguments)
            call_id = self.call_id if self.call_id not in ("", "0") else f"call_{uuid.uuid4().hex[:24]}"
            events.append(ToolCallDelta(self.index, 0, call_id, name or "", arguments))
            if reason == "stop":
                reason = "tool_calls"
        events.append(Finish(self.index, reason))
        return events

    def end_of_stream(self) -> list[Event]:
        """The upstream stream ended: finish a complete tool call, or report the cut."""
        if self.finished:
            return []
        if self.has_tool_call:  # TGI 3.x does not send the finish of a streamed tool call
            _, arguments = split_tool_call(self.call_name, self.call_arguments)
            try:
                orjson.loads(arguments)
            except orjson.JSONDecodeError:
                pass
            else:
                return self.finish("tool_calls")
        raise BadGateway("TGI ended the stream before the generation finished.")


def finish_reason(tgi_reason: str) -> FinishReason:
    return FINISH_REASONS.get(tgi_reason, "stop")


# ----- the backend ----------------------------------------------------------------------------


class TGIBackend:
    name = "tgi"

    def __init__(self, model: str = "tgi", **options: Any) -> None:
        try:
            self.options = TGIOptions(**options)
        except ValidationError as error:
            raise ConfigError(f"tgi backend options: {describe(error)}") from None
        self.model = model
        self.parameters = parameter_table(self.options)
        self.capabilities = Capabilities(
            modalities=self.options.modalities,
            parameters=self.parameters,
            response_formats=frozenset({"text", "json_object", "json_schema"}),
            max_n=self.options.max_n,
            max_top_logprobs=self.options.max_top_n_tokens,
            context_length=self.options.context_length,
        )
        self._http: httpx2.AsyncClient | None = None
        self._auto_prefix_ids: list[int] | None = None  # special tokens TGI's tokenizer prepends

    # ----- connections ---------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        return self.options.token.get_secret_value() if self.options.token else None

    def http(self) -> httpx2.AsyncClient:
        """The pooled connections to TGI (created in the serving event loop, on first use)."""
        if self._http is None:
            limits = httpx2.Limits(
                max_connections=self.options.max_connections,
                max_keepalive_connections=self.options.max_connections,
            )
            self._http = httpx2.AsyncClient(
                timeout=self.options.timeout,
                limits=limits,
                event_hooks={"response": [read_error_body]},
            )
        return self._http

    @asynccontextmanager
    async def inference_client(self) -> AsyncIterator[AsyncInferenceClient]:
        """A short-lived AsyncInferenceClient on the shared pool; closing it closes its streams."""
        client = AsyncInferenceClient(
            model=self.options.url,
            token=self.token,
            timeout=self.options.timeout,
            # without a configured token, send none (not the gateway host's own HF token)
            headers=None if self.token else {"authorization": None},
        )
        client._async_client = self.http()  # share the pool; client.close() leaves it open
        try:
            yield client
        finally:
            await client.close()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # ----- generation ----------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        plan = plan_request(request, self.options)
        usages = [ChoiceUsage() for _ in range(request.n)]
        prompt = await self.templated_prompt(plan) if plan.route == "generate" else None
        streams = [self.choice(i, request, plan, prompt, usages[i]) for i in range(request.n)]
        source = streams[0] if len(streams) == 1 else interleave(streams)
        try:
            async for event in source:
                yield event
        finally:  # also when the client went away: close the upstream streams now
            await source.aclose()  # type: ignore[attr-defined]
        prompt_tokens = usages[0].prompt_tokens or 0
        completion_tokens = sum(
            u.completion_tokens if u.completion_tokens is not None else u.tokens_seen for u in usages
        )
        yield Usage(prompt_tokens, completion_tokens)

    def choice(
        self, index: int, request: ChatRequest, plan: Plan, prompt: str | None, usage: ChoiceUsage
    ) -> AsyncIterator[Event]:
        seed = None if request.seed is None else request.seed + index
        if plan.route == "generate":
            assert prompt is not None
            return self.generate_api_choice(index, request, plan, prompt, seed, usage)
        return self.messages_api_choice(index, request, plan, seed, usage)

    async def messages_api_choice(
        self, index: int, request: ChatRequest, plan: Plan, seed: int | None, usage: ChoiceUsage
    ) -> AsyncIterator[Event]:
        events = ChoiceEvents(index, request)
        with translated_errors():
            async with self.inference_client() as client:
                stream = await client.chat_completion(
                    messages=plan.messages,
                    model=self.options.adapter_id or BASE_MODEL,
                    stream=True,
                    stream_options={"include_usage": True},
                    max_tokens=request.max_tokens,
                    stop=request.stop or None,
                    seed=seed,
                    frequency_penalty=request.frequency_penalty,
                    logprobs=True if request.logprobs else None,
                    top_logprobs=request.top_logprobs if request.logprobs else None,
                    response_format=plan.grammar,
                    tools=plan.tools,
                    tool_choice=plan.tool_choice,
                    extra_body=plan.extra_body or None,
                    **sampling(request),
                )
                try:
                    async for chunk in stream:
                        if chunk.get("usage"):
                            usage.prompt_tokens = chunk["usage"]["prompt_tokens"]
                            usage.completion_tokens = chunk["usage"]["completion_tokens"]
                        for choice in chunk.get("choices") or []:
                            usage.tokens_seen += 1
                            for event in self.messages_api_events(events, choice):
                                yield event
                except json.JSONDecodeError:
                    # huggingface_hub 2.4 cannot parse a valid `data:[DONE]` (its issue #4536);
                    # after the last token that is only the end of the stream.
                    if not (events.finished or events.has_tool_call):
                        raise
                for event in events.end_of_stream():
                    yield event

    @staticmethod
    def messages_api_events(events: ChoiceEvents, choice: dict[str, Any]) -> list[Event]:
        delta = choice.get("delta") or {}
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            events.tool_fragment(call.get("id"), function.get("name"), function.get("arguments") or "")
        logprobs = None
        if choice.get("logprobs"):
            logprobs = [
                events.logprob(
                    entry["token"],
                    entry.get("logprob"),
                    [(top["token"], top["logprob"]) for top in entry.get("top_logprobs") or []],
                )
                for entry in choice["logprobs"].get("content") or []
            ]
        out = events.text(delta.get("content") or "", logprobs)
        if choice.get("finish_reason"):
            out += events.finish(finish_reason(choice["finish_reason"]))
        return out

    async def generate_api_choice(
        self,
        index: int,
        request: ChatRequest,
        plan: Plan,
        prompt: str,
        seed: int | None,
        usage: ChoiceUsage,
    ) -> AsyncIterator[Event]:
        events = ChoiceEvents(index, request)
        params = sampling(request)
        greedy = request.temperature == 0
        with translated_errors():
            async with self.inference_client() as client:
                stream = await client.text_generation(
                    prompt,
                    stream=True,
                    details=True,
                    max_new_tokens=request.max_tokens,
                    stop=request.stop or None,
                    seed=seed,
                    do_sample=not greedy,
                    temperature=None if greedy else params["temperature"],
                    top_p=params["top_p"],
                    frequency_penalty=request.frequency_penalty,
                    top_n_tokens=request.top_logprobs if request.logprobs and request.top_logprobs else None,
                    grammar=plan.grammar,
                    adapter_id=self.options.adapter_id,
                    **plan.knobs,
                )
                async for item in stream:
                    usage.tokens_seen += 1
                    token = item["token"]
                    if not token.get("special"):
                        top = [(t["text"], t["logprob"]) for t in item.get("top_tokens") or []]
                        logprobs = [events.logprob(token["text"], token.get("logprob"), top)]
                        for event in events.text(token["text"], logprobs):
                            yield event
                    details = item.get("details")
                    if details:
                        usage.prompt_tokens = details["input_length"]
                        usage.completion_tokens = details["generated_tokens"]
                        for event in events.finish(finish_reason(details["finish_reason"])):
                            yield event
                if not events.finished:
                    raise BadGateway("TGI ended the stream before the generation finished.")

    # ----- the generate API's prompt: TGI's own chat template ------------------------------

    async def templated_prompt(self, plan: Plan) -> str:
        """TGI's chat template applied by `POST /chat_tokenize`, minus a BOS the tokenizer adds again."""
        because = next(iter(plan.knobs), "use_messages_api: false")
        body = {"model": self.options.adapter_id or BASE_MODEL, "messages": plan.messages}
        rendered = await self.post_json("/chat_tokenize", body, because)
        text: str = rendered["templated_text"]
        tokens = [t for t in rendered["tokenize_response"] if t["stop"] > t["start"]]
        prefix_ids = await self.auto_prefix_ids(because)
        if prefix_ids and [t["id"] for t in tokens[: len(prefix_ids)]] == prefix_ids:
            doubled = "".join(t["text"] for t in tokens[: len(prefix_ids)])
            if text.startswith(doubled):
                text = text[len(doubled) :]
        return text

    async def auto_prefix_ids(self, because: str) -> list[int]:
        """The special tokens (BOS) TGI's tokenizer prepends to any input, learned once."""
        if self._auto_prefix_ids is None:
            tokens = await self.post_json("/tokenize", {"inputs": "a"}, because)
            self._auto_prefix_ids = [t["id"] for t in _leading_zero_width(tokens)]
        return self._auto_prefix_ids

    async def post_json(self, path: str, body: dict[str, Any], because: str) -> Any:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        with translated_errors():
            response = await self.http().post(self.options.url + path, json=body, headers=headers)
            if response.status_code == 404:
                raise UnprocessableContent(
                    f"'{because}' needs TGI's generate API with TGI's chat template, and this TGI "
                    f"cannot render it ({path}: {error_body(response)[0]}).",
                    param=because,
                    loc=["body", because],
                )
            if response.status_code >= 400:
                raise error_for_response(response)
            return response.json()


def _leading_zero_width(tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    leading = []
    for token in tokens:
        if token["stop"] > token["start"]:
            break
        leading.append(token)
    return leading


@dataclass(slots=True)
class Failure:
    error: Exception


async def interleave(streams: list[AsyncIterator[Event]]) -> AsyncIterator[Event]:
    """Events of several choices as they arrive; the first failure cancels the rest."""
    queue: asyncio.Queue[Event | Failure | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[Event]) -> None:
        try:
            async for event in stream:
                queue.put_nowait(event)
            queue.put_nowait(None)
        except Exception as error:
            queue.put_nowait(Failure(error))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Failure):
                raise item.error
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
