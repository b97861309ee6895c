"""The chat request's one flow, the same for every dialect:

    translator.read → policy.admit (gateway/policy/pipeline.py; images screened in dialects
    that say so) → policy.answer or policy.complete (router, dispatch, backend, the answer's
    policy)
    → translator.completion, or translator.chunks written by its framing (gateway/dialects/framing.py)

The translator (gateway/dialects/translator.py) only translates and the policy pipeline only
decides; this module is the only one that calls both. Its inputs are explicit: the front door's
`Call`, the dialect's translator, the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import (
    ChatRequest,
    Event,
    EventStream,
    Folded,
    Item,
    ServedBy,
    TextDelta,
    Usage,
    answer_too_large,
)
from gateway.core.disconnect import unless_client_leaves
from gateway.core.errors import ClientGone, GatewayError, InternalError
from gateway.core.ids import random_hex
from gateway.core.trace import Trace
from gateway.dialects.dialect import ChatHook, Dialect
from gateway.dialects.translator import JSON, Answer, Translator
from gateway.fleet.dispatch import QueueWait
from gateway.http.call import Call
from gateway.http.streaming import EventStreamResponse, PieceWriter
from gateway.policy.admission import Admission
from gateway.runtime import Runtime

log = logging.getLogger("chatgate")


async def until_content(events: EventStream) -> list[Item]:
    """The items up to and including the first that holds a token, a tool call, a finish or a
    usage (not only who served it, nor an empty text: a role-only first chunk); all of them if
    the answer ends first."""
    held: list[Item] = []
    async for item in events:
        held.append(item)
        if any(map(is_content, item if isinstance(item, list) else (item,))):
            break
    return held


def ends(item: Item) -> bool:
    """Whether an item ends the answer (its last event is the Usage every answer ends with)."""
    return isinstance(item[-1] if isinstance(item, list) else item, Usage)


def is_content(event: Event) -> bool:
    if isinstance(event, TextDelta):
        return bool(event.text or event.logprobs)
    return not isinstance(event, ServedBy)


class ChatPipeline:
    """The handler of a dialect's chat operations."""

    def __init__(
        self, runtime: Runtime, dialect: Dialect, translator: Translator[Any], hook: ChatHook | None = None
    ) -> None:
        self.runtime = runtime
        self.hook = hook  # what the operation does around the flow (None for nearly all)
        self.policy = runtime.pipeline
        self.translator = translator
        # a begun text's pieces framed from a template (gateway/dialects/text_pieces.py); None
        # where the translator has none, or says it never makes one (LMI): no call a piece
        self.text_frame = getattr(translator, "text_frame", None)
        if not getattr(translator, "text_templated", True):
            self.text_frame = None
        self.routing_header = dialect.routing_header
        self.screens_media = dialect.screens_media
        self.max_response_bytes = runtime.settings.server.max_response_bytes

    async def __call__(self, call: Call) -> Response:
        """Counted on the runtime from here until the answer has ended (a stream's last chunk):
        a reload closes what it retires only when its requests have ended."""
        self.runtime.began()
        streaming = False
        try:
            response = await self.answer(call)
            streaming = isinstance(response, EventStreamResponse)
            return response
        finally:
            if not streaming:
                self.runtime.ended()

    async def answer(self, call: Call) -> Response:
        translator, policy = self.translator, self.policy
        request = translator.read(call.body)
        request.trace = call.record.ids = Trace.from_request(call.request_id, call.headers)
        call.record.stream = request.stream
        if self.hook is not None:
            await self.hook.before(call, request)
        deployment_name = call.headers.get(self.routing_header) if self.routing_header else None
        receive = call.receive if self.screens_media else None
        admission = await policy.admit(
            request, call.headers, call.caller, call.record, deployment_name, receive
        )
        try:
            return await self.respond(call, request, admission)
        except BaseException:
            await policy.end(admission)  # ended before an answer could settle it
            raise

    async def respond(self, call: Call, request: ChatRequest, admission: Admission) -> Response:
        translator, runtime, policy = self.translator, self.runtime, self.policy
        answer = Answer(
            id=translator.id_prefix + random_hex(),
            created=int(time.time()),
            model=request.model or admission.deployment.model,
            request=request,
        )
        if not request.stream:
            whole = Folded(self.max_response_bytes)  # refuses an answer past the limit as it grows
            await unless_client_leaves(policy.complete(admission, whole.add_item), call.receive, call.client)
            completion = whole.completion()
            body = translator.completion(answer, completion)
            if self.hook is not None:
                await self.hook.answered(call, answer, body)
            response = Response(orjson.dumps(body), media_type=JSON)
            response.raw_headers += admission.headers
            return response
        queue = QueueWait()
        events = policy.answer(admission, queue)
        # Hold the 200 until the first token: until then every failure is still an HTTP error
        # in the dialect's shape (a role-only first chunk or a keep-alive would have sent the
        # 200 and left the failure to an error event). Past the hold (for clients behind idle
        # timeouts) the stream starts and keeps itself alive while it waits.
        first = asyncio.ensure_future(until_content(events))
        framing = translator.framing
        timeouts = admission.deployment.config.timeouts
        hold = timeouts.headers if framing.keepalive else None
        try:
            await unless_client_leaves(until_started(first, hold, queue), call.receive, call.client)
        except ClientGone:
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
            await events.aclose()
            raise
        if first.done() and (failure := first.exception()) is not None:
            await events.aclose()
            raise failure
        keepalive = timeouts.keepalive if framing.keepalive else None

        async def ended() -> None:
            """However the stream ended (even before its body began): the upstream closed, an
            unsettled reservation released, the request counted out of the runtime."""
            try:
                if not first.done():
                    first.cancel()
                    with contextlib.suppress(BaseException):  # off the generator before closing it
                        await first
                await events.aclose()
                await policy.end(admission)
            finally:
                runtime.ended()

        return EventStreamResponse(
            functools.partial(self.stream, answer, first, events, call, keepalive),
            framing.media_type,
            admission.headers,
            call.record,
            on_end=ended,
        )

    def rendered(self, answer: Answer, item: Item, state: Any) -> bytes:
        """An item's chunks, framed, as one piece; a begun text's pieces framed from its template
        where the translator has one (`text_frame`), the rest by `chunks` and the framing."""
        templated, translator = self.text_frame, self.translator
        if isinstance(item, list):
            if len(item) != 1:  # a read that brought several events: one loop, one join
                frame, chunks = translator.framing.frame, translator.chunks
                pieces: list[bytes] = []
                for event in item:
                    if templated and type(event) is TextDelta and (piece := templated(answer, event, state)):
                        pieces.append(piece)
                    else:
                        pieces += map(frame, chunks(answer, event, state))
                return b"".join(pieces)
            item = item[0]  # most of a stream's items: one event
        if templated and type(item) is TextDelta and (piece := templated(answer, item, state)):
            return piece
        return b"".join(map(translator.framing.frame, translator.chunks(answer, item, state)))

    async def stream(
        self,
        answer: Answer,
        first: asyncio.Future[list[Item]],
        events: EventStream,
        call: Call,
        keepalive: float | None,
        write: PieceWriter,
    ) -> None:
        """The answer's events written as the dialect's stream, each item rendered and sent as it
        comes (the stream's one loop past the dispatcher's); a failure ends it with an error in
        the dialect's shape (an error event its SDKs raise on), never an invented finish reason."""
        translator, hook = self.translator, self.hook
        framing = translator.framing
        state = translator.new_stream_state()
        room = self.max_response_bytes
        try:
            while not first.done():
                await asyncio.wait({first}, timeout=keepalive)
                if not first.done() and framing.keepalive is not None:
                    await written(write, framing.keepalive)
            held = first.result()
            if held:
                # what came up to the first token goes out in one write (a choice's role chunk
                # and its first text arrive together)
                last = ends(held[-1])  # the whole answer came at once
                if data := b"".join(self.rendered(answer, item, state) for item in held):
                    room -= len(data)
                    if last and hook is not None:
                        await hook.streamed(call, answer, state)  # kept before the client reads the end
                    await written(write, data, last)
                if not last:
                    # a turn of the loop, so that the first chunk leaves now: the edge joins
                    # what one turn writes, and a burst the upstream sent at once (all read in
                    # this turn) would otherwise hold it back until the burst was rendered; an
                    # answer that came whole goes out with its end instead
                    await asyncio.sleep(0)
                rendered = self.rendered
                async for item in events:
                    if data := rendered(answer, item, state):
                        room -= len(data)
                        if room < 0:
                            raise answer_too_large(self.max_response_bytes)
                        last = ends(item)  # to go out with the stream's end, in one write
                        if last and hook is not None:
                            await hook.streamed(call, answer, state)
                        if (waiting := write(data, last)) is not None:  # the client is slow to take it
                            await waiting
        except GatewayError as error:
            # the status went out as 200 with the first byte; the record says how it ended
            call.record.error_code = error.code
            await written(write, framing.error(translator.stream_error(error, call.request_id, state)), True)
            return
        except Exception:  # an unexpected fault mid-stream: report it in shape, never hang
            log.exception("stream failed")
            failure = InternalError("The backend failed mid-stream.")
            call.record.error_code = failure.code
            ended = framing.error(translator.stream_error(failure, call.request_id, state))
            await written(write, ended, True)
            return
        finally:
            if not first.done():
                first.cancel()
                with contextlib.suppress(BaseException):
                    await first
            await events.aclose()
        if framing.done is not None:
            await written(write, framing.done, True)


async def written(write: PieceWriter, data: bytes, last: bool = False) -> None:
    """A piece of a stream's body written, once the client has taken enough of the earlier ones."""
    if (waiting := write(data, last)) is not None:
        await waiting


async def until_started(first: asyncio.Future, hold: float | None, queue: QueueWait) -> None:
    """Until the first token, or `hold` seconds after a replica took the request: a request
    waiting in a queue for one has no status yet (its 503 must come before any byte of a 200)."""
    await asyncio.wait({first}, timeout=hold)
    while queue.queued and not first.done():
        await asyncio.wait({first}, timeout=hold)
