"""A backend for any upstream that speaks OpenAI chat completions (vLLM, SGLang, OVMS, DJL LMI,
OpenAI itself, or another chatgate): one keep-alive connection pool (backends.upstream_http),
streamed chunks relayed as they arrive.

The body sent upstream is the parameter table applied to the request (backends.base.mapped);
upstream failures become gateway errors by UPSTREAM_STATUSES (backends.upstream_status).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from backends import upstream_http
from backends.base import Capabilities, Param, mapped, same_names
from backends.upstream_http import ConnectError, PoolTimeout, Response, UpstreamError
from backends.upstream_status import CREDENTIALS, Answer, StatusTable, UpstreamFailure, status_error
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
    BadRequest,
    GatewayError,
    GatewayTimeout,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
    UnprocessableContent,
)
from gateway.core.options import from_file
from gateway.core.parameters import requested

log = logging.getLogger("chatgate.backends.openai_compatible")

# OpenAI's own parameters: forwarded under their own names (max_tokens: as the deployment says).
# The informational metadata, store and service_tier are the gateway's (parameters.HANDLED): dropped.
OPENAI_PARAMETERS = same_names(
    "max_tokens", "stop", "n", "seed", "temperature", "top_p", "frequency_penalty",
    "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "response_format", "tools",
    "tool_choice", "user", "parallel_tool_calls", "modalities", "audio", "prediction",
    "reasoning_effort",
)  # fmt: skip
SERVER_EXTRA_NOTE = "forwarded as is; vLLM, SGLang and OVMS take it, OpenAI answers 400"
# Sampling extras of the open-source servers (the dialects' `options`): forwarded as is.
SERVER_EXTRAS = {
    name: Param(name, note=SERVER_EXTRA_NOTE)
    for name in (
        "top_k", "min_p", "typical_p", "repetition_penalty", "length_penalty", "best_of",
        "ignore_eos", "include_stop_str_in_output", "min_tokens", "stop_token_ids",
        "skip_special_tokens", "spaces_between_special_tokens", "use_beam_search",
        "early_stopping", "truncate_prompt_tokens", "prompt_logprobs", "detokenize",
        "logits_processors", "num_assistant_tokens", "assistant_confidence_threshold",
        "max_ngram_size",
    )
}  # fmt: skip
CAPABILITIES = Capabilities(
    modalities=frozenset({"text", "image", "audio"}),
    parameters={**OPENAI_PARAMETERS, **SERVER_EXTRAS},
    response_formats=frozenset({"text", "json_object", "json_schema"}),
    max_n=128,
    max_top_logprobs=20,
    context_length=1 << 20,  # the upstream enforces its own context length
)

# The upstream's error status → the client's: its own message, and the parameter it names.
UPSTREAM_STATUSES = StatusTable(
    "The upstream model server",
    {
        400: Answer(BadRequest, names_param=True, points_at_param=True),
        401: CREDENTIALS,
        403: CREDENTIALS,
        404: Answer(NotFound, names_param=True),
        422: Answer(UnprocessableContent, names_param=True, points_at_param=True),
        429: Answer(TooManyRequests, keeps_retry_after=True),
        "4xx": Answer(BadRequest, names_param=True),
        "5xx": Answer(BadGateway, "{upstream} failed ({status}): {message}"),
    },
)

FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
    "eos_token": "stop",  # LMI's words
    "stop_sequence": "stop_sequence",
}
DRAIN_AFTER_DONE_SECONDS = 0.5  # reading the stream's end after [DONE] keeps the connection alive
# An idle pooled connection is closed before common servers drop it themselves (uvicorn: 5 s),
# so a request rarely meets a connection the server is just closing.
KEEPALIVE_SECONDS = 4.0
# Sent with every request; an upstream answers uncompressed, so nothing needs decompressing.
DEFAULT_HEADERS = {
    "content-type": "application/json",
    "accept-encoding": "identity",
    "user-agent": "chatgate",
}
MESSAGE_LIMIT = 1000


class Options(BaseModel):
    """A deployment's `options:` for this backend, validated at start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="The upstream's OpenAI base URL, e.g. http://host:8000/v1.")
    api_key: SecretStr | None = Field(default=None, description="Sent as a Bearer token.")
    api_key_file: Path | None = Field(default=None, description="A file holding the api_key instead.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers.")
    upstream_model: str | None = Field(
        default=None, description="The model name sent upstream (default: the served model)."
    )
    max_tokens_parameter: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    connect: float = Field(default=5.0, gt=0, description="Seconds to connect.")
    first_byte: float = Field(
        default=60.0,
        gt=0,
        description="Seconds until a streamed answer's first chunk (a whole answer is bounded "
        "by `total`: the upstream sends nothing before it is done).",
    )
    total: float = Field(default=600.0, gt=0, description="Seconds for the whole answer.")
    max_connections: int = Field(default=100, ge=1)
    max_keepalive: int = Field(
        default=20,
        ge=0,
        description="0 closes each connection after its request; otherwise idle connections are "
        f"kept for reuse, at most this many, each for {KEEPALIVE_SECONDS:g} s.",
    )

    @model_validator(mode="before")
    @classmethod
    def api_key_from_file(cls, values: Any) -> Any:
        return from_file(values, "api_key")

    @field_validator("base_url")
    @classmethod
    def http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return value.rstrip("/")


