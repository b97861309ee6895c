"""Stored responses: what `store` keeps (the response, its input items and the whole conversation
up to it), how `previous_response_id` continues one (its history put before the input, before
admission, so limits and budgets count it), and the operations that read, list, delete and cancel
them. Every record is kept under its key's identity: another key finds nothing (404)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from gateway.core.canonical import ChatRequest, NativeBody
from gateway.core.errors import BadRequest, NotFound
from gateway.core.ids import random_hex
from gateway.core.token_count import estimate
from gateway.dialects.dialect import Handler, ModelDirectory, OperationCall, ResponseStore
from gateway.dialects.responses.reading import Echo, is_reference, messages_of, read
from gateway.dialects.translator import JSON, Answer, DocumentFacts, Translator

ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def not_found(response_id: str, param: str = "response_id") -> NotFound:
    return NotFound(f"No response found with id '{response_id}'.", param=param, code="not_found")


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input items as stored and listed, as OpenAI lists them: each with its `type`, an id (the
    client's, or made) and a status; a message's content as parts."""
    return [stored_item(item) for item in items]


def stored_item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type") or "message"
    stored = {**item, "type": kind}
    if not stored.get("id"):
        stored["id"] = ID_PREFIXES.get(kind, "item_") + random_hex()
    if kind in ("message", "function_call", "function_call_output"):
        stored["status"] = stored.get("status") or "completed"
    if kind == "reasoning":
        stored.setdefault("summary", [])
    if kind == "message":
        content = stored["content"]
        if stored["role"] == "assistant":
            text = content if isinstance(content, str) else "".join(
                p.get("text") or p.get("refusal") or "" for p in content
            )  # fmt: skip
            stored["content"] = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        elif isinstance(content, str):
            stored["content"] = [{"type": "input_text", "text": content}]
    return stored


class ResponseKeeping:
    """The Responses chat operation's hook (gateway.dialects.dialect.ChatHook)."""

    def __init__(self, directory: ModelDirectory, translator: Translator[Any]) -> None:
        self.directory = directory

    @property
    def store(self) -> ResponseStore:
        return self.directory.responses

    async def before(self, call: OperationCall, request: ChatRequest) -> None:
        echo = request.echo
        if isinstance(echo, Echo) and (echo.previous_response_id is not None or echo.references):
            await expand(self.store, call.caller.identity, request, echo)
            if request.native is not None:  # an upstream that speaks Responses knows none of it
                request.native = continued(request.native, echo)

    async def answered(self, call: OperationCall, answer: Answer, body: Any) -> None:
        await self.keep(call, answer, body)

    async def streamed(self, call: OperationCall, answer: Answer, state: Any) -> None:
        if state.response is not None:
            await self.keep(call, answer, state.response)

    async def keep(self, call: OperationCall, answer: Answer, response: dict[str, Any]) -> None:
        echo = answer.request.echo
        if not isinstance(echo, Echo) or not echo.store:
            return
        items = with_ids(echo.items)
        record = {
            "response": response,
            "input": items,
            "history": [*echo.history, *items, *response["output"]],
        }
        await self.store.put(call.caller.identity, answer.id, record)


def continued(native: NativeBody, echo: Echo) -> NativeBody:
    """A continued conversation's body for an upstream that takes Responses: the stored history
    and the resolved input as its input, no `previous_response_id` (the id is this gateway's)."""
    body = {k: v for k, v in native.body.items() if k != "previous_response_id"}
    body["input"] = [*(upstream_item(item) for item in echo.history), *echo.items]
    return NativeBody(native.dialect, body, native.extra)


def upstream_item(item: dict[str, Any]) -> dict[str, Any]:
    """A stored item as input: without the ids and status this gateway gave it."""
    return {k: v for k, v in item.items() if k not in ("id", "status")}


async def expand(store: ResponseStore, owner: str, request: ChatRequest, echo: Echo) -> None:
    """The stored conversation `previous_response_id` names put before the request's input, and
    the items its input names by id (`item_reference`) found in it (404 when not there)."""
    previous = echo.previous_response_id
    if previous is not None:
        record = await store.get(owner, previous)
        if record is None:
            raise not_found(previous, "previous_response_id")
        echo.history = record["history"]
    at = echo.history_at
    if echo.references:
        known = {item.get("id"): item for item in echo.history}
        resolved = []
        for index, item in enumerate(echo.items):
            if is_reference(item):
                found = known.get(item.get("id"))
                if found is None:
                    raise NotFound(
                        f"No item found with id '{item.get('id')}'.", param=f"input.{index}", code="not_found"
                    )
                item = found
            resolved.append(item)
        echo.items = resolved
        del request.messages[at:]
        request.messages += messages_of(resolved, [])
    request.messages[at:at] = messages_of(echo.history, [], "previous_response_id")


def operations(directory: ModelDirectory, translator: Translator[Any]) -> dict[str, Handler]:
    """The stored responses' own operations, answered for the caller's key only."""

    async def get_response(call: OperationCall) -> Response:
        response_id = call.path_params["response_id"]
        record = await directory.responses.get(call.caller.identity, response_id)
        if record is None:
            raise not_found(response_id)
        return Response(orjson.dumps(record["response"]), media_type=JSON)

    async def delete_response(call: OperationCall) -> Response:
        response_id = call.path_params["response_id"]
        if not await directory.responses.delete(call.caller.identity, response_id):
            raise not_found(response_id)
        return Response(
            orjson.dumps({"id": response_id, "object": "response", "deleted": True}), media_type=JSON
        )

    async def list_input_items(call: OperationCall) -> Response:
        response_id = call.path_params["response_id"]
        record = await directory.responses.get(call.caller.identity, response_id)
        if record is None:
            raise not_found(response_id)
        query = call.query
        items = list(record["input"])
        if query.get("order", "desc") == "desc":
            items.reverse()
        after = query.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise BadRequest(f"No input item with id '{after}' in this response.", param="after")
            items = items[ids.index(after) + 1 :]
        limit = int(query.get("limit", 20))
        page = items[:limit]
        listed = {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
        return Response(orjson.dumps(listed), media_type=JSON)

    async def cancel_response(call: OperationCall) -> Response:
        response_id = call.path_params["response_id"]
        if await directory.responses.get(call.caller.identity, response_id) is None:
            raise not_found(response_id)
        raise BadRequest(
            "Only a response created with background=true can be cancelled, and this gateway runs "
            "none in the background: this one has already ended.",
            param="response_id",
            code="cannot_cancel",
        )

    async def count_input_tokens(call: OperationCall) -> Response:
        body = call.body or {}
        request = read(DocumentFacts(frozenset(body)), body)  # only the input counts: nothing is extra
        echo = request.echo
        if isinstance(echo, Echo) and (echo.previous_response_id is not None or echo.references):
            await expand(directory.responses, call.caller.identity, request, echo)
        counted = {"object": "response.input_tokens", "input_tokens": estimate(request.messages)}
        return Response(orjson.dumps(counted), media_type=JSON)

    return {
        "getResponse": get_response,
        "deleteResponse": delete_response,
        "listInputItems": list_input_items,
        "cancelResponse": cancel_response,
        "getInputTokenCounts": count_input_tokens,
    }
