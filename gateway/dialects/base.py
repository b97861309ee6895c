"""What every dialect shares: reading an OpenAI-shaped chat body, rendering OpenAI-shaped
completions and chunks, and the handler flow. A dialect subclasses `Dialect` and changes
only what its document says differently (names, finish reasons, error body, framing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from connexion.context import scope as request_scope
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Scope

from gateway.core.canonical import (
    ChatRequest,
    Choice,
    Completion,
    Event,
    Finish,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    answer_too_large,
    gather,
)
from gateway.core.errors import Forbidden, GatewayError, InternalError, UnprocessableContent
from gateway.framing import SSE, Framing
from gateway.policy.auth import Caller
from gateway.streaming import EventStreamResponse
from gateway.trace import TRACE_SCOPE_KEY, RequestTrace
from gateway.validation import BODY_SCOPE_KEY

if TYPE_CHECKING:
    from gateway.runtime import Runtime
    from gateway.spec import DialectSpec

REQUEST_ID_SCOPE_KEY = "chatgate.request_id"
log = logging.getLogger("chatgate")
JSON = "application/json"

# Request fields the canonical request holds; everything else the spec defines goes to `options`.
CANONICAL_FIELDS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "user",
    }
)


@dataclass(slots=True)
class ResponseContext:
    """What every body of one response shares."""

    id: str
    created: int
    model: str
    request: ChatRequest


class Dialect:
    name: ClassVar[str]
    spec_file: ClassVar[str]
    default_mount: ClassVar[str]
    framing: ClassVar[Framing] = SSE
    id_prefix: ClassVar[str] = "chatcmpl-"
    # canonical finish reason → the dialect's word
    finish_reasons: ClassVar[dict[str, str]] = {
        "stop": "stop",
        "stop_sequence": "stop",
        "length": "length",
        "tool_calls": "tool_calls",
        "content_filter": "content_filter",
    }
    usage_in_every_chunk: ClassVar[bool] = False
    chat_operations: ClassVar[tuple[str, ...]] = ()
    # what a token's logprob reads when the backend gave none (Aleph Alpha documents -9999.0)
    missing_logprob: ClassVar[float | None] = None
    # whether each choice's stream opens with a chunk that carries only the role (OpenAI does)
    separate_role_chunk: ClassVar[bool] = True
    # the delta of the chunk that carries a finish reason (some dialects require `content`)
    finish_delta: ClassVar[dict[str, Any]] = {}

    def __init__(self, runtime: Runtime, spec: DialectSpec) -> None:
        self.runtime = runtime
        self.spec = spec

    # ----- reading ---------------------------------------------------------------------

    def read_request(self, body: dict[str, Any], headers: Headers) -> ChatRequest:
        """Dialect body → canonical request. Parameters the spec does not define go to `extra`."""
        body = self.screen_unsupported(body)
        defined = self.spec.chat_fields
        options = {k: v for k, v in body.items() if k in defined and k not in CANONICAL_FIELDS}
        extra = {k: v for k, v in body.items() if k not in defined}
        stop = body.get("stop")
        tools = list(body.get("tools") or [])
        tool_choice = body.get("tool_choice")
        if body.get("functions"):  # legacy functions → tools
            tools += [{"type": "function", "function": f} for f in body["functions"]]
            legacy_choice = body.get("function_call")
            if isinstance(legacy_choice, dict):
                tool_choice = {"type": "function", "function": legacy_choice}
            elif legacy_choice is not None:
                tool_choice = legacy_choice
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        return ChatRequest(
            model=body.get("model"),
            messages=body["messages"],
            stream=bool(body.get("stream")),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            n=body.get("n") or 1,
            max_tokens=max_tokens,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            seed=body.get("seed"),
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            frequency_penalty=body.get("frequency_penalty"),
            presence_penalty=body.get("presence_penalty"),
            logit_bias=body.get("logit_bias"),
            logprobs=bool(body.get("logprobs")),
            top_logprobs=body.get("top_logprobs") or 0,
            response_format=body.get("response_format"),
            tools=tools,
            tool_choice=tool_choice,
            user=body.get("user"),
            options=options,
            extra=extra,
        )

    def screen_unsupported(self, body: dict[str, Any]) -> dict[str, Any]:
        """Refuse parameters the document marks rejected; drop those it marks ignored."""
        unsupported = self.spec.unsupported
        if not unsupported:
            return body
        present = [name for name in body if name in unsupported and body[name] is not None]
        for name in present:
            if unsupported[name] == "rejected":
                raise UnprocessableContent(
                    f"The parameter '{name}' is not supported by this API.",
                    param=name,
                    loc=["body", name],
                    value=body[name],
                    code="UnsupportedParameter",
                )
        ignored = {name for name in present if unsupported[name] == "ignored"}
        return {k: v for k, v in body.items() if k not in ignored} if ignored else body

    def check_request(self, request: ChatRequest) -> None:
        """Dialect rules the schema cannot express; raise a GatewayError to refuse."""

    # ----- rendering -------------------------------------------------------------------

    @staticmethod
    def token_bytes(token: str) -> list[int]:
        return list(token.encode())

    def logprobs_body(self, logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
        if logprobs is None:
            return None
        return {
            "content": [
                {
                    "token": lp.token,
                    "logprob": self.missing_logprob if lp.logprob is None else lp.logprob,
                    "bytes": self.token_bytes(lp.token),
                    "top_logprobs": [
                        {"token": t.token, "logprob": t.logprob, "bytes": self.token_bytes(t.token)}
                        for t in lp.top
                    ],
                }
                for lp in logprobs
            ],
            "refusal": None,
        }

    @staticmethod
    def tool_call_body(call: ToolCallDelta, with_index: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        if with_index:
            body = {"index": call.call_index, **body}
        return body

    def usage_body(self, usage: Usage) -> dict[str, Any]:
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }

    def message_body(self, choice: Choice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.tool_calls:
            message["content"] = choice.text or None
            message["tool_calls"] = [self.tool_call_body(c, False) for c in choice.tool_calls]
        return message

    def choice_body(self, choice: Choice) -> dict[str, Any]:
        return {
            "index": choice.index,
            "message": self.message_body(choice),
            "logprobs": self.logprobs_body(choice.logprobs),
            "finish_reason": self.finish_reasons[choice.finish_reason or "stop"],
        }

    def completion_body(self, ctx: ResponseContext, completion: Completion) -> dict[str, Any]:
        return {
            "id": ctx.id,
            "object": "chat.completion",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [self.choice_body(c) for c in completion.choices],
            "usage": self.usage_body(completion.usage),
        }

    def chunk_body(
        self, ctx: ResponseContext, choices: list[dict[str, Any]], usage: Usage | None = None
    ) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": ctx.id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = self.usage_body(usage)
        return chunk

    def chunk_choice(
        self,
        index: int,
        delta: dict[str, Any],
        logprobs: list[TokenLogprob] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        return {
            "index": index,
            "delta": delta,
            "logprobs": self.logprobs_body(logprobs),
            "finish_reason": finish_reason,
        }

    def chunks_for(self, ctx: ResponseContext, event: Event, started: set[int]) -> list[dict[str, Any]]:
        """The stream chunks one canonical event becomes (often one, sometimes none)."""
        match event:
            case TextDelta(index=i, text=text, logprobs=logprobs):
                delta: dict[str, Any] = {"content": text}
                if i in started:
                    return [self.chunk_body(ctx, [self.chunk_choice(i, delta, logprobs)])]
                started.add(i)
                if not self.separate_role_chunk:
                    delta = {"role": "assistant", **delta}
                    return [self.chunk_body(ctx, [self.chunk_choice(i, delta, logprobs)])]
                return [
                    self.chunk_body(ctx, [self.chunk_choice(i, {"role": "assistant", "content": ""})]),
                    self.chunk_body(ctx, [self.chunk_choice(i, delta, logprobs)]),
                ]
            case ToolCallDelta(index=i):
                delta = {"tool_calls": [self.tool_call_body(event, True)]}
                if i not in started:
                    started.add(i)
                    delta = {"role": "assistant", "content": None, **delta}
                return [self.chunk_body(ctx, [self.chunk_choice(i, delta)])]
            case Finish(index=i, reason=reason):
                delta = dict(self.finish_delta)
                if i not in started:
                    delta = {"role": "assistant", "content": "", **delta}
                started.add(i)
                choice = self.chunk_choice(i, delta, finish_reason=self.finish_reasons[reason])
                return [self.chunk_body(ctx, [choice])]
            case Usage():
                if ctx.request.include_usage or self.usage_in_every_chunk:
                    return [self.chunk_body(ctx, [], usage=event)]
        return []

    def error_body(self, error: GatewayError, request_id: str) -> dict[str, Any]:
        return {
            "error": {
                "message": error.message,
                "type": error.kind,
                "param": error.param,
                "code": error.code,
            }
        }

    def error_headers(self, error: GatewayError) -> dict[str, str]:
        return dict(error.headers)

    def error_response(self, error: GatewayError, request_id: str) -> Response:
        return Response(
            orjson.dumps(self.error_body(error, request_id)),
            status_code=error.status,
            media_type=JSON,
            headers=self.error_headers(error),
        )

    # ----- the handler flow ------------------------------------------------------------

    def forbidden_deployment(self, deployment: str) -> GatewayError:
        """What a key gets for a deployment it may not use (dialects differ: 403 or 404)."""
        return Forbidden(
            f"This key may not use the deployment '{deployment}'.",
            param="model",
            code="DeploymentNotAllowed",
        )

    async def chat_operation(self) -> Response:
        """The chat operation as Connexion calls it (see gateway.fast_path for the usual way)."""
        return await self.chat(request_scope._get_current_object())

    async def chat(self, scope: Scope) -> Response:
        """Read → policy → route → generate → render, for the request in `scope`."""
        headers = Headers(scope=scope)
        trace: RequestTrace = scope[TRACE_SCOPE_KEY]
        request = self.read_request(scope[BODY_SCOPE_KEY], headers)
        trace.stream = request.stream
        self.check_request(request)
        token_info = scope.get("extensions", {}).get("connexion_context", {}).get("token_info", {})
        caller = token_info.get("caller") or Caller(None)
        admission = await self.runtime.admit(self, request, headers, caller, trace)
        deployment = admission.deployment
        events = self.runtime.generate(admission, request, trace)
        ctx = ResponseContext(
            id=self.id_prefix + os.urandom(16).hex(),
            created=int(time.time()),
            model=request.model or deployment.model,
            request=request,
        )
        if not request.stream:
            completion = await gather(events, request.n, self.runtime.settings.server.max_response_bytes)
            response = Response(orjson.dumps(self.completion_body(ctx, completion)), media_type=JSON)
            response.raw_headers += admission.headers
            return response
        # Wait for the first event a little: errors before the first byte are still HTTP
        # errors. If it is slow, start the stream and keep it alive while waiting.
        first = asyncio.ensure_future(anext(events, None))
        keepalive = deployment.config.timeouts.keepalive if self.framing.keepalive else None
        await asyncio.wait({first}, timeout=keepalive)
        if first.done() and first.exception() is not None:
            await events.aclose()
            raise first.exception()
        return EventStreamResponse(
            self.stream(ctx, first, events, scope.get(REQUEST_ID_SCOPE_KEY, ""), keepalive),
            self.framing.media_type,
            admission.headers,
        )

    async def stream(
        self,
        ctx: ResponseContext,
        first: asyncio.Future[Event | None],
        events: AsyncIterator[Event],
        rid: str,
        keepalive: float | None,
    ) -> AsyncIterator[bytes]:
        frame = self.framing.frame
        started: set[int] = set()
        room = self.runtime.settings.server.max_response_bytes
        try:
            while not first.done():
                await asyncio.wait({first}, timeout=keepalive)
                if not first.done():
                    yield self.framing.keepalive
            event = first.result()
            if event is not None:
                # the chunks of one event go out in one write (a choice's role chunk and its
                # first text arrive together)
                if chunks := self.chunks_for(ctx, event, started):
                    data = b"".join(map(frame, chunks))
                    room -= len(data)
                    yield data
                async for event in events:
                    if chunks := self.chunks_for(ctx, event, started):
                        data = b"".join(map(frame, chunks))
                        room -= len(data)
                        if room < 0:
                            raise answer_too_large(self.runtime.settings.server.max_response_bytes)
                        yield data
        except GatewayError as error:
            yield frame(self.error_body(error, rid))
            return
        except Exception:  # an unexpected fault mid-stream: report it in shape, never hang
            log.exception("stream failed")
            yield frame(self.error_body(InternalError("The backend failed mid-stream."), rid))
            return
        finally:
            if not first.done():
                first.cancel()
                with contextlib.suppress(BaseException):
                    await first
            await events.aclose()
        if self.framing.done is not None:
            yield self.framing.done