def without_userinfo(url: str) -> str:
    """The URL with any `user:password@` taken out, as logs may show it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return parts._replace(netloc=host).geturl()


class OpenAICompatibleBackend:
    name = "openai-compatible"

    def __init__(self, model: str = "default", **options: Any) -> None:
        self.options = Options.model_validate(options)
        self.model = model
        self.upstream_model = self.options.upstream_model or model
        self.url = self.options.base_url + "/chat/completions"
        self.shown_url = without_userinfo(self.options.base_url)  # for logs: never a password
        target = self.options.max_tokens_parameter
        self.capabilities = replace(
            CAPABILITIES, parameters={**CAPABILITIES.parameters, "max_tokens": Param(target)}
        )
        parts = urlsplit(self.url)
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")
        self._pool: upstream_http.Pool | None = None
        self._warned_no_usage = False

    def __repr__(self) -> str:
        return f"OpenAICompatibleBackend(model={self.model!r}, base_url={self.shown_url!r})"

    # ----- the connection pool --------------------------------------------------------------

    @property
    def pool(self) -> upstream_http.Pool:
        """Created on first use, inside the serving event loop; closed by `aclose`.

        Everything constant is decided here once: headers, pool limits, the connect timeout.
        """
        if self._pool is None:
            options = self.options
            headers = {name.lower(): value for name, value in DEFAULT_HEADERS.items()}
            # a deployment's header replaces a default of any case
            headers.update({name.lower(): value for name, value in options.headers.items()})
            if options.api_key is not None:
                headers["authorization"] = f"Bearer {options.api_key.get_secret_value()}"
            self._pool = upstream_http.Pool(
                options.base_url,
                headers,
                max_connections=options.max_connections,
                max_keepalive=options.max_keepalive,
                keepalive_seconds=KEEPALIVE_SECONDS,
                # bounds the wait for a pooled connection and the TCP connect; reads are
                # bounded by the first_byte / total deadlines in `generate`
                connect_timeout=options.connect,
            )
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None

    # ----- request ------------------------------------------------------------------------

    def upstream_body(self, request: ChatRequest) -> dict[str, Any]:
        """The request's parameters by the table, and the extra parameters the policy let through."""
        body: dict[str, Any] = {"model": self.upstream_model, "messages": request.messages}
        if request.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # so usage is always known
        body.update(mapped(self.capabilities.parameters, requested(request)))
        body.update(request.extra)
        return body

    # ----- response -----------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.options.total
        first_deadline = min(deadline, started + self.options.first_byte)
        pool = self._pool or self.pool
        body = orjson.dumps(self.upstream_body(request))
        response: Response | None = None
        try:
            async with asyncio.timeout_at(first_deadline if request.stream else deadline) as timeout:
                response = await pool.post(self._path, body)
                streamed = (
                    request.stream
                    and response.status < 400
                    and response.headers.get("content-type", "").startswith("text/event-stream")
                )
                if not streamed:
                    timeout.reschedule(deadline)
                    raw = await response.read()
            if response.status >= 400:
                raise self.status_error(response.status, raw, response.headers)
            if streamed:
                async for event in self.relay(response, request, first_deadline, deadline):
                    yield event
                return
            for event in self.completion_events(parse_json(raw), request):
                yield event
        except (UpstreamError, TimeoutError) as exc:
            raise self.transport_error(exc, loop.time() - started) from None
        finally:
            if response is not None:
                # a no-op once the body was read whole (the connection is back in the pool);
                # otherwise (timeout, error, the client went away) the upstream sees us hang up
                response.close()

    async def relay(
        self, response: Response, request: ChatRequest, first_deadline: float, deadline: float
    ) -> AsyncIterator[Event]:
        """Parse the upstream's SSE stream and yield events chunk by chunk, as they arrive."""
        decoder = SSEDecoder()
        state = StreamState(request.n)
        read = response.read_some  # whatever has arrived; b"" only at the end
        until = first_deadline  # until the first generated chunk, then the whole answer's deadline
        while not decoder.done:
            async with asyncio.timeout_at(until):
                piece = await read()
            payloads = decoder.feed(piece) if piece else decoder.close()
            for payload in payloads:
                events = state.feed(parse_json(payload))
                for event in events:
                    yield event
                if events:
                    until = deadline
            if not piece:
                break
        if not decoder.done and state.unfinished:
            raise BadGateway("The upstream closed the stream before the answer was finished.")
        for event in state.close():
            yield event
        if state.usage is None:
            self.warn_no_usage()
        yield state.usage or Usage(0, state.fragments)
        if decoder.done:  # read the stream's end so the connection can be reused
            try:
                async with asyncio.timeout(DRAIN_AFTER_DONE_SECONDS):
                    while await read():
                        pass
            except (UpstreamError, TimeoutError):
                pass

    def completion_events(self, body: Any, request: ChatRequest) -> list[Event]:
        """A whole chat.completion as events: per choice its text, tool calls and finish; then usage.

        Without upstream usage, completion tokens are estimated (logprob entries, else words).
        """
        if isinstance(body, dict) and body.get("error") is not None:
            raise stream_error(body["error"])
        try:
            events: list[Event] = []
            fragments = 0
            for choice in body["choices"]:
                index = choice_index(choice, request.n)
                message = choice.get("message") or {}
                text = content_text(message.get("content"))
                logprobs = token_logprobs(choice.get("logprobs"))
                if text or logprobs:
                    events.append(TextDelta(index, text, logprobs))
                    fragments += len(logprobs) if logprobs else len(text.split())
                calls = list(message.get("tool_calls") or ())
                if message.get("function_call"):
                    calls.append({"function": message["function_call"]})
                for position, call in enumerate(calls):
                    function = call.get("function") or {}
                    arguments = arguments_text(function.get("arguments"))
                    call_id = call.get("id") or new_call_id()
                    events.append(
                        ToolCallDelta(index, position, call_id, function.get("name") or "", arguments)
                    )
                    fragments += len(arguments.split())
                reason = canonical_reason(choice.get("finish_reason"), choice.get("stop_reason"))
                events.append(Finish(index, reason))
            usage = read_usage(body.get("usage"))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise malformed(exc) from None
        if usage is None:
            self.warn_no_usage()
            usage = Usage(0, fragments)
        events.append(usage)
        return events

    def warn_no_usage(self) -> None:
        if not self._warned_no_usage:
            self._warned_no_usage = True
            log.warning(
                "upstream %s sent no usage: completion tokens are estimated (chunks seen), "
                "prompt tokens reported as 0",
                self.shown_url,
            )

    # ----- errors -------------------------------------------------------------------------

    def transport_error(self, exc: Exception, elapsed: float) -> GatewayError:
        """A failure to talk to the upstream, as the gateway error the client gets."""
        log.warning("upstream %s: %s: %s", self.shown_url, type(exc).__name__, exc)
        if isinstance(exc, PoolTimeout):
            return ServiceUnavailable("All connections to the upstream are busy; try again later.")
        if isinstance(exc, ConnectError):  # refused, unresolvable, TLS failed, or too slow
            return ServiceUnavailable("The upstream model server cannot be reached.")
        if isinstance(exc, TimeoutError):
            return GatewayTimeout(f"The upstream model server did not answer in time ({elapsed:.1f} s).")
        return BadGateway(f"The connection to the upstream model server failed ({type(exc).__name__}).")

    def status_error(self, status: int, raw: bytes, headers: Mapping[str, str]) -> GatewayError:
        """An upstream error response, as the gateway error the client gets."""
        message, param = error_message(raw)
        if UPSTREAM_STATUSES.answers.get(status) is CREDENTIALS:
            log.error("upstream %s refused the gateway's credentials (%d)", self.shown_url, status)
        else:
            log.info("upstream %s answered %d: %s", self.shown_url, status, message)
        failure = UpstreamFailure(status, message, param, headers.get("retry-after"))
        return status_error(UPSTREAM_STATUSES, failure)


