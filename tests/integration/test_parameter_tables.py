"""Every parameter a dialect's document defines is accounted for by every backend: taken
(mapped to the backend's own name), explicitly unsupported (→ 422), or documented as handled
by the gateway itself (structural, dropped, or refused by the dialect). And each table is the
mapping: what a backend sends for a parameter is what its table says, under the table's target
(the openai-compatible body, TGI's two calls as TGI's stand-in receives them, the local
backend's Sampling), and a parameter taken but not sent is not sent."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from huggingface_hub import AsyncInferenceClient

from backends import echo, openai_compatible
from backends.base import BACKEND_KINDS, Param, mapped, refused, taken
from backends.local import sampling as local_sampling
from backends.openai_compatible import OpenAICompatibleBackend
from backends.tgi import errors as tgi_errors
from backends.tgi import options as tgi_options
from backends.tgi import tables as tgi_tables
from backends.tgi.backend import TGIBackend
from gateway.core.canonical import ChatRequest
from gateway.core.errors import UnprocessableContent
from gateway.core.parameters import BY_NAME, CATALOGUE, canonical_name
from gateway.core.parameters import HANDLED as GATEWAY_HANDLED
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import DialectSpec, load_document
from tests.support.tgi_server import TGIStandIn, running_tgi

TABLES = {
    "echo": echo.EchoBackend.capabilities.parameters,
    "openai-compatible": openai_compatible.CAPABILITIES.parameters,
    "tgi": tgi_tables.parameter_table(tgi_options.TGIOptions(url="http://tgi:80")),
    "local": local_sampling.parameter_table(context_length=4096, vocab_size=32000),
}


def dialect_parameters() -> list[tuple[str, str]]:
    found = []
    for dialect in DIALECTS.values():
        spec = DialectSpec(load_document(dialect.document), frozenset(dialect.chat_operations))
        for name in sorted(spec.chat_fields):
            if name not in spec.unsupported:  # the dialect itself drops or refuses these
                found.append((dialect.name, name))
    return found


def test_every_registered_backend_has_its_table_here():
    """A backend added to the registry is held to every dialect's parameters: its table joins
    TABLES (how it is built from the backend's options), or this fails naming it."""
    assert set(TABLES) == set(BACKEND_KINDS)


@pytest.mark.parametrize("backend", TABLES)
@pytest.mark.parametrize(("dialect", "parameter"), dialect_parameters())
def test_every_parameter_is_accounted_for(backend: str, dialect: str, parameter: str):
    name = canonical_name(parameter)
    if name in GATEWAY_HANDLED:  # by any dialect's spelling (Anthropic's `system`: the conversation)
        assert GATEWAY_HANDLED[name], f"{parameter}: say how the gateway handles it"
        return
    table = TABLES[backend]
    assert name in table, f"{backend}: '{parameter}' ({dialect}) is neither mapped nor marked unsupported"
    entry = table[name]
    assert entry.supported or entry.note, f"{backend}: say why '{name}' is unsupported"


@pytest.mark.parametrize("backend", TABLES)
def test_tables_are_data(backend: str):
    for name, entry in TABLES[backend].items():
        assert isinstance(name, str) and (entry.target is None or isinstance(entry.target, str))
        if entry.minimum is not None and entry.maximum is not None:
            assert entry.minimum <= entry.maximum, name


def test_every_table_names_only_catalogue_parameters():
    for backend, table in TABLES.items():
        strangers = set(table) - set(BY_NAME) - {"truncate", "watermark"}  # TGI's own, as extras
        assert not strangers, f"{backend}: {strangers} are not in the catalogue"


def test_echo_takes_every_parameter_the_gateway_does_not_handle():
    table = TABLES["echo"]
    assert set(table) == {p.name for p in CATALOGUE if not p.handled}
    assert all(p.supported and p.target is None for p in table.values())


# ----- mapped(): the one function that applies a table ------------------------------------------


def test_mapped_renames_converts_and_leaves_out_what_is_not_sent():
    table = {
        "a": Param("x"),
        "b": Param("y", transform=lambda v: v * 2),
        "c": taken("handled by the backend"),
        "d": Param("z", transform=lambda v: None),  # a value that means "off"
        "e": Param("w", transform=bool),
    }
    assert mapped(table, {"a": 1, "b": 2, "c": 3, "d": 4, "e": 0}) == {"x": 1, "y": 4, "w": False}
    assert mapped(table, {}) == {}


@pytest.mark.parametrize("name", ["refused", "unknown"])
def test_mapped_refuses_what_the_table_does_not_take(name: str):
    table = {"refused": refused("no such knob here")}
    with pytest.raises(UnprocessableContent) as caught:
        mapped(table, {name: 1})
    assert caught.value.param == name and caught.value.loc == ["body", name]
    if name == "refused":
        assert "no such knob here" in caught.value.message


def test_a_param_says_why_it_is_not_sent():
    with pytest.raises(ValueError, match="note"):
        Param(None)
    with pytest.raises(ValueError, match="target"):
        Param(None, note="taken", transform=str)
    with pytest.raises(ValueError, match="note"):
        refused("")
    assert not refused("why").supported and taken("how").supported


# ----- the targets are what each backend sends ----------------------------------------------------

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# A value for every parameter a request can set, valid for every backend that takes it.
SAMPLES: dict[str, Any] = {
    "max_tokens": 7, "n": 2, "stop": ["END"], "seed": 3, "temperature": 0.5, "top_p": 0.9,
    "frequency_penalty": 0.25, "presence_penalty": 0, "logit_bias": {"5": 1.5}, "logprobs": True,
    "top_logprobs": 2, "response_format": {"type": "json_object"}, "tools": [TOOL],
    "tool_choice": "auto", "user": "u-1", "top_k": 5, "min_p": 0.1, "typical_p": 0.5,
    "repetition_penalty": 1.1, "length_penalty": 1.0, "ignore_eos": True, "best_of": 2,
    "include_stop_str_in_output": True, "num_assistant_tokens": 3,
    "assistant_confidence_threshold": 0.5, "max_ngram_size": 3, "parallel_tool_calls": False,
    "modalities": ["text"], "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"}, "reasoning_effort": "low", "min_tokens": 1,
    "stop_token_ids": [2], "skip_special_tokens": False, "spaces_between_special_tokens": False,
    "use_beam_search": False, "early_stopping": False, "truncate_prompt_tokens": 10,
    "prompt_logprobs": 1, "detokenize": True, "logits_processors": ["p"],
    "truncate": 100, "watermark": True,  # TGI's own, which arrive as extra parameters
    # OpenAI's current document (openapi 2.3.0)
    "verbosity": "low", "web_search_options": {"search_context_size": "low"},
    "moderation": {"model": "omni-moderation-latest"},
    "steering_concepts": ["concept-1"],
    # informational: passed on where a backend takes them
    "metadata": {"k": "v"}, "store": True, "service_tier": "flex", "prompt_cache_key": "k-1",
    "prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": "1h"},
    "safety_identifier": "s-1",
}  # fmt: skip
# Parameters that mean something only beside another one.
NEEDS = {"top_logprobs": {"logprobs": True}, "tool_choice": {"tools": [TOOL]}}


