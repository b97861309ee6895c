"""Hugging Face Text Generation Inference (TGI), through huggingface_hub's AsyncInferenceClient.

Which TGI route serves a request, and why:

* TGI's **Messages API** (`POST /v1/chat/completions`, `client.chat_completion`) is the default.
  There TGI renders the model's own chat template (special tokens exactly as the model expects),
  turns `tools` and `response_format` into its grammar, returns logprobs with top alternatives, and
  (TGI 3.x) reports `stop` (end of sequence), `stop_sequence` and `length` apart. Rendering a prompt
  here instead would guess the template; the Messages API loses nothing the canonical request has.
* Its **generate API** (`POST /` with `stream`, `client.text_generation`) is used only when a
  request sets a knob the Messages API lacks: `top_k`, `typical_p`, `repetition_penalty` (from the
  dialect, or passed through as an extra parameter, like `truncate` and `watermark`). The prompt is
  still TGI's own template, rendered by `POST /chat_tokenize`; the BOS token that the generate API's
  tokenizer would add a second time is removed first. Tokens come with `details` (finish reason and
  token counts) and `top_n_tokens` for logprobs.
* `use_messages_api: true` always uses the Messages API (generate-only knobs are then refused);
  `false` always uses the generate API (tools are then refused); `"auto"` picks per request as
  above. Tools together with a generate-only knob are refused (422 naming the knob).

Both routes are streamed upstream even when the client did not ask for a stream: the events are the
same either way, tokens are relayed as they arrive, and usage comes with the last token.

Mapping details that keep the client's meaning (how each parameter is sent is a table per route
in backends.tgi.tables; the route is planned in backends.tgi.request, TGI's tokens become events in
backends.tgi.events, its failures gateway errors in backends.tgi.errors):

* TGI keeps a matched stop string in the output; the dialects here expect it cut. Only text that
  could begin a stop string is held back, and the match is cut at the end (unless the request says
  `include_stop_str_in_output: true`).
* `n > 1` runs n requests in parallel (TGI's `n` is unused); a seed s becomes s, s+1, … per choice.
* `temperature: 0` means greedy decoding (`do_sample: false`); `top_p: 1` and `typical_p: 1` mean
  "off" and are not sent (TGI requires them < 1); `top_k: 0` means "off" too.
* `presence_penalty`: TGI turns p into `repetition_penalty = p + 2` (TGI issue #1796), so p = 0
  would become a heavy penalty. Only 0 is accepted, and it is not sent.
* One pooled HTTP client per backend, and one short-lived AsyncInferenceClient per upstream call:
  the inference client keeps every stream it opens until it is closed, so a long-lived one grows
  without bound. The gateway host's own Hugging Face token is never sent unless configured here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from huggingface_hub import AsyncInferenceClient
from pydantic import ValidationError

from backends.base import Capabilities, mapped
from backends.tgi.errors import error_body, error_for_response, read_error_body, translated_errors
from backends.tgi.events import ChoiceEvents, ChoiceUsage, finish_reason
from backends.tgi.options import TGIOptions
from backends.tgi.request import Plan, plan_request
from backends.tgi.tables import RouteTables
from gateway.core.canonical import ChatRequest, Event, Usage, mark_last_text
from gateway.core.errors import BadGateway, UnprocessableContent
from gateway.core.options import ConfigError, describe

# The base model on TGI's Messages API ("tgi"), rather than a LoRA adapter of that name.
BASE_MODEL = "tgi"


class TGIBackend:
    name = "tgi"

    def __init__(
        self,
        model: str = "tgi",
        *,
        proxy_environment: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:
        try:
            self.options = TGIOptions(**options)
        except ValidationError as error:
            raise ConfigError(f"tgi backend options: {describe(error)}") from None
        self.model = model
        self.tables = RouteTables.for_options(self.options)
        self.parameters = self.tables.accepted()
        self.capabilities = Capabilities(
            modalities=self.options.modalities,
            parameters=self.parameters,
            response_formats=frozenset({"text", "json_object", "json_schema"}),
            max_n=self.options.max_n,
            requests_per_choice=True,  # one request a choice, run at once
            max_top_logprobs=self.options.max_top_n_tokens,
            context_length=self.options.context_length,
        )
        # decided once, at start, as for every HTTP backend (backends.http.options)
        self.proxy = self.options.proxy_for(self.options.url, proxy_environment or {})
        self.tls = self.options.ssl_context()
        self._http: httpx2.AsyncClient | None = None
        self._auto_prefix_ids: list[int] | None = None  # special tokens TGI's tokenizer prepends

    # ----- connections ---------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        return self.options.token.get_secret_value() if self.options.token else None

    def http(self) -> httpx2.AsyncClient:
        """The pooled connections to TGI (created in the serving event loop, on first use)."""
        if self._http is None:
            limits = httpx2.Limits(
                max_connections=self.options.max_connections,
                max_keepalive_connections=self.options.max_connections,
            )
            self._http = httpx2.AsyncClient(
                timeout=httpx2.Timeout(self.options.timeout, connect=self.options.connect),
                limits=limits,
                event_hooks={"response": [read_error_body]},
                proxy=self.proxy,
                verify=self.tls,
                trust_env=False,  # proxy and CAs as the options say (the environment only by proxy: env)
            )
        return self._http

    @asynccontextmanager
    async def inference_client(self, request: ChatRequest) -> AsyncIterator[AsyncInferenceClient]:
        """A short-lived AsyncInferenceClient on the shared pool; closing it closes its streams.
        It sends the request's ids (x-request-id, W3C trace context) with each call."""
        headers: dict[str, Any] = dict(request.trace.headers())
        if not self.token:  # without a configured token, send none (not the gateway host's HF token)
            headers["authorization"] = None
        client = AsyncInferenceClient(
            model=self.options.url, token=self.token, timeout=self.options.timeout, headers=headers
        )
        client._async_client = self.http()  # share the pool; client.close() leaves it open
        try:
            yield client
        finally:
            await client.close()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # ----- generation ----------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        plan = plan_request(request, self.tables)
        usages = [ChoiceUsage() for _ in range(request.n)]
        prompt = await self.templated_prompt(plan) if plan.route == "generate" else None
        streams = [self.choice(i, request, plan, prompt, usages[i]) for i in range(request.n)]
        source = streams[0] if len(streams) == 1 else interleave(streams)
        try:
            async for event in source:
                yield event
        finally:  # also when the client went away: close the upstream streams now
            await source.aclose()  # type: ignore[attr-defined]
        prompt_tokens = usages[0].prompt_tokens or 0
        completion_tokens = sum(
            u.completion_tokens if u.completion_tokens is not None else u.tokens_seen for u in usages
        )
        yield Usage(prompt_tokens, completion_tokens)

    def choice(
        self, index: int, request: ChatRequest, plan: Plan, prompt: str | None, usage: ChoiceUsage
    ) -> AsyncIterator[Event]:
        values = plan.values if request.seed is None else {**plan.values, "seed": request.seed + index}
        if plan.route == "generate":
            assert prompt is not None
            arguments = mapped(self.tables.generate, values)
            return self.generate_api_choice(index, request, prompt, arguments, usage)
        return self.messages_api_choice(index, request, plan, mapped(self.tables.messages, values), usage)

    async def messages_api_choice(
        self, index: int, request: ChatRequest, plan: Plan, arguments: dict[str, Any], usage: ChoiceUsage
    ) -> AsyncIterator[Event]:
        """One choice from the Messages API; `arguments`: the request's parameters by its table."""
        events = ChoiceEvents(index, request)
        with translated_errors():
            async with self.inference_client(request) as client:
                # the keywords come from the Messages API table (tests/integration/test_parameter_tables.py
                # drives each through the stand-in against TGI's document)
                stream = await client.chat_completion(  # type: ignore[call-overload]
                    messages=plan.messages,
                    model=self.options.adapter_id or BASE_MODEL,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body=plan.extra_body or None,
                    **arguments,
                )
                try:
                    async for chunk in stream:
                        if chunk.get("usage"):
                            usage.prompt_tokens = chunk["usage"]["prompt_tokens"]
                            usage.completion_tokens = chunk["usage"]["completion_tokens"]
                        for choice in chunk.get("choices") or []:
                            usage.tokens_seen += 1
                            for event in self.messages_api_events(events, choice):
                                yield event
                except json.JSONDecodeError:
                    # huggingface_hub 2.4 cannot parse a valid `data:[DONE]` (its issue #4536);
                    # after the last token that is only the end of the stream.
                    if not (events.finished or events.has_tool_call):
                        raise
                for event in events.end_of_stream():
                    yield event

    @staticmethod
    def messages_api_events(events: ChoiceEvents, choice: dict[str, Any]) -> list[Event]:
        delta = choice.get("delta") or {}
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            events.tool_fragment(call.get("id"), function.get("name"), function.get("arguments") or "")
        logprobs = None
        if choice.get("logprobs"):
            logprobs = [
                events.logprob(
                    entry["token"],
                    entry.get("logprob"),
                    [(top["token"], top["logprob"]) for top in entry.get("top_logprobs") or []],
                )
                for entry in choice["logprobs"].get("content") or []
            ]
        out = events.text(delta.get("content") or "", logprobs)
        if choice.get("finish_reason"):
            out += events.finish(finish_reason(choice["finish_reason"]))
        return mark_last_text(out)

    async def generate_api_choice(
        self, index: int, request: ChatRequest, prompt: str, arguments: dict[str, Any], usage: ChoiceUsage
    ) -> AsyncIterator[Event]:
        """One choice from the generate API; `arguments`: the request's parameters by its table."""
        events = ChoiceEvents(index, request)
        with translated_errors():
            async with self.inference_client(request) as client:
                stream = await client.text_generation(
                    prompt,
                    stream=True,
                    details=True,
                    # TGI decodes greedily unless told to sample: temperature 0 is how a request says greedy
                    do_sample=request.temperature != 0,
                    adapter_id=self.options.adapter_id,
                    **arguments,
                )
                async for item in stream:
                    usage.tokens_seen += 1
                    token = item["token"]
                    out: list[Event] = []
                    if not token.get("special"):
                        top = [(t["text"], t["logprob"]) for t in item.get("top_tokens") or []]
                        logprobs = [events.logprob(token["text"], token.get("logprob"), top)]
                        out += events.text(token["text"], logprobs)
                    details = item.get("details")
                    if details:
                        usage.prompt_tokens = details["input_length"]
                        usage.completion_tokens = details["generated_tokens"]
                        out += events.finish(finish_reason(details["finish_reason"]))
                    for event in mark_last_text(out):
                        yield event
                if not events.finished:
                    raise BadGateway("TGI ended the stream before the generation finished.")

    # ----- the generate API's prompt: TGI's own chat template ------------------------------

    async def templated_prompt(self, plan: Plan) -> str:
        """TGI's chat template applied by `POST /chat_tokenize`, minus a BOS the tokenizer adds again."""
        because = next(iter(plan.knobs), "use_messages_api: false")
        body = {"model": self.options.adapter_id or BASE_MODEL, "messages": plan.messages}
        rendered = await self.post_json("/chat_tokenize", body, because)
        text: str = rendered["templated_text"]
        tokens = [t for t in rendered["tokenize_response"] if t["stop"] > t["start"]]
        prefix_ids = await self.auto_prefix_ids(because)
        if prefix_ids and [t["id"] for t in tokens[: len(prefix_ids)]] == prefix_ids:
            doubled = "".join(t["text"] for t in tokens[: len(prefix_ids)])
            if text.startswith(doubled):
                text = text[len(doubled) :]
        return text

    async def auto_prefix_ids(self, because: str) -> list[int]:
        """The special tokens (BOS) TGI's tokenizer prepends to any input, learned once."""
        if self._auto_prefix_ids is None:
            tokens = await self.post_json("/tokenize", {"inputs": "a"}, because)
            self._auto_prefix_ids = [t["id"] for t in _leading_zero_width(tokens)]
        return self._auto_prefix_ids

    async def post_json(self, path: str, body: dict[str, Any], because: str) -> Any:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        with translated_errors():
            response = await self.http().post(self.options.url + path, json=body, headers=headers)
            if response.status_code == 404:
                raise UnprocessableContent(
                    f"'{because}' needs TGI's generate API with TGI's chat template, and this TGI "
                    f"cannot render it ({path}: {error_body(response)[0]}).",
                    param=because,
                    loc=["body", because],
                )
            if response.status_code >= 400:
                raise error_for_response(response)
            return response.json()


def _leading_zero_width(tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    leading = []
    for token in tokens:
        if token["stop"] > token["start"]:
            break
        leading.append(token)
    return leading


@dataclass(slots=True)
class Failure:
    error: Exception


async def interleave(streams: list[AsyncIterator[Event]]) -> AsyncIterator[Event]:
    """Events of several choices as they arrive; the first failure cancels the rest."""
    queue: asyncio.Queue[Event | Failure | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[Event]) -> None:
        try:
            async for event in stream:
                queue.put_nowait(event)
            queue.put_nowait(None)
        except Exception as error:
            queue.put_nowait(Failure(error))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Failure):
                raise item.error
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