# ----- the stream ---------------------------------------------------------------------------


class SSEDecoder:
    """Server-sent events → the payload of each event's `data:` lines; stops at `[DONE]`.

    Payloads are produced lazily, event by event: a piece holding a whole stream (a fast
    upstream) yields its first event without scanning the rest first.
    """

    __slots__ = ("buffer", "done")

    def __init__(self) -> None:
        self.buffer = b""
        self.done = False

    def feed(self, piece: bytes) -> Iterator[bytes]:
        data = self.buffer + piece if self.buffer else piece
        held = b""
        if b"\r" in data:  # CRLF or CR line ends become LF (a CR at the very end may be half a CRLF)
            if data.endswith(b"\r"):
                data, held = data[:-1], b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        complete, rest = self.split_unfinished(data)
        self.buffer = rest + held
        return self.payloads(complete) if complete else iter(())

    def close(self) -> Iterator[bytes]:
        """The stream ended: what its last lines still hold."""
        data, self.buffer = self.buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), b""
        return self.payloads(data) if data else iter(())

    @staticmethod
    def split_unfinished(data: bytes) -> tuple[bytes, bytes]:
        """(the complete events, the unfinished rest that waits for the next piece)."""
        end = data.rfind(b"\n\n")
        if end < 0:
            return b"", data
        return data[: end + 2], data[end + 2 :]

    def payloads(self, data: bytes) -> Iterator[bytes]:
        for event in data.split(b"\n\n"):
            if self.done:
                return
            if not event:
                continue
            if event.startswith(b"data:") and b"\n" not in event:  # the usual one-line event
                value = event[6:] if event[5:6] == b" " else event[5:]
            else:
                lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
                if not lines:
                    continue  # comments, event:, id:, retry: carry nothing needed here
                value = b"\n".join(line[6:] if line[5:6] == b" " else line[5:] for line in lines)
            if value == b"[DONE]":
                self.done = True
                return
            yield value