def request_setting(name: str, samples: Mapping[str, Any] = SAMPLES) -> ChatRequest:
    """A request that sets one parameter (and what it needs beside it) to its sample value."""
    parameter, value = BY_NAME.get(name), samples[name]
    fields = {"model": "m", "messages": [{"role": "user", "content": "hello"}], **NEEDS.get(name, {})}
    if parameter is None:
        return ChatRequest(**fields, extra={name: value})
    if parameter.field:
        return ChatRequest(**fields, **{name: value})
    return ChatRequest(**fields, options={name: value})


def wire(value: Any) -> Any:
    """A value as JSON carries it."""
    return orjson.loads(orjson.dumps(value))


def test_there_is_a_sample_for_every_parameter():
    assert {p.name for p in CATALOGUE if not p.handled or p.passed_on} <= set(SAMPLES)


@pytest.mark.parametrize("max_tokens_parameter", ["max_tokens", "max_completion_tokens"])
def test_openai_compatible_sends_each_parameter_under_its_target(max_tokens_parameter: str):
    backend = OpenAICompatibleBackend(
        model="m", base_url="http://127.0.0.1:1/v1", max_tokens_parameter=max_tokens_parameter
    )
    table = backend.capabilities.parameters
    # it forwards all of them, the informational ones too
    assert set(table) == {p.name for p in CATALOGUE if not p.handled or p.passed_on}
    assert table["max_tokens"].target == max_tokens_parameter
    for name, param in table.items():
        assert param.supported and param.target is not None, name  # it refuses and withholds nothing
        body = backend.upstream_body(request_setting(name))
        assert body[param.target] == param.converted(SAMPLES[name]), name
        assert set(body) - {"model", "messages"} == {param.target, *NEEDS.get(name, {})}, name


def test_openai_compatible_forwards_the_informational_parameters():
    """store, metadata, service_tier … were dropped in silence before issue 26."""
    backend = OpenAICompatibleBackend(model="m", base_url="http://127.0.0.1:1/v1")
    request = request_setting("user")
    informational = {"metadata": {"k": "v"}, "store": True, "service_tier": "flex", "prompt_cache_key": "p"}
    request.options = dict(informational)
    body = backend.upstream_body(request)
    assert body == {"model": "m", "messages": request.messages, "user": "u-1", **informational}


