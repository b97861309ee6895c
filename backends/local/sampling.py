"""The local backend's parameter table, and one request's decoding settings read by it.

The table maps each canonical parameter to the `Sampling` field it sets (with its range and
conversion), so the 422s the policy gives and the settings the decode loop gets come from one
place. Nothing here needs torch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.base import Param, mapped, taken, to_send, unsupported
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent
from gateway.core.parameters import GENERATION_OPTIONS

MAX_N = 16
MAX_TOP_LOGPROBS = 20
NO_TOOLS = "no tool-call parsing for local models"


@dataclass(frozen=True, slots=True)
class Sampling:
    """One request's decoding settings, validated and in the backend's terms."""

    n: int
    max_new_tokens: int | None  # None: up to the context length
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    logit_bias: dict[int, float]
    stop: tuple[str, ...]
    include_stop: bool
    ignore_eos: bool
    logprobs: bool
    top_logprobs: int
    seed: int | None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# What a request that sets none of the parameters gets (max_new_tokens: the deployment's default).
DEFAULTS: dict[str, Any] = {
    "n": 1,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "logit_bias": {},
    "stop": (),
    "include_stop": False,
    "ignore_eos": False,
    "logprobs": False,
    "top_logprobs": 0,
    "seed": None,
}


def refuse(message: str, name: str, value: Any) -> UnprocessableContent:
    return UnprocessableContent(message, param=name, loc=["body", name], value=value)


def non_empty(stops: list[str]) -> tuple[str, ...]:
    """An empty stop string would match everywhere; it is ignored."""
    return tuple(s for s in stops if s)


def top_k_setting(top_k: int) -> int:
    """0 and -1 both keep every token; the decode loop says so with 0."""
    return max(0, top_k)


def token_biases(logit_bias: dict[str, float], vocab_size: int) -> dict[int, float]:
    """logit_bias keyed by token id strings → by token ids, each checked against the vocabulary."""
    biases: dict[int, float] = {}
    for key, bias in logit_bias.items():
        token_id = int(key) if str(key).isdigit() else -1
        if not 0 <= token_id < vocab_size:
            raise UnprocessableContent(
                f"logit_bias key '{key}' is not a token id of this model (0 to {vocab_size - 1}).",
                param="logit_bias",
                loc=["body", "logit_bias", key],
                value=key,
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise UnprocessableContent(
                "logit_bias values must be numbers from -100 to 100.",
                param="logit_bias",
                loc=["body", "logit_bias", key],
                value=bias,
            )
        biases[token_id] = float(bias)
    return biases


def parameter_table(context_length: int, vocab_size: int) -> dict[str, Param]:
    """Canonical parameter → the Sampling field it sets, its range and conversion (or why not)."""
    return {
        "max_tokens": Param("max_new_tokens", 1, context_length, "prompt + output must fit the context"),
        "stop": Param(
            "stop", note="matched on the decoded text; the stop text is not returned", transform=non_empty
        ),
        "n": Param("n", 1, MAX_N, "the choices decode together as one batch"),
        "seed": Param("seed", note="seeds the request's torch.Generator: same seed, same output"),
        "temperature": Param("temperature", 0, None, "0 means greedy decoding", float),
        "top_p": Param("top_p", 0, 1, "nucleus truncation, above 0; 1 keeps every token", float),
        "top_k": Param("top_k", -1, None, "0 or -1 keeps every token", top_k_setting),
        "min_p": Param("min_p", 0, 1, "drop tokens below min_p × the top probability", float),
        "repetition_penalty": Param(
            "repetition_penalty", 0, None, "above 0; CTRL style, prompt and output", float
        ),
        "frequency_penalty": Param("frequency_penalty", -2, 2, "OpenAI style, over the output", float),
        "presence_penalty": Param("presence_penalty", -2, 2, "OpenAI style, over the output", float),
        "logit_bias": Param(
            "logit_bias", -100, 100, "keys are token ids of this model's tokenizer",
            functools.partial(token_biases, vocab_size=vocab_size),
        ),
        "logprobs": Param(
            "logprobs", note="log-softmax after bias, penalties and temperature, before truncation"
        ),
        "top_logprobs": Param("top_logprobs", 0, MAX_TOP_LOGPROBS, "sorted, most likely first"),
        "ignore_eos": Param("ignore_eos", note="EOS is then an ordinary (empty) token", transform=bool),
        "include_stop_str_in_output": Param(
            "include_stop", note="the stop text is returned too", transform=bool
        ),
        "response_format": taken('only {"type": "text"}, which is the default'),
        "user": taken("accepted, not used"),
        **unsupported(NO_TOOLS, "tools", "tool_choice", "parallel_tool_calls"),
        **unsupported("no beam search", "best_of", "length_penalty"),
        **unsupported("not implemented in the decode loop", "typical_p"),
        **unsupported(
            "speculative and prompt-lookup decoding are not implemented",
            "num_assistant_tokens", "assistant_confidence_threshold", "max_ngram_size",
        ),
        **unsupported("the local backend generates text only", "modalities", "audio", "prediction"),
        **unsupported("no reasoning models' effort control", "reasoning_effort"),
        **unsupported("no such control in the decode loop", "verbosity", "web_search_options", "moderation"),
        **unsupported("no steering concepts (Aleph Alpha's document)", "steering_concepts"),
    }  # fmt: skip


def check_range(name: str, value: Any, param: Param) -> None:
    """A number within the table's range (the policy checks the dialect's parameters; options sent
    as extra parameters arrive unchecked). Lists and objects are the table's transforms' to check."""
    if (param.minimum is None and param.maximum is None) or isinstance(value, list | dict):
        return
    low = float("-inf") if param.minimum is None else param.minimum
    high = float("inf") if param.maximum is None else param.maximum
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        bounds = f"from {low:g} to {high:g}" if high != float("inf") else f"of {low:g} or more"
        raise refuse(f"'{name}' must be a number {bounds}.", name, value)


def options_in_extra(table: Mapping[str, Param], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Dialect options (top_k …) a client sent as extra parameters, which this table takes."""
    return {
        name: value
        for name, value in extra.items()
        if name in GENERATION_OPTIONS and name in table and table[name].supported
    }


def sampling_for(
    request: ChatRequest, table: Mapping[str, Param], default_max_tokens: int | None
) -> Sampling:
    """The request's decoding settings by the table; raise the 4xx that refuses it."""
    if request.tools:
        raise refuse("This model does not support tools.", "tools", request.tools)
    kind = (request.response_format or {}).get("type", "text")
    if kind != "text":
        raise refuse(
            f"This model does not support response_format '{kind}'.",
            "response_format",
            request.response_format,
        )
    values = {**options_in_extra(table, request.extra), **to_send(table, request)}
    for name, value in values.items():
        if name in table:
            check_range(name, value, table[name])
    top_k = values.get("top_k")
    if top_k is not None and not isinstance(top_k, int):
        raise refuse("'top_k' must be an integer.", "top_k", top_k)
    for name in ("repetition_penalty", "top_p"):  # 0 is in their range only as its limit
        if values.get(name) == 0:
            raise refuse(f"'{name}' must be above 0.", name, values[name])
    settings = {**DEFAULTS, "max_new_tokens": default_max_tokens, **mapped(table, values)}
    return Sampling(**settings)