@dataclass(slots=True)
class PendingCall:
    """A streamed tool call whose arguments are still arriving in fragments."""

    call_index: int
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class StreamState:
    """Folds chat.completion.chunk payloads into canonical events.

    Tool calls stream as fragments; each is sent whole once the next call of its choice
    begins or the choice finishes.
    """

    __slots__ = ("calls", "finished", "fragments", "n", "seen", "usage")

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: dict[int, dict[int, PendingCall]] = {}
        self.seen: set[int] = set()
        self.finished: set[int] = set()
        self.fragments = 0  # content / tool-call chunks seen: the usage estimate when none is sent
        self.usage: Usage | None = None

    @property
    def unfinished(self) -> bool:
        return not self.seen or bool(self.seen - self.finished)

    def feed(self, chunk: Any) -> list[Event]:
        if isinstance(chunk, dict) and chunk.get("error") is not None:
            raise stream_error(chunk["error"])
        events: list[Event] = []
        try:
            for choice in chunk.get("choices") or ():
                index = choice_index(choice, self.n)
                self.seen.add(index)
                delta = choice.get("delta") or {}
                text = delta.get("content")
                logprobs = token_logprobs(choice.get("logprobs"))
                if text or logprobs:
                    events.append(TextDelta(index, content_text(text), logprobs))
                    self.fragments += 1
                calls = delta.get("tool_calls")
                if delta.get("function_call"):
                    calls = [{"index": 0, "function": delta["function_call"]}]
                if calls:
                    self.collect(index, calls, events)
                    self.fragments += 1
                reason = choice.get("finish_reason")
                if reason:
                    self.flush(index, events)
                    events.append(Finish(index, canonical_reason(reason, choice.get("stop_reason"))))
                    self.finished.add(index)
            if chunk.get("usage"):
                self.usage = read_usage(chunk["usage"])
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise malformed(exc) from None
        return events

    def collect(self, index: int, fragments: list[dict[str, Any]], events: list[Event]) -> None:
        pending = self.calls.setdefault(index, {})
        for fragment in fragments:
            call_index = fragment.get("index", 0)
            function = fragment.get("function") or {}
            call = pending.get(call_index)
            if call is None:
                # a new call begins: the earlier calls of this choice are complete
                for earlier in sorted(k for k in pending if k < call_index):
                    events.append(self.whole(index, pending.pop(earlier)))
                call = pending[call_index] = PendingCall(call_index, "", "")
            call.id = call.id or fragment.get("id") or ""
            call.name = call.name or function.get("name") or ""
            arguments = function.get("arguments")
            if arguments:
                call.arguments.append(arguments_text(arguments))

    def flush(self, index: int, events: list[Event]) -> None:
        pending = self.calls.pop(index, {})
        for call_index in sorted(pending):
            events.append(self.whole(index, pending[call_index]))

    @staticmethod
    def whole(index: int, call: PendingCall) -> ToolCallDelta:
        return ToolCallDelta(
            index, call.call_index, call.id or new_call_id(), call.name, "".join(call.arguments)
        )

    def close(self) -> list[Event]:
        """After the stream: calls never flushed, and a finish for choices that got none."""
        events: list[Event] = []
        for index in sorted(self.seen - self.finished):
            had_calls = bool(self.calls.get(index))
            self.flush(index, events)
            events.append(Finish(index, "tool_calls" if had_calls else "stop"))
            self.finished.add(index)
        return events


