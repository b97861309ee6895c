"""The parameter catalogue: every request parameter any dialect defines, said once.

Each entry is a canonical parameter: its name, the dialect spellings that mean the same thing,
whether the canonical request holds it in a field of its own (else in `options`, under its name),
whether it changes what is generated (so the chosen backend must take it, or the request gets
422), and what the gateway does with it when it handles it itself. Translators read requests
with it, the policy checks against it, backends' tables are keyed by its names, and a test
holds every dialect document's parameters to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core.canonical import ChatRequest


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    spellings: tuple[str, ...] = ()  # other names dialects give it
    field: bool = False  # held in a ChatRequest field of the same name (else in `options`)
    generates: bool = True  # changes the answer: the backend must take it
    handled: str = ""  # the gateway's own way with it, whatever the backend
    # informational, yet a backend whose table has it gets it (openai-compatible forwards it):
    # never dropped in silence where it could go on
    passed_on: bool = False
    # values that ask for nothing, which a backend without the feature honours by doing nothing
    # (reasoning_effort "none": no reasoning); never refused, sent where the backend takes it
    asks_nothing: tuple[Any, ...] = ()


def field(name: str, *spellings: str, handled: str = "", generates: bool = True) -> Parameter:
    return Parameter(name, spellings, field=True, generates=generates and not handled, handled=handled)


def option(
    name: str,
    *,
    generates: bool = True,
    handled: str = "",
    passed_on: bool = False,
    asks_nothing: tuple[Any, ...] = (),
) -> Parameter:
    return Parameter(
        name,
        field=False,
        generates=generates and not handled,
        handled=handled,
        passed_on=passed_on,
        asks_nothing=asks_nothing,
    )


def informational(name: str, handled: str) -> Parameter:
    """An option that generates nothing: passed on where the backend takes it, else `handled`."""
    return option(name, handled=f"passed on where the backend takes it, else {handled}", passed_on=True)


CATALOGUE: tuple[Parameter, ...] = (
    # the conversation and the gateway's own business
    field("model", handled="routing: picks the deployment"),
    field("messages", "system", handled="the conversation: every backend takes it"),
    field("stream", handled="the gateway streams or gathers the backend's events"),
    field("stream_options", handled="include_usage: the gateway adds the usage chunk"),
    # generation, held in the canonical request
    field("max_tokens", "max_completion_tokens", "maximum_tokens"),
    field("n"),
    field("stop", "stop_sequences"),
    field("seed"),
    field("temperature"),
    field("top_p"),
    field("frequency_penalty"),
    field("presence_penalty"),
    field("logit_bias"),
    field("logprobs"),
    field("top_logprobs"),
    field("response_format"),
    field("tools", "functions"),
    field("tool_choice", "function_call"),
    field("user", generates=False),
    # informational: nothing to generate differently
    informational("metadata", "unused (chatgate stores nothing)"),
    informational("store", "unused (chatgate stores no completions)"),
    informational("service_tier", "answered from the one tier there is"),
    informational("prompt_cache_key", "unused (chatgate caches no prompts)"),
    informational("prompt_cache_retention", "unused (chatgate caches no prompts)"),
    informational("prompt_cache_options", "unused (chatgate caches no prompts)"),
    informational("safety_identifier", "unused (like user: chatgate monitors no abuse)"),
    # sampling and decoding options some dialects define (OVMS, LMI, OpenAI's newer ones)
    option("top_k"),
    option("min_p"),
    option("typical_p"),
    option("repetition_penalty"),
    option("length_penalty"),
    option("ignore_eos"),
    option("best_of"),
    option("include_stop_str_in_output"),
    option("num_assistant_tokens"),
    option("assistant_confidence_threshold"),
    option("max_ngram_size"),
    option("parallel_tool_calls"),
    option("modalities"),
    option("audio"),
    option("prediction"),
    option("reasoning_effort", asks_nothing=("none",)),  # "none": no reasoning, which any model can do
    # OpenAI's current document (openapi 2.3.0): they change the answer, so a backend takes them or 422
    option("verbosity"),
    option("web_search_options"),
    option("moderation"),
    # Aleph Alpha's current document (4.7.0): steering toward/away from a concept's examples
    option("steering_concepts"),
    # vLLM-style extras OVMS documents (and refuses): known, so a backend's table can say so
    option("min_tokens"),
    option("stop_token_ids"),
    option("skip_special_tokens"),
    option("spaces_between_special_tokens"),
    option("use_beam_search"),
    option("early_stopping"),
    option("truncate_prompt_tokens"),
    option("prompt_logprobs"),
    option("detokenize"),
    option("logits_processors"),
)

BY_NAME: dict[str, Parameter] = {p.name: p for p in CATALOGUE}
BY_SPELLING: dict[str, Parameter] = {s: p for p in CATALOGUE for s in (p.name, *p.spellings)}
GENERATION_OPTIONS: frozenset[str] = frozenset(p.name for p in CATALOGUE if not p.field and p.generates)
HANDLED: dict[str, str] = {p.name: p.handled for p in CATALOGUE if p.handled}
PASSED_ON: frozenset[str] = frozenset(p.name for p in CATALOGUE if p.passed_on)


def canonical_name(spelling: str) -> str:
    """The canonical name of a dialect's parameter (itself when it has no other)."""
    parameter = BY_SPELLING.get(spelling)
    return spelling if parameter is None else parameter.name


def requested(request: ChatRequest) -> dict[str, Any]:
    """The generation parameters this request sets away from their defaults, by canonical name,
    and `user`, which generates nothing but which a backend may pass on: what a backend must
    take, and what its table maps. A parameter that means something only beside another
    (tool_choice beside tools, top_logprobs beside logprobs) is set only with it."""
    asked: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "seed": request.seed,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "frequency_penalty": request.frequency_penalty,
        "presence_penalty": request.presence_penalty,
        "logit_bias": request.logit_bias or None,
        "stop": request.stop or None,
        "n": request.n if request.n != 1 else None,
        "logprobs": True if request.logprobs else None,
        "top_logprobs": (request.top_logprobs or None) if request.logprobs else None,
        "tools": request.tools or None,
        "tool_choice": request.tool_choice if request.tools else None,
        "response_format": request.response_format
        if (request.response_format or {}).get("type", "text") != "text"
        else None,
        "user": request.user,
    }
    asked.update({k: v for k, v in request.options.items() if k in GENERATION_OPTIONS})
    return {k: v for k, v in asked.items() if v is not None}


def unasked(request: ChatRequest, values: Mapping[str, Any]) -> frozenset[str]:
    """Of these requested parameters (`requested`), those that ask for nothing: set only to their
    document's declared default (the translator's `defaulted`), or to a value that asks for
    nothing (`asks_nothing`). A capability check refuses none of them; a backend sends them
    where its table takes them and leaves them out where it does not."""
    quiet = {
        name
        for name, value in values.items()
        if (parameter := BY_NAME.get(name)) is not None
        and any(type(value) is type(nothing) and value == nothing for nothing in parameter.asks_nothing)
    }
    return request.defaulted.intersection(values).union(quiet)


def passed_on(request: ChatRequest, table: Mapping[str, Any]) -> dict[str, Any]:
    """The informational parameters this request sets that the backend's table takes."""
    return {k: v for k, v in request.options.items() if k in PASSED_ON and k in table}
