"""What TGI is sent, as tables: canonical parameter → huggingface_hub keyword, one table per route.

TGI's Messages API (`AsyncInferenceClient.chat_completion`, whose keywords are the names in TGI's
body) and its generate API (`text_generation`, whose keywords are the names in the body's
`parameters`) name and take parameters differently: each route's table says how, with TGI's own
conversions as transforms. What a deployment takes (`parameter_table`, which the policy checks)
is derived from the tables of the routes its `use_messages_api` allows, and the route planning
(backends.tgi.request) reads which parameters only the generate API has from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from backends.base import Param, refused, taken, unsupported
from backends.tgi.options import TGIOptions


def below_one(value: float) -> float | None:
    """top_p, typical_p: TGI needs them below 1, and 1 means "off": not sent."""
    return value if value < 1 else None


def unless_zero(value: float) -> float | None:
    """top_k 0 means "off", temperature 0 greedy decoding (do_sample: false): not sent."""
    return value if value != 0 else None


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


def shared_table(options: TGIOptions) -> dict[str, Param]:
    """What both routes take alike."""
    return {
        "stop": Param(
            "stop", 0, options.max_stop_sequences,
            "number of stop strings (TGI --max-stop-sequences); TGI keeps a matched stop string, "
            "the backend cuts it",
        ),
        "n": taken("parallel requests, seed s+i for choice i (TGI's n is unused)", 1, options.max_n),
        "seed": Param("seed", 0, 2**64 - 1, "choice i of n is sent seed + i"),
        "top_p": Param("top_p", 0, 1, "TGI needs 0 < top_p < 1; 1 means off and is not sent", below_one),
        "frequency_penalty": Param("frequency_penalty", -2, 2),
        "presence_penalty": taken(
            "TGI turns p into repetition_penalty p + 2 (TGI issue #1796): only 0 is accepted, not sent",
            0, 0,
        ),
        "logit_bias": refused("TGI does not use logit_bias"),
        "parallel_tool_calls": taken(
            "TGI makes at most one tool call per choice, which satisfies either value"
        ),
        "user": taken("TGI has no end-user field"),
        "include_stop_str_in_output": taken(
            "TGI keeps a matched stop string; unless this is true the backend cuts it"
        ),
        **unsupported("TGI has no such parameter", "best_of", "ignore_eos", "length_penalty", "min_p"),
        **unsupported(
            "speculative and prompt-lookup decoding are TGI launcher settings, not request fields",
            "num_assistant_tokens", "assistant_confidence_threshold", "max_ngram_size",
        ),
        **unsupported(
            "TGI generates text only", "modalities", "audio", "prediction", "reasoning_effort"
        ),
        **unsupported(
            "TGI has no such parameter (OpenAI's current document)", "verbosity", "web_search_options",
            "moderation",
        ),
        **unsupported("TGI has no steering concepts (Aleph Alpha's document)", "steering_concepts"),
    }  # fmt: skip


def messages_api_table(options: TGIOptions) -> dict[str, Param]:
    """Canonical parameter → `chat_completion` keyword, the field of TGI's chat request."""
    return {
        **shared_table(options),
        "max_tokens": Param("max_tokens", 1, None),
        "temperature": Param("temperature", 0, None, "0 → greedy decoding (TGI says so itself)"),
        "logprobs": Param("logprobs"),
        "top_logprobs": Param("top_logprobs", 0, options.max_top_n_tokens, "TGI --max-top-n-tokens"),
        "response_format": Param(
            "response_format", note="json_object and json_schema → TGI's grammar "
            "{type: json, value: <JSON schema>}", transform=grammar_for,
        ),
        "tools": Param("tools", note="TGI calls a function's JSON schema `arguments`", transform=tgi_tools),
        "tool_choice": Param("tool_choice"),
        **unsupported(
            "TGI's Messages API lacks it (its generate API has it)",
            "top_k", "typical_p", "repetition_penalty",
        ),
    }  # fmt: skip


def generate_api_table(options: TGIOptions) -> dict[str, Param]:
    """Canonical parameter → `text_generation` keyword, the field of TGI's `parameters`."""
    return {
        **shared_table(options),
        "max_tokens": Param("max_new_tokens", 1, None),
        "temperature": Param(
            "temperature", 0, None, "0 → greedy decoding (do_sample: false), not sent", unless_zero
        ),
        "logprobs": taken("every token comes with its logprob (details: true)"),
        "top_logprobs": Param("top_n_tokens", 0, options.max_top_n_tokens, "TGI --max-top-n-tokens"),
        "response_format": Param(
            "grammar", note="json_object and json_schema → {type: json, value: <JSON schema>}",
            transform=grammar_for,
        ),
        **unsupported("TGI's generate API lacks it (its Messages API has it)", "tools", "tool_choice"),
        # what only the generate API has: a request setting one is served by it
        "top_k": Param("top_k", 0, None, "0 means off and is not sent", unless_zero),
        "typical_p": Param("typical_p", 0, 1, "1 means off and is not sent", below_one),
        "repetition_penalty": Param("repetition_penalty", 0, None, "must be > 0"),
        # TGI's own fields no dialect defines: taken from extra parameters (pass-through)
        "truncate": Param("truncate", note="TGI's own: an extra parameter"),
        "watermark": Param("watermark", note="TGI's own: an extra parameter"),
    }  # fmt: skip


NOT_TAKEN = refused("not in the table")


@dataclass(frozen=True, slots=True)
class RouteTables:
    """One deployment's two tables, and which routes it may use."""

    messages: Mapping[str, Param]
    generate: Mapping[str, Param]
    use_messages_api: Literal["auto"] | bool

    @classmethod
    def for_options(cls, options: TGIOptions) -> RouteTables:
        return cls(messages_api_table(options), generate_api_table(options), options.use_messages_api)

    @property
    def generate_only(self) -> tuple[str, ...]:
        """What the generate API sends and the Messages API lacks: setting one picks the generate API."""
        return tuple(
            name
            for name, param in self.generate.items()
            if param.target is not None and not self.messages.get(name, NOT_TAKEN).supported
        )

    def accepted(self) -> dict[str, Param]:
        """What the deployment takes, whichever route serves a request (the policy checks this)."""
        if self.use_messages_api is True:
            return dict(self.messages)
        if self.use_messages_api is False:
            return dict(self.generate)
        either: dict[str, Param] = {}
        for name in dict.fromkeys([*self.messages, *self.generate]):
            entries = [t[name] for t in (self.messages, self.generate) if name in t]
            either[name] = next((p for p in entries if p.supported), entries[0])
        return either


def parameter_table(options: TGIOptions) -> dict[str, Param]:
    """Canonical parameter → how this deployment takes it (what the policy checks)."""
    return RouteTables.for_options(options).accepted()
