"""The local backend: a tiny Llama and BPE tokenizer built here, served by a real gateway process.

Driven through the OpenAI SDK (/v1) and LMI JSON lines with httpx (/lmi); a few checks of the
pieces (detokenization, stop strings, options, the fallback template) run in process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from backends.local.backend import (
    FALLBACK_CHAT_TEMPLATE,
    INSTALL_HINT,
    LocalBackend,
    Sampling,
    TextAssembler,
)
from tests.support.servers import ROOT, running_gateway
from tests.support.tiny_model import build_tokenizer, save_tiny_model

MESSAGES = [{"role": "user", "content": "Tell me a story about the café by the river."}]
EOS_ID = 1  # "</s>" is the second special token of tests/support/tiny_model.py
NO_EOS = {str(EOS_ID): -100}  # keeps generation going until max_tokens or a stop string


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def local_url(model_dir: Path, log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("local-config") / "chatgate.yaml"
    deployment = {
        "name": "tiny",
        "backend": "local",
        "extra_parameters": "pass-through",
        "options": {"path": str(model_dir), "device": "cpu", "torch_threads": 1},
    }
    config.write_text(yaml.safe_dump({"deployments": [deployment]}))
    with running_gateway(log_dir, config) as url:
        yield url


@pytest.fixture(scope="module")
def client(local_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{local_url}/v1", api_key="unused", max_retries=0)


def complete(client: openai.OpenAI, **params):
    params = {"model": "tiny", "messages": MESSAGES, **params}
    return client.chat.completions.create(**params)


def lmi(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/lmi/v1/chat/completions", json={"messages": MESSAGES, **body}, timeout=60)


# ----- through the gateway ---------------------------------------------------------------


def test_same_seed_same_output_and_another_seed_differs(client: openai.OpenAI):
    first = complete(client, seed=7, max_tokens=24, logit_bias=NO_EOS)
    again = complete(client, seed=7, max_tokens=24, logit_bias=NO_EOS)
    other = complete(client, seed=8, max_tokens=24, logit_bias=NO_EOS)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content != other.choices[0].message.content
    assert first.usage.prompt_tokens == again.usage.prompt_tokens > 5


def test_max_tokens_ends_with_length(client: openai.OpenAI, local_url: str):
    response = complete(client, seed=1, max_tokens=7, logit_bias=NO_EOS)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 7
    assert response.usage.total_tokens == response.usage.prompt_tokens + 7
    body = lmi(local_url, {"seed": 1, "max_tokens": 5, "logit_bias": NO_EOS}).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5


def test_eos_ends_with_stop_and_lmi_says_eos_token(client: openai.OpenAI, local_url: str):
    forced_eos = {str(EOS_ID): 100}
    response = complete(client, seed=1, max_tokens=20, logit_bias=forced_eos)
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content == ""
    assert response.usage.completion_tokens == 1  # the EOS token itself
    body = lmi(local_url, {"seed": 1, "max_tokens": 20, "logit_bias": forced_eos}).json()
    assert body["choices"][0]["finish_reason"] == "eos_token"


def pick_stop(text: str) -> str:
    """A short ASCII piece from the middle of `text`, so that it surely occurs."""
    for start in range(len(text) // 3, len(text) - 2):
        piece = text[start : start + 2]
        if piece.isascii() and piece.isprintable() and piece.strip() == piece:
            return piece
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_sequence_cuts_the_text_before_it(client: openai.OpenAI, local_url: str):
    params = {"seed": 3, "max_tokens": 40, "logit_bias": NO_EOS}
    full = complete(client, **params).choices[0].message.content
    stop = pick_stop(full)
    expected = full[: full.find(stop)]
    stopped = complete(client, **params, stop=[stop, "never-generated-text"])
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < 40
    body = lmi(local_url, {**params, "stop": stop}).json()
    assert body["choices"][0]["message"]["content"] == expected
    assert body["choices"][0]["finish_reason"] == "stop_sequence"


def test_logprobs_are_sorted_and_consistent_with_the_chosen_token(client: openai.OpenAI):
    greedy = complete(client, temperature=0, max_tokens=12, logit_bias=NO_EOS, logprobs=True, top_logprobs=5)
    entries = greedy.choices[0].logprobs.content
    assert len(entries) == greedy.usage.completion_tokens == 12
    for entry in entries:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert all(lp <= 0 for lp in [entry.logprob, *tops])
        assert sum(math.exp(lp) for lp in tops) <= 1 + 1e-5
        # greedy decoding takes the most likely token of the reported distribution
        assert entry.logprob == tops[0] and entry.token == entry.top_logprobs[0].token

    sampled = complete(client, seed=11, max_tokens=20, logit_bias=NO_EOS, logprobs=True, top_logprobs=20)
    for entry in sampled.choices[0].logprobs.content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert entry.logprob <= tops[0] + 1e-6
        if entry.logprob >= tops[-1]:  # likely enough to be among the 20: it must be listed
            assert any(
                abs(t.logprob - entry.logprob) < 1e-6 and t.token == entry.token for t in entry.top_logprobs
            )


def test_streaming_gives_the_same_text_as_one_response(client: openai.OpenAI):
    params = {"seed": 5, "max_tokens": 30, "logit_bias": NO_EOS, "logprobs": True, "top_logprobs": 2}
    whole = complete(client, **params)
    stream = complete(client, **params, stream=True, stream_options={"include_usage": True})
    pieces, tokens, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            tokens += [e.token for e in (choice.logprobs.content if choice.logprobs else [])]
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole.choices[0].message.content
    assert tokens == [e.token for e in whole.choices[0].logprobs.content]
    assert finish == whole.choices[0].finish_reason == "length"
    assert usage.completion_tokens == whole.usage.completion_tokens == 30
    # a piece is sent only once it decodes cleanly (the last piece may end a broken byte sequence)
    assert not any(piece.endswith("\ufffd") for piece in [p for p in pieces if p][:-1])


def test_lmi_json_lines_stream_matches_its_response(local_url: str):
    body = {"seed": 9, "max_tokens": 16, "logit_bias": NO_EOS}
    whole = lmi(local_url, body).json()
    with httpx.stream(
        "POST", f"{local_url}/lmi/v1/chat/completions", json={"messages": MESSAGES, **body, "stream": True}
    ) as response:
        assert response.headers["content-type"].startswith("application/jsonlines")
        chunks = [json.loads(line) for line in response.iter_lines() if line.strip()]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_n_choices_each_finish_and_usage_adds_up(client: openai.OpenAI):
    response = complete(client, seed=2, n=3, max_tokens=6, logit_bias=NO_EOS)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in response.choices)
    assert len({c.message.content for c in response.choices}) > 1
    assert response.usage.completion_tokens == 18


def test_top_k_1_is_greedy_and_penalties_change_the_output(client: openai.OpenAI):
    greedy = complete(client, temperature=0, max_tokens=20, logit_bias=NO_EOS).choices[0].message.content
    top_1 = complete(client, seed=4, max_tokens=20, logit_bias=NO_EOS, extra_body={"top_k": 1})
    assert top_1.choices[0].message.content == greedy
    penalised = complete(client, temperature=0, max_tokens=20, logit_bias=NO_EOS, frequency_penalty=2)
    assert penalised.choices[0].message.content != greedy
    repetition = complete(
        client, temperature=0, max_tokens=20, logit_bias=NO_EOS, extra_body={"repetition_penalty": 5.0}
    )
    assert repetition.choices[0].message.content != greedy


def test_concurrent_requests_both_complete_as_they_would_alone(client: openai.OpenAI, local_url: str):
    params = [{"seed": 21, "max_tokens": 40}, {"seed": 22, "max_tokens": 30, "stream": True}]
    alone = [
        complete(client, **{**p, "stream": False}, logit_bias=NO_EOS).choices[0].message.content
        for p in params
    ]

    async def both() -> list[str]:
        async_client = openai.AsyncOpenAI(base_url=f"{local_url}/v1", api_key="unused", max_retries=0)

        async def one(p: dict) -> str:
            if not p.get("stream"):
                response = await async_client.chat.completions.create(
                    model="tiny", messages=MESSAGES, logit_bias=NO_EOS, **p
                )
                return response.choices[0].message.content
            stream = await async_client.chat.completions.create(
                model="tiny", messages=MESSAGES, logit_bias=NO_EOS, **p
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        async with async_client:
            return list(await asyncio.gather(*(one(p) for p in params)))

    assert asyncio.run(both()) == alone


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
            "tools",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logit_bias": {"999999": 5}}, "logit_bias"),
    ],
    ids=["tools", "json_object", "unknown-token-id"],
)
def test_what_the_model_cannot_do_is_a_422(client: openai.OpenAI, params: dict, param: str):
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        complete(client, max_tokens=3, **params)
    assert caught.value.body["param"] == param


def test_a_request_beyond_the_context_is_a_400(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client, max_tokens=510)  # the tiny model's context is 512 tokens, with the prompt
    assert caught.value.body["code"] == "context_length_exceeded"


# ----- the pieces, in process -------------------------------------------------------------


def sampling(*stop: str, include_stop: bool = False) -> Sampling:
    return Sampling(
        n=1, max_new_tokens=None, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
        repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, logit_bias={},
        stop=stop, include_stop=include_stop, ignore_eos=False, logprobs=False, top_logprobs=0,
        seed=None,
    )  # fmt: skip


@functools.cache
def shared_tokenizer():
    return build_tokenizer()


TEXT = "The café serves crème brûlée 🙂 and naïve über tea."


@pytest.mark.parametrize(
    ("stop", "include_stop", "expected", "stopped"),
    [
        ((), False, TEXT, False),
        (("crème",), False, "The café serves ", True),
        (("crème",), True, "The café serves crème", True),
        (("🙂 a", "serves c"), False, "The café ", True),
        (("brûlée 🙂 x",), False, TEXT, False),  # its start is held, then released
    ],
    ids=["no-stop", "stop", "include-stop", "earliest-of-two", "near-miss"],
)
def test_text_assembler_emits_clean_text_and_cuts_at_stop_strings(
    stop: tuple[str, ...], include_stop: bool, expected: str, stopped: bool
):
    tokenizer = shared_tokenizer()
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) < len(TEXT.encode())  # BPE merged bytes, and some tokens split characters
    assembler = TextAssembler(
        lambda t: tokenizer.decode(t, skip_special_tokens=True),
        [tokenizer.bos_token_id],
        sampling(*stop, include_stop=include_stop),
    )
    pieces, ended = [], False
    for token_id in ids:
        text, ended = assembler.push(token_id)
        pieces.append(text)
        if ended:
            break
    if not ended:
        pieces.append(assembler.flush())
    assert "".join(pieces) == expected and ended == stopped
    assert not any("\ufffd" in piece for piece in pieces)


def test_fallback_template_options_and_capabilities(tmp_path: Path):
    model_dir = save_tiny_model(tmp_path / "no-template", chat_template=False)
    backend = LocalBackend(model="bare", path=str(model_dir), device="cpu")
    assert backend.chat_template == FALLBACK_CHAT_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = backend.tokenizer.decode(backend.prompt_ids(messages))
    assert prompt == "<s>system: Be brief.\n\nuser: Hi\n\nassistant:"
    capabilities = backend.capabilities
    assert capabilities.context_length == 512 and capabilities.max_top_logprobs == 20
    assert capabilities.parameters["seed"].supported and capabilities.parameters["top_k"].supported
    assert not capabilities.parameters["tools"].supported
    with pytest.raises(ValueError, match="colour"):
        LocalBackend(model="bad", path=str(model_dir), colour="red")
    with pytest.raises(ValueError, match="path"):
        LocalBackend(model="bad", path=str(tmp_path / "missing"))


def test_without_torch_the_module_imports_and_the_backend_says_what_to_install():
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import backends.local.backend as local\n"
        "try:\n    local.LocalBackend(model='x', path='.')\n"
        "except RuntimeError as error:\n    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == INSTALL_HINT


def test_an_ovms_stream_keeps_the_stop_string_by_default():
    """OVMS's seed keeps a matched stop string in a stream: the dialect says so with the option,
    which the local backend's table takes."""
    from backends.local.sampling import parameter_table, sampling_for
    from tests.unit.dialects.cases import translator

    ovms = translator("ovms")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "stop": ["x"]}
    table = parameter_table(context_length=64, vocab_size=32)
    assert sampling_for(ovms.read({**body, "stream": True}), table, None).include_stop
    assert not sampling_for(ovms.read(body), table, None).include_stop