@pytest.fixture(scope="module")
def tgi(refspecs_dir: Path | None) -> Iterator[TGIStandIn]:
    with running_tgi(refspecs_dir) as stand_in:
        yield stand_in
    assert stand_in.failures == [], "\n".join(stand_in.failures)


def tgi_received(tgi: TGIStandIn, request: ChatRequest, use_messages_api: bool) -> list[dict[str, Any]]:
    """The parameters TGI received for this request (the Messages API's body, the generate API's
    `parameters`), one per upstream call, with the backend run in process."""

    async def run() -> None:
        backend = TGIBackend(model="m", url=tgi.url, use_messages_api=use_messages_api, timeout=10)
        try:
            async for _ in backend.generate(request):
                pass
        finally:
            await backend.aclose()

    tgi.take_requests()
    asyncio.run(run())
    if use_messages_api:
        return [body for path, body in tgi.take_requests() if path == "/v1/chat/completions"]
    return [body["parameters"] for path, body in tgi.take_requests() if path == "/"]


TGI_ROUTES = {
    "messages": (True, tgi_tables.messages_api_table(tgi_options.TGIOptions(url="http://tgi"))),
    "generate": (False, tgi_tables.generate_api_table(tgi_options.TGIOptions(url="http://tgi"))),
}


@pytest.mark.parametrize(
    ("route", "name"),
    [(route, name) for route, (_, table) in TGI_ROUTES.items() for name in table if table[name].supported],
)
def test_tgi_sends_each_parameter_under_its_target(tgi: TGIStandIn, route: str, name: str):
    use_messages_api, table = TGI_ROUTES[route]
    param = table[name]
    received = tgi_received(tgi, request_setting(name), use_messages_api)
    assert len(received) == (SAMPLES["n"] if name == "n" else 1)
    for parameters in received:
        if param.target is None:  # taken, not sent: not under its own name either
            assert name not in parameters, parameters
        else:
            assert parameters[param.target] == wire(param.converted(SAMPLES[name])), parameters


@pytest.mark.parametrize(
    ("method", "route"), [("chat_completion", "messages"), ("text_generation", "generate")]
)
def test_tgi_targets_are_huggingface_hub_keywords(method: str, route: str):
    keywords = inspect.signature(getattr(AsyncInferenceClient, method)).parameters
    table = TGI_ROUTES[route][1]
    assert {p.target for p in table.values() if p.target is not None} <= set(keywords)


def test_tgi_validation_messages_are_read_back_to_canonical_names():
    for _, table in TGI_ROUTES.values():
        for name, param in table.items():
            if param.target not in (None, name):
                assert tgi_errors.CANONICAL_NAMES[param.target] == name


def test_tgi_policy_table_is_the_route_tables():
    options = {"url": "http://tgi"}
    messages, generate = (TGI_ROUTES[route][1] for route in ("messages", "generate"))
    only_messages = tgi_tables.parameter_table(tgi_options.TGIOptions(**options, use_messages_api=True))
    only_generate = tgi_tables.parameter_table(tgi_options.TGIOptions(**options, use_messages_api=False))
    either = tgi_tables.parameter_table(tgi_options.TGIOptions(**options))
    assert only_messages == messages and only_generate == generate
    for name, param in either.items():
        assert param.supported == any(t.get(name, refused("-")).supported for t in (messages, generate))
        assert param in (messages.get(name), generate.get(name))
    tables = tgi_tables.RouteTables.for_options(tgi_options.TGIOptions(**options))
    assert tables.generate_only == ("top_k", "typical_p", "repetition_penalty", "truncate", "watermark")


def local_table() -> Mapping[str, Param]:
    return local_sampling.parameter_table(context_length=512, vocab_size=100)


LOCAL_SAMPLES = {**SAMPLES, "presence_penalty": 0.5}  # TGI's only value, 0, is the default here


@pytest.mark.parametrize("name", [n for n, p in local_table().items() if p.supported])
def test_local_sets_each_parameter_as_its_sampling_field(name: str):
    table = local_table()
    param = table[name]
    if name == "response_format":  # taken: only text, which is what a request without one gets
        return
    sampling = local_sampling.sampling_for(request_setting(name, LOCAL_SAMPLES), table, None)
    default = local_sampling.sampling_for(request_setting("user"), table, None)
    if param.target is None:
        assert sampling == default
        return
    assert param.target in {f.name for f in dataclasses.fields(local_sampling.Sampling)}
    assert getattr(sampling, param.target) == param.converted(LOCAL_SAMPLES[name])
    assert getattr(sampling, param.target) != getattr(default, param.target)
