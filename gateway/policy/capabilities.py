"""What a deployment can do, and the 404 / 422 answers for requests that ask for more.

The backend declares its table (backends.base.Capabilities); the deployment's config may
narrow it (gateway/config/capabilities.py). The checks read that one table, nothing else.
"""

from __future__ import annotations

from typing import Any

from backends.base import Capabilities
from gateway.core.canonical import ChatRequest
from gateway.core.errors import BadRequest, NotFound, UnprocessableContent
from gateway.core.parameters import requested, unasked

MODALITY_MESSAGE = (
    "Modality not supported by the model. Check the documentation of the model to see which "
    "routes are available."
)
PART_MODALITIES = {
    "image_url": "image",
    "image": "image",
    "input_audio": "audio",
    "audio": "audio",
    "file": "file",  # OpenAI's file part: a document (a PDF, say), by id or as data
}


def parts_by_modality(messages: list[dict[str, Any]]) -> dict[str, str]:
    """Each modality the messages use, with where its first part is (`messages[i].content[j]`)."""
    found = {"text": "messages"}
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind in PART_MODALITIES:
                    found.setdefault(PART_MODALITIES[kind], f"messages[{i}].content[{j}]")
    return found


def custom_call_in_history(messages: list[dict[str, Any]]) -> tuple[int, int] | None:
    """Where the first call of a custom tool in an earlier assistant turn is (message, call)."""
    for i, message in enumerate(messages):
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        for j, call in enumerate(calls if isinstance(calls, list) else ()):
            if isinstance(call, dict) and call.get("type", "function") != "function":
                return i, j
    return None


def unsupported(name: str, value: Any, why: str) -> UnprocessableContent:
    return UnprocessableContent(
        f"{why} (parameter '{name}').",
        param=name,
        loc=["body", name],
        value=value,
        code="UnsupportedParameter",
    )


def check(request: ChatRequest, capabilities: Capabilities, prompt_tokens: int) -> None:
    """Refuse what the deployment cannot do: 404 for a modality, 422 for a parameter."""
    used = parts_by_modality(request.messages)
    missing = sorted(set(used) - capabilities.modalities)
    if missing:  # the part named, so a client sees which one the model cannot take
        raise NotFound(MODALITY_MESSAGE, param=used[missing[0]], code="ModalityNotSupported")
    if not capabilities.custom_calls_in_history and (at := custom_call_in_history(request.messages)):
        where = f"messages[{at[0]}].tool_calls[{at[1]}]"
        raise UnprocessableContent(
            f"Custom tool calls in the conversation are not supported by this model (parameter '{where}').",
            param=where,
            loc=["body", "messages", at[0], "tool_calls", at[1]],
            code="UnsupportedParameter",
        )
    modalities = request.options.get("modalities")
    if isinstance(modalities, list) and "audio" in modalities:
        # no backend's events carry audio: asking for it is refused, never answered in text
        raise unsupported("modalities", modalities, "Audio output is not supported by this model")
    custom = [tool for tool in request.tools if tool.get("type", "function") != "function"]
    if custom:  # no backend's events carry a custom tool's call: refused, never answered without
        raise unsupported("tools", custom, "Custom tools are not supported by this model")
    values = requested(request)
    quiet = unasked(request, values)  # a document's default, reasoning_effort "none": never refused
    for name, value in values.items():
        if name in quiet:
            continue
        param = capabilities.parameters.get(name)
        if param is None or not param.supported:
            raise unsupported(name, value, "The model does not support this parameter")
        if isinstance(value, int | float) and not isinstance(value, bool):
            if param.minimum is not None and value < param.minimum:
                raise unsupported(name, value, f"The model accepts values from {param.minimum}")
            if param.maximum is not None and value > param.maximum:
                raise unsupported(name, value, f"The model accepts values up to {param.maximum}")
    ceiling = capabilities.max_output_tokens
    if ceiling is not None and request.max_tokens is not None and request.max_tokens > ceiling:
        raise unsupported("max_tokens", request.max_tokens, f"The model generates at most {ceiling} tokens")
    if request.n > capabilities.max_n:
        most = capabilities.max_n
        raise unsupported("n", request.n, f"The model returns at most {most} choice{'s' * (most != 1)}")
    if request.top_logprobs > capabilities.max_top_logprobs:
        raise unsupported(
            "top_logprobs",
            request.top_logprobs,
            f"The model returns at most {capabilities.max_top_logprobs} top logprobs",
        )
    kind = (request.response_format or {}).get("type", "text")
    if kind not in capabilities.response_formats:
        raise unsupported("response_format", request.response_format, f"'{kind}' is not supported")
    # Only a declared limit is checked (a backend's, or the deployment's `context_length`): an
    # upstream that declares none enforces its own, and a guessed one refuses what it takes.
    wanted = prompt_tokens + (request.max_tokens or 0)
    if capabilities.context_length is not None and wanted > capabilities.context_length:
        raise BadRequest(
            f"This model's context is {capabilities.context_length} tokens; the request needs "
            f"about {wanted} ({prompt_tokens} in the prompt, {request.max_tokens} to generate).",
            param="messages",
            loc=["body", "messages"],
            code="context_length_exceeded",
        )
