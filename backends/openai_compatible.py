"""A backend for any upstream that speaks OpenAI chat completions (vLLM, SGLang, OVMS, DJL LMI,
OpenAI itself, or another chatgate): the gateway's HTTP client (backends.http.client),
streamed chunks relayed as they arrive, as server-sent events or JSON lines (LMI).

The body sent upstream is the parameter table applied to the request (backends.base.mapped);
upstream failures become gateway errors by UPSTREAM_STATUSES (backends.http.status).

How a finish becomes `stop_sequence` (a stop string matched) rather than `stop` (the end of the
sequence): the upstream's own word (`stop_sequence`, LMI and TGI); else vLLM's `stop_reason` (or
SGLang's `matched_stop`): a string is the stop string that matched, a number a stop token, null
the end of the sequence; else, for a plain `stop` from an upstream that says no more, the answer
ends with one of the request's stop strings (an upstream that keeps the match in its text). An
upstream that cuts the match and names no reason (OpenAI itself) cannot be told apart from the
end of the sequence: that stays `stop`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import orjson
from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from backends.base import Capabilities, Param, mapped, same_names, to_send
from backends.http.bodies import content_text, error_message, snippet
from backends.http.client import (
    ConnectFailed,
    Limits,
    PoolBusy,
    TooLarge,
    UpstreamClient,
    UpstreamError,
    UpstreamResponse,
)
from backends.http.fan_out import joined
from backends.http.options import ChoiceOptions, NetworkOptions, ProbeOptions
from backends.http.status import (
    CREDENTIALS,
    Answer,
    StatusTable,
    UpstreamFailure,
    client_safe,
    redacted,
    status_error,
)
from backends.http.stream_decoders import StreamDecoder, decoder_for
from backends.native_stream import PATHS, native_stream, relayed, whole_answer
from backends.stop_strings import ending
from gateway.core.canonical import (
    FROM_TOKEN,
    ChatRequest,
    CompletionTokensDetails,
    Event,
    EventStream,
    Finish,
    FinishReason,
    NativeBody,
    PromptTokensDetails,
    RefusalDelta,
    ServedBy,
    TextDelta,
    TokenBytes,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    mark_last_text,
)
from gateway.core.deadline import Deadline, DeadlinePassed, task_of
from gateway.core.errors import (
    BadGateway,
    BadRequest,
    GatewayError,
    GatewayTimeout,
    NotFound,
    TooManyRequests,
    UnprocessableContent,
    UpstreamAnswerTooLarge,
    UpstreamBusy,
    UpstreamUnreachable,
)
from gateway.core.options import from_file
from gateway.core.parameters import passed_on

log = logging.getLogger("chatgate.backends.openai_compatible")

# OpenAI's own parameters: forwarded under their own names (max_tokens: as the deployment says),
# the informational ones too (metadata, store, service_tier, …: parameters.PASSED_ON), so that
# nothing a client sets is dropped in silence on the way to an OpenAI-compatible server.
OPENAI_PARAMETERS = same_names(
    "max_tokens", "stop", "n", "seed", "temperature", "top_p", "frequency_penalty",
    "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "response_format", "tools",
    "tool_choice", "user", "parallel_tool_calls", "modalities", "audio", "prediction",
    "reasoning_effort", "verbosity", "web_search_options", "moderation",
    "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "safety_identifier",
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
# Aleph Alpha's own chat parameter: its inference API (an OpenAI-compatible upstream) takes it.
SERVER_EXTRAS["steering_concepts"] = Param(
    "steering_concepts", note="forwarded as is; Aleph Alpha's inference API takes it, others answer 400"
)
CAPABILITIES = Capabilities(
    # the messages go on as they came: every part, and custom tools' calls in the history
    modalities=frozenset({"text", "image", "audio", "file"}),
    custom_calls_in_history=True,
    parameters={**OPENAI_PARAMETERS, **SERVER_EXTRAS},
    response_formats=frozenset({"text", "json_object", "json_schema"}),
    max_n=128,
    max_top_logprobs=20,
)

FAN_OUT_MOST = 16  # choices of one request made as requests of their own, at most
BUSY = "{upstream} is busy or its limits for the gateway are used up: try again later."
# The upstream's error status → the client's: its own message, and the parameter it names.
UPSTREAM_STATUSES = StatusTable(
    "The upstream model server",
    {
        400: Answer(BadRequest, names_param=True, points_at_param=True),
        401: CREDENTIALS,
        403: CREDENTIALS,
        404: Answer(NotFound, names_param=True),
        422: Answer(UnprocessableContent, names_param=True, points_at_param=True),
        # its words are about the gateway's account with it (quotas, plans), not the client's
        429: Answer(TooManyRequests, BUSY, keeps_retry_after=True),
        # busy, not broken (vLLM's and another chatgate's full queue): another replica, no mark
        503: Answer(UpstreamBusy, "{upstream} is busy (HTTP 503); try again later.", keeps_retry_after=True),
        "4xx": Answer(BadRequest, names_param=True),
        # a failing server's own words (tracebacks, paths) stay in the log
        "5xx": Answer(BadGateway, "{upstream} failed on this request (HTTP {status})."),
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
# Upstream advice about a header only the upstream's own client, the gateway, sends (chatgate's
# and Azure AI's "send `extra-parameters: pass-through`"): the gateway's client cannot follow it.
EXTRA_PARAMETERS_ADVICE = re.compile(r"(?i)extra.parameters?\b.*\b(header|pass-through)")
DRAIN_AFTER_DONE_SECONDS = 0.5  # reading the stream's end after [DONE] keeps the connection alive
# An idle pooled connection is closed before common servers drop it themselves (uvicorn: 5 s),
# so a request rarely meets a connection the server is just closing.
KEEPALIVE_SECONDS = 4.0
MAX_HEADER_BYTES = 64 * 1024
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
# Sent with every request; the answer is asked for uncompressed (one compressed anyway is decoded).
DEFAULT_HEADERS = {
    "content-type": "application/json",
    "accept-encoding": "identity",
    "user-agent": "chatgate",
}
STOP_TAIL = 1024  # characters of a streamed choice kept to check its end against the stop strings
PATH = "/chat/completions"


class Options(NetworkOptions, ChoiceOptions, ProbeOptions):
    """A deployment's `options:` for this backend, validated at start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(
        description="The upstream's OpenAI base URL, e.g. http://host:8000/v1 (a user:password in it "
        "is sent as Basic authorization when no api_key is set)."
    )
    api_key: SecretStr | None = Field(default=None, description="Sent as a Bearer token.")
    api_key_file: Path | None = Field(default=None, description="A file holding the api_key instead.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers.")
    upstream_model: str | None = Field(
        default=None, description="The model name sent upstream (default: the served model)."
    )
    max_tokens_parameter: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    native: list[Literal["messages", "responses"]] = Field(
        default_factory=list,
        description="The client dialects the upstream speaks too (`messages`: Anthropic's "
        "`{base_url}/messages`, `responses`: OpenAI's `{base_url}/responses`): a request in one of "
        "them goes upstream as the client sent it (a native pass-through), nothing lost.",
    )
    stream_usage: bool = Field(
        default=True,
        description="Ask for a stream's usage (`stream_options: {include_usage: true}`); false for "
        "an upstream that refuses the field (DJL LMI): the usage is then estimated.",
    )
    first_byte: float = Field(
        default=60.0,
        gt=0,
        description="Seconds until a streamed answer's first chunk (a whole answer is bounded "
        "by `total`: the upstream sends nothing before it is done).",
    )
    total: float = Field(default=600.0, gt=0, description="Seconds for the whole answer.")
    max_connections: int | None = Field(
        default=None,
        ge=1,
        description="Connections open at once (the pool); none: as many as the replica admits "
        "(the deployment's `concurrency.max_concurrent`). Set lower, it lowers that limit instead, "
        "so no admitted request waits for a connection.",
    )
    keepalive_seconds: float = Field(
        default=KEEPALIVE_SECONDS,
        ge=0,
        description="Seconds an idle connection is kept for the next request (0: each connection is "
        "closed after its answer); shorter than the upstream's own idle timeout (uvicorn: 5 s).",
    )
    max_header_bytes: int = Field(
        default=MAX_HEADER_BYTES, ge=1024, description="An answer's header block larger than this: 502."
    )
    max_response_bytes: int = Field(
        default=MAX_RESPONSE_BYTES,
        ge=1024,
        description="An answer larger than this (as received, decompressed; a stream in all): 502.",
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


def most_choices(options: Options) -> int:
    """The most choices a request may ask for: one where they are refused (the policy's 422
    names n); a fan-out's requests each take a connection, so no more than the pool holds, and
    no more than FAN_OUT_MOST without a pool's bound (the deployment's `max_concurrent` bounds
    them too: gateway.fleet.router)."""
    if options.n == "refuse":
        return 1
    if options.n == "fan-out":
        return min(FAN_OUT_MOST, options.max_connections or FAN_OUT_MOST)
    return CAPABILITIES.max_n


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

    def __init__(
        self,
        model: str = "default",
        *,
        proxy_environment: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.options = Options.model_validate(options)
        self.model = model
        self.upstream_model = self.options.upstream_model or model
        self.url = self.options.base_url + "/chat/completions"
        self.shown_url = without_userinfo(self.options.base_url)  # for logs: never a password
        target = self.options.max_tokens_parameter
        fan_out = self.options.n == "fan-out"
        self.capabilities = replace(
            CAPABILITIES,
            parameters={**CAPABILITIES.parameters, "max_tokens": Param(target)},
            max_n=most_choices(self.options),
            requests_per_choice=fan_out,
            prompt_per_choice=fan_out,
            native=frozenset(self.options.native),
        )
        # decided once, at start: where the connections go, and how TLS is checked (a bad
        # certificate file stops the gateway here, not at the first request)
        self.proxy = self.options.proxy_for(self.options.base_url, proxy_environment or {})
        self.tls = self.options.ssl_context() if self.uses_tls else None
        self._client: UpstreamClient | None = None
        self._warned_no_usage = False
        self._warned_fewer_choices = False

    def __repr__(self) -> str:
        return f"OpenAICompatibleBackend(model={self.model!r}, base_url={self.shown_url!r})"

    @property
    def uses_tls(self) -> bool:
        options = self.options
        https = self.url.startswith("https://") or (self.proxy or "").startswith("https://")
        return https or options.ca_file is not None or options.client_cert is not None

    # ----- the client ---------------------------------------------------------------------

    @property
    def client(self) -> UpstreamClient:
        """Created on first use, inside the serving event loop; closed by `aclose`.

        Everything constant is decided here once: headers, pool limits, the connect timeout.
        """
        if self._client is None:
            options = self.options
            headers = {name.lower(): value for name, value in DEFAULT_HEADERS.items()}
            # a deployment's header replaces a default of any case
            headers.update({name.lower(): value for name, value in options.headers.items()})
            if options.api_key is not None:
                headers["authorization"] = f"Bearer {options.api_key.get_secret_value()}"
            elif "authorization" not in headers and (basic := basic_authorization(options.base_url)):
                headers["authorization"] = basic
            limits = Limits(
                connect=options.connect,
                max_connections=options.max_connections,
                keepalive_seconds=options.keepalive_seconds,
                max_header_bytes=options.max_header_bytes,
                max_response_bytes=options.max_response_bytes,
            )
            self._client = UpstreamClient(
                self.shown_url, headers, limits, proxy=self.proxy, ssl_context=self.tls
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ----- request ------------------------------------------------------------------------

    def upstream_body(self, request: ChatRequest) -> dict[str, Any]:
        """The request's parameters by the table, and the extra parameters the policy let through."""
        body: dict[str, Any] = {"model": self.upstream_model, "messages": request.messages}
        if request.stream:
            body["stream"] = True
            if self.options.stream_usage:
                body["stream_options"] = {"include_usage": True}  # so usage is always known
        table = self.capabilities.parameters
        body.update(mapped(table, to_send(table, request)))
        body.update(mapped(table, passed_on(request, table)))
        body.update(request.extra)
        return body

    # ----- response -----------------------------------------------------------------------

    def generate(self, request: ChatRequest) -> EventStream:
        """The answer's events: from one upstream request, or (`options.n: fan-out`) from one per
        choice asked for."""
        native = request.native
        if native is not None and native.dialect in self.capabilities.native:
            return self.native_answer(request, native)
        asked = choices_asked(request)
        if asked is not None and asked > 1 and self.options.n != "native":
            if self.options.n == "fan-out":
                return self.fanned_out(request, asked)
            return refused_n(asked)  # only an extra `n` gets here: the policy refused the request's own
        return self.one_answer(request, asked)

    async def fanned_out(self, request: ChatRequest, asked: int) -> EventStream:
        """`asked` requests of one choice each (request k with seed + k, when a seed is set),
        joined (backends.http.fan_out)."""
        body = self.upstream_body(request)
        body.pop("n", None)
        seed = body.get("seed")
        answers = [
            self.one_answer(request, 1, {**body, "seed": seed + k} if type(seed) is int else body)
            for k in range(asked)
        ]
        source = joined(answers)
        try:
            async for item in source:
                yield item
        finally:  # also when the client went away: every upstream request is hung up on now
            await source.aclose()

    async def one_answer(
        self, request: ChatRequest, asked: int | None, body: dict[str, Any] | None = None
    ) -> EventStream:
        """One upstream request's answer, which must hold the `asked` choices (None: the count is
        not known, the upstream's own business)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.options.total
        first_deadline = min(deadline, started + self.options.first_byte)
        sent = orjson.dumps(self.upstream_body(request) if body is None else body)
        answer: UpstreamResponse | None = None
        until = Deadline(first_deadline if request.stream else deadline)  # one timer for every wait
        try:
            answer, decoder, raw = await self.posted(PATH, sent, request, until, deadline, "a completion")
            if decoder is not None:
                # the stream decoded and its events passed on read by read as they arrive, from
                # this generator (no layer of its own): what one read brought is one item, so a
                # burst the upstream sent at once passes the relay's loops once, not once an event
                # (a fifth of a streamed request's instructions in front of nginx); the read that
                # ends the stream brings its end too (the choices' ends, the usage), so that the
                # client gets the answer's last text and its end in one write
                state = StreamState(asked or self.capabilities.max_n, request.stop)
                read = answer.read_some  # whatever has arrived; b"" only at the end
                until.when = first_deadline  # until the first generated chunk, then the whole's
                while not decoder.done:
                    # `until.wait(read())` taken apart (Deadline.arm): no coroutine a read. The
                    # task is asked each time: the first reads may come from another task's wait
                    task = task_of(loop)
                    assert task is not None
                    cancelling = task.cancelling()
                    until.arm(task, until.when)
                    try:
                        piece = await read()
                    except asyncio.CancelledError:
                        if until.passed(task, cancelling):
                            raise DeadlinePassed from None
                        raise
                    finally:
                        until.disarm()
                    brought: list[Event] | None = None  # what one read brought, as one item
                    try:
                        for payload in decoder.feed(piece) if piece else decoder.close():
                            try:  # parse_json, inline: a call fewer a chunk
                                chunk = orjson.loads(payload)
                            except orjson.JSONDecodeError:
                                raise not_json(payload) from None
                            if events := state.feed(chunk):
                                if brought is None:  # a read at a model's pace: one payload's
                                    brought = events
                                else:
                                    brought += events
                        if decoder.done or not piece:  # the stream's end came with this read
                            end = self.stream_end(decoder, state, request, asked)
                            brought = end if brought is None else brought + end
                    except Exception:
                        if brought:  # what came before the failure goes on first
                            yield brought
                        raise
                    if decoder.done:
                        # the body's end read (so that the connection can be reused) before the
                        # answer's end goes on: the client's done line follows this generator's
                        # end, and the two then leave in one write however the upstream's last
                        # bytes arrive
                        await drained(read)
                    if brought:
                        until.when = deadline
                        yield brought
                    if not piece:
                        break
                return
            yield self.completion_events(parse_json(raw), request, asked)
        except (UpstreamError, TimeoutError) as exc:
            raise self.transport_error(exc, loop.time() - started) from None
        finally:
            until.close()
            if answer is not None:
                # the connection goes back to the pool once the body was read whole; otherwise
                # (timeout, error, the client went away) the upstream sees us hang up
                answer.close()

    async def posted(
        self,
        path: str,
        sent: bytes,
        request: ChatRequest,
        until: Deadline,
        deadline: float,
        what: str,
    ) -> tuple[UpstreamResponse, StreamDecoder | None, bytes]:
        """The upstream's answer to one POST, its head by `until` (the caller's, which it closes:
        the first byte's deadline when streamed): its stream's decoder (SSE, or LMI's JSON lines,
        whether or not one was asked for), else its whole body read by `deadline`; a status that
        is not a success raised as the gateway's error (the answer then closed here). `what`:
        what a success would have been, for that error."""
        client = self._client or self.client
        request.trace.answered(None)  # this try's upstream says its own, if any
        answer: UpstreamResponse | None = None
        raw = b""
        try:
            # one timer for every wait of the answer (gateway/core/deadline.py), the caller's
            answer = await until.wait(client.post(path, sent, request.trace.headers()))
            request.trace.answered(answer.headers.get("x-request-id"))
            status = answer.status
            decoder = decoder_for(answer.media_type) if 200 <= status < 300 else None
            if decoder is None:
                until.when = deadline
                raw = await until.wait(answer.read())
            if status >= 400:
                raise self.status_error(status, raw, answer.headers, request.trace.request_id)
            if not 200 <= status < 300:
                raise BadGateway(f"The upstream model server answered HTTP {status}, not {what}.")
        except BaseException:
            if answer is not None:
                answer.close()
            raise
        return answer, decoder, raw

    def stream_end(
        self, decoder: StreamDecoder, state: StreamState, request: ChatRequest, asked: int | None
    ) -> list[Event]:
        """A stream's last item: its choices' ends and its usage (estimated when it sent none);
        a stream cut before its answer was finished, or with fewer choices than asked, refused."""
        if not decoder.done and state.unfinished:
            raise BadGateway("The upstream closed the stream before the answer was finished.")
        self.check_choices(len(state.seen), asked)
        if state.usage is None:
            self.warn_no_usage()
        return [*state.close(), state.usage or Usage(request.prompt_tokens, state.fragments)]

    # ----- a native pass-through (backends.native_stream) -----------------------------------

    def native_body(self, request: ChatRequest, native: NativeBody) -> dict[str, Any]:
        """The client's body as it came, but for the deployment's model, the policy's edits (its
        bound on the answer, extra parameters it dropped) and whether it streams."""
        extra = native.extra
        body = {k: v for k, v in native.body.items() if k not in extra or k in request.extra}
        body["model"] = self.upstream_model
        if request.stream:
            body["stream"] = True
        else:
            body.pop("stream", None)
        if request.max_tokens is not None:
            body["max_tokens" if native.dialect == "messages" else "max_output_tokens"] = request.max_tokens
        return body

    async def native_answer(self, request: ChatRequest, native: NativeBody) -> EventStream:
        """The answer of an upstream that speaks the client's dialect: its frames, checked and
        read (backends.native_stream), each carried on the events it stands for."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.options.total
        first_deadline = min(deadline, started + self.options.first_byte)
        sent = orjson.dumps(self.native_body(request, native))
        answer: UpstreamResponse | None = None
        until = Deadline(first_deadline if request.stream else deadline)  # one timer for every wait
        try:
            answer, decoder, raw = await self.posted(
                PATHS[native.dialect], sent, request, until, deadline, "an answer"
            )
            if decoder is None:
                yield whole_answer(native.dialect, parse_json(raw))
                return
            reader = native_stream(native.dialect)
            until.when = first_deadline
            async for batch in relayed(answer.read_some, decoder, reader, until, deadline):
                yield batch
        except (UpstreamError, TimeoutError) as exc:
            raise self.transport_error(exc, loop.time() - started) from None
        finally:
            until.close()
            if answer is not None:
                answer.close()

    def completion_events(self, body: Any, request: ChatRequest, asked: int | None) -> list[Event]:
        """A whole chat.completion as events: per choice its text, tool calls and finish; then usage.

        Without upstream usage, completion tokens are estimated (logprob entries, else words).
        """
        if isinstance(body, dict) and body.get("error") is not None:
            raise stream_error(body["error"])
        try:
            events: list[Event] = []
            served = served_by(body)
            if served is not None:
                events.append(served)
            fragments = 0
            given: set[int] = set()
            for choice in body["choices"]:
                index = choice_index(choice, asked or self.capabilities.max_n)
                given.add(index)
                message = choice.get("message") or {}
                text = content_text(message.get("content"))
                logprobs = token_logprobs(choice.get("logprobs"))
                if text or logprobs:
                    events.append(TextDelta(index, text, logprobs))
                    fragments += len(logprobs) if logprobs else len(text.split())
                refusal = message.get("refusal")
                if isinstance(refusal, str):
                    refusal_logprobs = token_logprobs(choice.get("logprobs"), "refusal")
                    events.append(RefusalDelta(index, refusal, refusal_logprobs))
                    fragments += len(refusal_logprobs) if refusal_logprobs else len(refusal.split())
                calls = list(message.get("tool_calls") or ())
                if message.get("function_call") and not calls:  # llama.cpp gives a call as both
                    calls.append({"function": message["function_call"]})
                for position, call in enumerate(calls):
                    function = call.get("function") or {}
                    arguments = arguments_text(function.get("arguments"))
                    call_id = call.get("id") or new_call_id()
                    events.append(
                        ToolCallDelta(index, position, call_id, function.get("name") or "", arguments)
                    )
                    fragments += len(arguments.split())
                events.append(stop_finish(index, choice, text, request.stop))
            usage = read_usage(body.get("usage"))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise malformed(exc) from None
        self.check_choices(len(given), asked)
        if usage is None:
            self.warn_no_usage()
            usage = Usage(request.prompt_tokens, fragments)
        events.append(usage)
        return mark_last_text(events)

    def warn_no_usage(self) -> None:
        if not self._warned_no_usage:
            self._warned_no_usage = True
            log.warning(
                "upstream %s sent no usage: completion tokens are estimated (chunks seen), "
                "prompt tokens as counted at admission (the deployment's tokenizer, else estimated)",
                self.shown_url,
            )

    def check_choices(self, given: int, asked: int | None) -> None:
        """Refuse an answer with fewer choices than asked for: never padded with invented ones."""
        if given == 0:
            raise BadGateway("The upstream model server answered no choice.")
        if asked is None or given >= asked:
            return
        if not self._warned_fewer_choices:
            self._warned_fewer_choices = True
            log.warning(
                "upstream %s answered %d of %d choices: it ignores n; set the deployment's "
                "options.n to fan-out (or refuse)",
                self.shown_url,
                given,
                asked,
            )
        raise UnprocessableContent(
            f"The upstream model server answered {given} of the {asked} choices asked for: it "
            "does not honour n (parameter 'n').",
            param="n",
            loc=["body", "n"],
            value=asked,
            code="UnsupportedParameter",
        )

    # ----- errors -------------------------------------------------------------------------

    def transport_error(self, exc: Exception, elapsed: float) -> GatewayError:
        """A failure to talk to the upstream, as the gateway error the client gets."""
        log.warning("upstream %s: %s: %s", self.shown_url, type(exc).__name__, exc)
        if isinstance(exc, PoolBusy):
            return UpstreamBusy("All connections to the upstream are busy; try again later.")
        if isinstance(exc, ConnectFailed):  # refused, unresolvable, TLS or proxy failed, or too slow
            return UpstreamUnreachable("The upstream model server cannot be reached.")
        if isinstance(exc, TimeoutError):
            return GatewayTimeout(f"The upstream model server did not answer in time ({elapsed:.1f} s).")
        if isinstance(exc, TooLarge):
            return UpstreamAnswerTooLarge(f"The upstream model server's answer is too large: {exc}.")
        return BadGateway(f"The upstream model server's answer could not be read: {exc}.")

    def status_error(
        self, status: int, raw: bytes, headers: Mapping[str, str], request_id: str = ""
    ) -> GatewayError:
        """An upstream error response, as the gateway error the client gets (a 5xx's words stay
        here, in the log under the gateway's request id)."""
        message, param = error_message(raw)
        message = redacted(message, self.client.headers.values())  # it may quote the key it was sent
        if UPSTREAM_STATUSES.answers.get(status) is CREDENTIALS:
            log.error("upstream %s refused the gateway's credentials (%d)", self.shown_url, status)
        else:
            level = logging.WARNING if status >= 500 else logging.INFO
            log.log(
                level, "request %s: upstream %s answered %d: %s", request_id, self.shown_url, status, message
            )
        failure = UpstreamFailure(
            status,
            in_our_words(message, param),
            param,
            headers.get("retry-after"),
            headers.get("x-request-id"),
        )
        return status_error(UPSTREAM_STATUSES, failure)


def basic_authorization(url: str) -> str | None:
    """`user:password@` in a URL as a Basic authorization header."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def in_our_words(message: str, param: str | None) -> str:
    """The upstream's message, or the gateway's own where its advice is for the gateway (the
    upstream's client) and not for the gateway's client."""
    if EXTRA_PARAMETERS_ADVICE.search(message):
        named = re.search(r"\[[^\]]*\]", message)
        names = named.group(0) if named else f"['{param}']" if param else "in the request"
        return f"Extra parameters {names} are not allowed by the upstream model server."
    return message


# ----- the stream ---------------------------------------------------------------------------


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
    begins or the choice finishes. With stop strings, each choice's last characters are kept,
    to tell a matched stop string from the end of the sequence (`finish_reason`).
    """

    __slots__ = ("calls", "finished", "fragments", "n", "seen", "served", "stops", "tails", "usage")

    def __init__(self, n: int, stops: list[str] | None = None) -> None:
        self.n = n
        self.calls: dict[int, dict[int, PendingCall]] = {}
        self.seen: set[int] = set()
        self.finished: set[int] = set()
        self.fragments = 0  # content / tool-call chunks seen: the usage estimate when none is sent
        self.usage: Usage | None = None
        self.stops = stops or []
        self.tails: dict[int, str] = {}
        self.served = False  # ServedBy sent (from the first chunk that says it)

    @property
    def unfinished(self) -> bool:
        return not self.seen or bool(self.seen - self.finished)

    def feed(self, chunk: Any) -> list[Event]:
        if isinstance(chunk, dict) and "choices" not in chunk:
            if chunk.get("error") is not None:
                raise stream_error(chunk["error"])
            if isinstance(chunk.get("message"), str) and ("code" in chunk or "type" in chunk):
                raise stream_error(chunk)  # LMI (DJL Serving): {code, type, message}
        events: list[Event] = []
        try:
            # most upstreams say neither in any chunk, or null in every one: asked with two key
            # lookups, not a call
            if (
                not self.served
                and (chunk.get("system_fingerprint") is not None or chunk.get("service_tier") is not None)
                and (served := served_by(chunk)) is not None
            ):
                events.append(served)
                self.served = True
            for choice in chunk.get("choices") or ():
                index = choice_index(choice, self.n)
                self.seen.add(index)
                delta = choice.get("delta") or {}
                text = delta.get("content")
                given = choice.get("logprobs")  # most streams ask for none: no call a chunk
                logprobs = token_logprobs(given) if given else None
                if text or logprobs:
                    if type(text) is not str:
                        text = content_text(text)
                    events.append(TextDelta(index, text, logprobs))
                    self.fragments += 1
                    if self.stops:
                        self.tails[index] = (self.tails.get(index, "") + text)[-STOP_TAIL:]
                refusal = delta.get("refusal")
                if isinstance(refusal, str) and refusal:
                    events.append(
                        RefusalDelta(index, refusal, token_logprobs(choice.get("logprobs"), "refusal"))
                    )
                    self.fragments += 1
                calls = delta.get("tool_calls")
                if delta.get("function_call") and not calls:  # the legacy form, alone
                    calls = [{"index": 0, "function": delta["function_call"]}]
                if calls:
                    self.collect(index, calls, events)
                    self.fragments += 1
                reason = choice.get("finish_reason")
                if reason:
                    self.flush(index, events)
                    tail = self.tails.get(index, "")
                    events.append(stop_finish(index, choice, tail, self.stops))
                    self.finished.add(index)
            if chunk.get("usage"):
                self.usage = read_usage(chunk["usage"])
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise malformed(exc) from None
        return mark_last_text(events) if len(events) > 1 else events  # most chunks: one event

    def collect(self, index: int, fragments: list[dict[str, Any]], events: list[Event]) -> None:
        pending = self.calls.setdefault(index, {})
        for fragment in fragments:
            call_index = fragment.get("index", 0)
            function = fragment.get("function") or {}
            call = pending.get(call_index)
            if call is None:
                # a new call begins: the earlier calls of this choice are complete
                for earlier in sorted(k for k in pending if k < call_index):
                    events.append(self.finished_call(index, pending.pop(earlier)))
                call = pending[call_index] = PendingCall(call_index, "", "")
            call.id = call.id or fragment.get("id") or ""
            call.name = call.name or function.get("name") or ""
            arguments = function.get("arguments")
            if arguments:
                call.arguments.append(arguments_text(arguments))

    def flush(self, index: int, events: list[Event]) -> None:
        pending = self.calls.pop(index, {})
        for call_index in sorted(pending):
            events.append(self.finished_call(index, pending[call_index]))

    @staticmethod
    def finished_call(index: int, call: PendingCall) -> ToolCallDelta:
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
        raise not_json(raw) from None


def not_json(raw: bytes) -> BadGateway:
    return BadGateway(f"The upstream model server sent a malformed response: {snippet(raw)!r}")


def malformed(exc: Exception) -> BadGateway:
    return BadGateway(f"The upstream model server sent an unexpected response ({type(exc).__name__}: {exc}).")


def choices_asked(request: ChatRequest) -> int | None:
    """How many choices the upstream is asked for: the request's `n`, or one an extra parameter
    passes through (Azure's document has no `n`); None when that is not a count."""
    if "n" not in request.extra:
        return request.n
    n = request.extra["n"]
    return n if type(n) is int and n >= 1 else None


async def refused_n(asked: int) -> EventStream:
    """A deployment with `options.n: refuse` asked for several choices: 422 naming n."""
    raise UnprocessableContent(
        f"The model returns one choice per request; {asked} were asked for (parameter 'n').",
        param="n",
        loc=["body", "n"],
        value=asked,
        code="UnsupportedParameter",
    )
    yield  # an async generator, so the refusal comes with its first event, as every failure does


def choice_index(choice: Mapping[str, Any], n: int) -> int:
    index = choice.get("index", 0)
    if not isinstance(index, int) or not 0 <= index < n:
        raise ValueError(f"choice index {index!r} outside 0..{n - 1}")
    return index


def arguments_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def token_logprobs(logprobs: Any, part: str = "content") -> list[TokenLogprob] | None:
    """A choice's logprobs for its `content` (or its `refusal`), `bytes` kept as the upstream
    gave them."""
    if isinstance(logprobs, list):  # LMI wraps the object in a one-element list
        logprobs = logprobs[0] if logprobs else None
    if not logprobs:
        return None
    entries = logprobs.get(part)
    if entries is None:
        return None
    return [
        TokenLogprob(
            token_text(entry["token"]),
            entry.get("logprob"),
            [
                TopLogprob(token_text(top["token"]), top["logprob"], token_bytes(top))
                for top in entry.get("top_logprobs") or ()
            ],
            token_bytes(entry),
        )
        for entry in entries
    ]


def token_bytes(entry: Mapping[str, Any]) -> TokenBytes:
    """A logprob entry's `bytes`: a list of byte values, None when the upstream said null, or
    FROM_TOKEN when it said nothing (each dialect then derives them from the token)."""
    if "bytes" not in entry:
        return FROM_TOKEN
    said = entry["bytes"]
    if said is None:
        return None
    if not isinstance(said, list) or not all(type(b) is int and 0 <= b <= 255 for b in said):
        raise ValueError(f"logprob bytes {snippet(orjson.dumps(said), 60)!r} are not byte values")
    return said


def served_by(body: Mapping[str, Any]) -> ServedBy | None:
    """The answer's `system_fingerprint` and `service_tier`, if the upstream said either."""
    fingerprint, tier = body.get("system_fingerprint"), body.get("service_tier")
    fingerprint = fingerprint if isinstance(fingerprint, str) else None
    tier = tier if isinstance(tier, str) else None
    return ServedBy(fingerprint, tier) if fingerprint is not None or tier is not None else None


def token_text(token: Any) -> str:
    """A token as text (LMI's streamed top_logprobs may give a token id, a number)."""
    return token if isinstance(token, str) else str(token)


def finish_reason(choice: Mapping[str, Any], text: str, stops: list[str]) -> FinishReason:
    """The canonical finish reason of a choice; see the module's docstring for `stop_sequence`."""
    reason = choice.get("finish_reason")
    canonical = FINISH_REASONS.get(reason, "stop") if isinstance(reason, str) else "stop"
    if canonical != "stop":
        return canonical
    for said in ("stop_reason", "matched_stop"):  # vLLM, SGLang
        if said in choice:
            return "stop_sequence" if isinstance(choice[said], str) else "stop"
    if reason == "stop" and stops and text.endswith(tuple(stops)):
        return "stop_sequence"
    return "stop"


def matched_stop(choice: Mapping[str, Any], text: str, stops: list[str]) -> str | None:
    """Which stop string ended a choice: the upstream's word (vLLM's `stop_reason`, SGLang's
    `matched_stop`), else the one the text ends with (an upstream that keeps the match), else the
    request's only one; None when it cannot be told."""
    for said in ("stop_reason", "matched_stop"):
        if isinstance(choice.get(said), str):
            return choice[said]
    return ending(text, stops) or (stops[0] if len(stops) == 1 else None)


def stop_finish(index: int, choice: Mapping[str, Any], text: str, stops: list[str]) -> Finish:
    """A choice's Finish, with the stop string that matched when it ended on one."""
    reason = finish_reason(choice, text, stops)
    if reason != "stop_sequence":
        return Finish(index, reason)
    return Finish(index, reason, matched_stop(choice, text, stops))


def read_usage(usage: Any) -> Usage | None:
    if not usage:
        return None
    completion = counts(usage.get("completion_tokens_details"), CompletionTokensDetails.__slots__)
    prompt = counts(usage.get("prompt_tokens_details"), PromptTokensDetails.__slots__)
    return Usage(
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        CompletionTokensDetails(**completion) if completion is not None else None,
        PromptTokensDetails(**prompt) if prompt is not None else None,
    )


def counts(details: Any, names: tuple[str, ...]) -> dict[str, int] | None:
    """The token counts a usage details object gives, of those the canonical Usage knows."""
    if not isinstance(details, dict):
        return None
    return {name: details[name] for name in names if type(details.get(name)) is int}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


async def drained(read: Callable[[], Awaitable[bytes]]) -> None:
    """What follows a stream's end marker read and dropped, for a while."""
    try:
        async with asyncio.timeout(DRAIN_AFTER_DONE_SECONDS):
            while await read():
                pass
    except (UpstreamError, TimeoutError):
        pass


def stream_error(error: Any) -> GatewayError:
    """An error the upstream sent in place of a completion or chunk (its words made safe)."""
    message = error.get("message") if isinstance(error, dict) else error
    log.warning("upstream reported an error in its answer: %s", message)
    shown = client_safe(message if isinstance(message, str) else orjson.dumps(message).decode())
    return BadGateway(f"The upstream model server reported an error: {shown}")