# ----- reading upstream JSON ------------------------------------------------------------------


def parse_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadGateway(f"The upstream model server sent a malformed response: {snippet(raw)!r}") from None


def malformed(exc: Exception) -> BadGateway:
    return BadGateway(f"The upstream model server sent an unexpected response ({type(exc).__name__}: {exc}).")


def snippet(raw: bytes, limit: int = 200) -> str:
    return raw[:limit].decode("utf-8", "replace")


def choice_index(choice: Mapping[str, Any], n: int) -> int:
    index = choice.get("index", 0)
    if not isinstance(index, int) or not 0 <= index < n:
        raise ValueError(f"choice index {index!r} outside 0..{n - 1}")
    return index


def content_text(content: Any) -> str:
    """Message content as text (a list of parts is joined by its text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict))


def arguments_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def token_logprobs(logprobs: Any) -> list[TokenLogprob] | None:
    if isinstance(logprobs, list):  # LMI wraps the object in a one-element list
        logprobs = logprobs[0] if logprobs else None
    if not logprobs:
        return None
    content = logprobs.get("content")
    if content is None:
        return None
    return [
        TokenLogprob(
            entry["token"],
            entry.get("logprob"),
            [TopLogprob(top["token"], top["logprob"]) for top in entry.get("top_logprobs") or ()],
        )
        for entry in content
    ]


def canonical_reason(reason: Any, stop_reason: Any = None) -> FinishReason:
    canonical = FINISH_REASONS.get(reason, "stop") if isinstance(reason, str) else "stop"
    if canonical == "stop" and isinstance(stop_reason, str):
        return "stop_sequence"  # vLLM names the stop string that matched
    return canonical


def read_usage(usage: Any) -> Usage | None:
    if not usage:
        return None
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def error_message(raw: bytes) -> tuple[str, str | None]:
    """The message (and offending parameter) in an upstream error body of any common shape."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return (snippet(raw, MESSAGE_LIMIT).strip() or "(empty response)"), None
    if not isinstance(body, dict):
        return snippet(raw, MESSAGE_LIMIT), None
    error = body.get("error")
    if isinstance(error, dict):  # OpenAI, vLLM, chatgate
        message, param = error.get("message"), error.get("param")
    else:  # OVMS / Aleph Alpha {"error": "..."}, Azure {"error", "message"}, LMI {"message"}
        message = body.get("message") or error or body.get("detail")
        param = body.get("param")
    if not isinstance(message, str):
        message = orjson.dumps(message).decode() if message is not None else snippet(raw)
    return message[:MESSAGE_LIMIT], param if isinstance(param, str) else None


def stream_error(error: Any) -> GatewayError:
    """An error the upstream sent in place of a completion or chunk."""
    message = error.get("message") if isinstance(error, dict) else error
    return BadGateway(f"The upstream model server reported an error: {message}")
