"""Recorded native streams (Anthropic's Messages, OpenAI's Responses) as frames: whole ones, and
the broken orders llama.cpp's server sends when its first token is an incomplete UTF-8 sequence
(the real-servers audit). Read by the native pass-through's tests."""

from __future__ import annotations

from typing import Any


def message_start(input_tokens: int = 9) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_up",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "tiny",
            "usage": {"input_tokens": input_tokens, "output_tokens": 0, "cache_read_input_tokens": 4},
        },
    }


def text_block(index: int, *texts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}
            for t in texts
        ),
        {"type": "content_block_stop", "index": index},
    ]


MESSAGE_END = [
    {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"output_tokens": 8},
    },
    {"type": "message_stop"},
]

GOOD_MESSAGES = [
    message_start(),
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}},
    {"type": "content_block_stop", "index": 0},
    *text_block(1, "Hel", "lo"),
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 2,
        "delta": {"type": "input_json_delta", "partial_json": '{"city"'},
    },
    {
        "type": "content_block_delta",
        "index": 2,
        "delta": {"type": "input_json_delta", "partial_json": ': "Oslo"}'},
    },
    {"type": "content_block_stop", "index": 2},
    *MESSAGE_END,
]


# llama.cpp's server when the first token is an incomplete UTF-8 sequence: no message_start
LLAMA_NO_MESSAGE_START = [*text_block(0, "\ufffdP", "ke"), *MESSAGE_END]


def created(kind: str = "response.created", sequence: int = 0) -> dict[str, Any]:
    return {
        "type": kind,
        "sequence_number": sequence,
        "response": {
            "id": "resp_up",
            "object": "response",
            "model": "tiny",
            "status": "in_progress",
            "output": [],
        },
    }


def message_item(index: int, *deltas: str) -> list[dict[str, Any]]:
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    where = {"item_id": "msg_1", "output_index": index, "content_index": 0}
    text = "".join(deltas)
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.content_part.added", **where, "part": {"type": "output_text", "text": ""}},
        *({"type": "response.output_text.delta", **where, "delta": d} for d in deltas),
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.content_part.done", **where, "part": {"type": "output_text", "text": text}},
        {"type": "response.output_item.done", "output_index": index, "item": {**item, "status": "completed"}},
    ]


def completed(status: str = "completed") -> dict[str, Any]:
    response = {
        "id": "resp_up",
        "object": "response",
        "model": "tiny",
        "status": status,
        "output": [],
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "usage": {"input_tokens": 9, "output_tokens": 8, "input_tokens_details": {"cached_tokens": 8}},
    }
    return {"type": f"response.{status}", "response": response}


FUNCTION_CALL = [
    {
        "type": "response.output_item.added",
        "output_index": 1,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": ""},
    },
    {"type": "response.function_call_arguments.delta", "output_index": 1, "item_id": "fc_1", "delta": "{}"},
    {
        "type": "response.output_item.done",
        "output_index": 1,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
    },
]
GOOD_RESPONSES = [
    created(),
    created("response.in_progress", 1),
    *message_item(0, "Hel", "lo"),
    *FUNCTION_CALL,
    completed(),
]


# llama.cpp's server when the first token is an incomplete UTF-8 sequence (the audit's order)
LLAMA_CREATED_TWICE = [
    created(),
    created("response.in_progress", 1),
    *message_item(0, "\ufffdP")[:3],
    created("response.created", 4),
]


def llama_unindexed() -> list[dict[str, Any]]:
    """llama.cpp's server's Responses stream as it sends it: items named by `item_id` alone, no
    `output_index`, `content_index` or `sequence_number` (fresh frames: a reader fills them in)."""
    item = {"content": [], "id": "msg_R", "role": "assistant", "status": "in_progress", "type": "message"}
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": "Ej"}
    done = {**item, "status": "completed", "content": [part]}
    response = {"id": "resp_A", "object": "response", "status": "in_progress"}
    usage = {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}
    return [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "item": item},
        {
            "type": "response.content_part.added",
            "item_id": "msg_R",
            "part": {"type": "output_text", "text": ""},
        },
        {"type": "response.output_text.delta", "item_id": "msg_R", "delta": "E"},
        {"type": "response.output_text.delta", "item_id": "msg_R", "delta": "j"},
        {"type": "response.output_text.done", "item_id": "msg_R", "text": "Ej"},
        {"type": "response.content_part.done", "item_id": "msg_R", "part": part},
        {"type": "response.output_item.done", "item": done},
        {
            "type": "response.completed",
            "response": {
                **response,
                "status": "completed",
                "model": "tiny-gguf",
                "output": [done],
                "usage": usage,
            },
        },
    ]
