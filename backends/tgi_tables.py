"""The parameters a TGI deployment takes: canonical name → TGI's name for it and the range TGI
accepts, as its `use_messages_api` allows (what the policy checks)."""

from __future__ import annotations

from backends.base import Param, unsupported
from backends.tgi_options import TGIOptions


def parameter_table(options: TGIOptions) -> dict[str, Param]:
    """Canonical parameter → TGI's name for it and the range TGI accepts (readable as data)."""
    messages_api = options.use_messages_api is not False
    generate_api = options.use_messages_api is not True
    generate_only = "" if generate_api else "generate API only, and use_messages_api is true"
    tools_note = "Messages API" if messages_api else "Messages API only, and use_messages_api is false"
    return {
        "max_tokens": Param("max_new_tokens", 1, None, "max_tokens on the Messages API"),
        "stop": Param(
            "stop", 0, options.max_stop_sequences,
            "number of stop strings (TGI --max-stop-sequences); TGI keeps a matched stop string, "
            "the backend cuts it",
        ),
        "n": Param("n", 1, options.max_n, "parallel requests, seed s+i for choice i (TGI's n is unused)"),
        "seed": Param("seed", 0, 2**64 - 1),
        "temperature": Param("temperature", 0, None, "0 → greedy decoding (do_sample: false)"),
        "top_p": Param("top_p", 0, 1, "TGI needs 0 < top_p < 1; 1 means off and is not sent"),
        "frequency_penalty": Param("frequency_penalty", -2, 2),
        "presence_penalty": Param(
            "(not sent)", 0, 0,
            "TGI turns p into repetition_penalty p + 2 (TGI issue #1796): only 0 is accepted, not sent",
        ),
        "logit_bias": Param(None, note="TGI does not use logit_bias"),
        "logprobs": Param("logprobs", note="logprobs on the Messages API, details on the generate API"),
        "top_logprobs": Param("top_n_tokens", 0, options.max_top_n_tokens, "TGI --max-top-n-tokens"),
        "response_format": Param(
            "grammar", note="json_object and json_schema → {type: json, value: <JSON schema>}"
        ),
        "tools": Param("tools" if messages_api else None, note=tools_note),
        "tool_choice": Param("tool_choice" if messages_api else None, note=tools_note),
        "parallel_tool_calls": Param(
            "(not sent)", note="TGI makes at most one tool call per choice, which satisfies either value"
        ),
        "user": Param("(not sent)", note="TGI has no end-user field"),
        "include_stop_str_in_output": Param("(gateway)", note="false (default): the backend cuts it"),
        "top_k": Param("top_k" if generate_api else None, 0, None, generate_only or "0 means off"),
        "typical_p": Param("typical_p" if generate_api else None, 0, 1, generate_only or "1 means off"),
        "repetition_penalty": Param(
            "repetition_penalty" if generate_api else None, 0, None, generate_only or "must be > 0"
        ),
        **unsupported("TGI has no such parameter", "best_of", "ignore_eos", "length_penalty", "min_p"),
        **unsupported(
            "speculative and prompt-lookup decoding are TGI launcher settings, not request fields",
            "num_assistant_tokens", "assistant_confidence_threshold", "max_ngram_size",
        ),
        **unsupported(
            "TGI generates text only", "modalities", "audio", "prediction", "reasoning_effort"
        ),
    }  # fmt: skip
