"""The local backend: a Hugging Face transformers causal LM from a local directory, run in process.

Nothing is downloaded: the model and tokenizer load with `local_files_only=True` from `path`.
Decoding is a hand-written loop over the model's forward pass (with its KV cache), so that
sampling, streaming, logprobs and stop strings are exact rather than reconstructed afterwards:

- the prompt is the tokenizer's chat template with `add_generation_prompt=True` (or the
  `chat_template` option); a tokenizer without one gets FALLBACK_CHAT_TEMPLATE below:
  `<bos>role: content` blocks separated by blank lines, then `assistant:`;
- each step turns the last logits into a distribution: + logit_bias, repetition penalty (CTRL style,
  over prompt and output), frequency and presence penalties (OpenAI style, over the output),
  ÷ temperature; **logprobs are the log-softmax of that distribution**, before the top-k / top-p /
  min-p truncation (so alternatives keep finite values; at temperature 0 the ÷ is skipped);
- temperature 0 is greedy; otherwise the truncated distribution is sampled with a
  `torch.Generator` owned by the request (same seed → same output);
- the n choices of one request decode together as one batch;
- text is emitted when it decodes cleanly (a token holding part of a UTF-8 character waits for
  the rest), and text that could be the start of a stop string is held until it is not.

The model runs in a small thread pool (`max_concurrency` workers), never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, DirectoryPath, Field, ValidationError

from backends.base import Capabilities
from backends.local.sampling import MAX_N, MAX_TOP_LOGPROBS, Sampling, parameter_table, sampling_for
from backends.stop_strings import held_back
from gateway.core.canonical import (
    ChatRequest,
    Event,
    Finish,
    TextDelta,
    TokenLogprob,
    TopLogprob,
    Usage,
    part_text,
)
from gateway.core.errors import BadRequest, GatewayError, InternalError, NotFound, ServiceUnavailable
from gateway.core.options import describe

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError:  # the `local` extra is not installed; LocalBackend() says so
    torch = None  # type: ignore[assignment]

log = logging.getLogger("chatgate.local")

INSTALL_HINT = "the local backend needs torch and transformers: pip install 'chatgate[local]' and PyTorch"

FALLBACK_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CONTEXT_LENGTH_ATTRIBUTES = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "max_seq_len",
    "seq_length",
)
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded with the output, so the first word keeps its space
REPLACEMENT_CHARACTER = "\ufffd"  # what a partial UTF-8 sequence decodes to


class LocalOptions(BaseModel):
    """The deployment's `options:` for the local backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: DirectoryPath = Field(description="Directory holding the model and tokenizer files.")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: float32 on CPU, bfloat16 (or float16) on CUDA."
    )
    max_concurrency: int | None = Field(
        default=None, ge=1, description="Requests decoded at once (default 1 on CPU, 2 on CUDA)."
    )
    chat_template: str | None = Field(
        default=None, description="A Jinja chat template that replaces the tokenizer's."
    )
    context_length: int | None = Field(
        default=None, ge=1, description="Cap on prompt + output tokens (default: the model's)."
    )
    default_max_tokens: int | None = Field(
        default=None, ge=1, description="Output limit when a request sets none (default: the context)."
    )
    trust_remote_code: bool = False
    torch_threads: int | None = Field(
        default=None,
        ge=1,
        description="torch's intra-op threads, process-wide (default: torch's, one per core). On a "
        "CPU that other busy processes share, 1 (or OMP_WAIT_POLICY=PASSIVE in the environment) "
        "keeps OpenMP's spinning threads from starving the decode loop (measured: 10x slower).",
    )


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shaped messages → what chat templates expect: string content, `developer` as `system`."""
    converted = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in ("text", "refusal"):
                    raise NotFound(
                        f"This model accepts text only; it cannot take a '{kind}' content part.",
                        param="messages",
                        code="UnsupportedModality",
                    )
                texts.append(part_text(part))
            content = "\n".join(texts)
        role = message.get("role")
        converted.append(
            {**message, "role": "system" if role == "developer" else role, "content": content or ""}
        )
    return converted


class TextAssembler:
    """One choice's output text: incremental detokenization, then stop strings.

    Detokenization decodes a short window of ids twice (without and with the new token) and emits
    the difference once it no longer ends in a partial character, as TGI and vLLM do; the window
    starts with a few prompt tokens so that the first word keeps its leading space.
    """

    def __init__(self, decode: Callable[[list[int]], str], context: list[int], sampling: Sampling) -> None:
        self.decode = decode
        self.ids = list(context)
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stops = sampling.stop
        self.include_stop = sampling.include_stop
        self.pending = ""  # decoded but held back: it could be the start of a stop string
        self.matched: str | None = None  # the stop string that ended the text

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a token; return the text now safe to emit and whether a stop string matched."""
        self.ids.append(token_id)
        prefix = self.decode(self.ids[self.prefix_offset : self.read_offset])
        text = self.decode(self.ids[self.prefix_offset :])
        if len(text) <= len(prefix) or text.endswith(REPLACEMENT_CHARACTER):
            return "", False
        self.pending += text[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self.release()

    def release(self) -> tuple[str, bool]:
        matches = [(at, len(s), s) for s in self.stops if (at := self.pending.find(s)) >= 0]
        if matches:
            at, length, self.matched = min(matches)
            return self.pending[: at + length if self.include_stop else at], True
        ready = self.pending[: len(self.pending) - held_back(self.pending, self.stops)]
        self.pending = self.pending[len(ready) :]
        return ready, False

    def flush(self) -> str:
        """Everything still held, at the end of generation (a trailing partial character included)."""
        tail = self.decode(self.ids[self.prefix_offset :])[
            len(self.decode(self.ids[self.prefix_offset : self.read_offset])) :
        ]
        text, self.pending = self.pending + tail, ""
        self.prefix_offset = self.read_offset = len(self.ids)
        return text


@dataclass(slots=True)
class ChoiceState:
    assembler: TextAssembler
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tokens: int = 0
    finished: bool = False


class LocalBackend:
    """A transformers causal LM in this process; see the module docstring for how it decodes."""

    name = "local"

    def __init__(self, model: str = "local", **options: Any) -> None:
        if torch is None:
            raise RuntimeError(INSTALL_HINT)
        try:
            self.options = LocalOptions.model_validate(options)
        except ValidationError as error:
            raise ValueError(f"local backend '{model}' options: {describe(error)}") from None
        self.model_name = model
        self.device = self.pick_device(self.options.device)
        if self.options.torch_threads:
            torch.set_num_threads(self.options.torch_threads)
        path = Path(self.options.path)
        trust = self.options.trust_remote_code
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                path, local_files_only=True, trust_remote_code=trust
            )
            self.model = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, trust_remote_code=trust, dtype=self.pick_dtype()
            ).to(self.device)  # type: ignore[arg-type]  # transformers types `to` narrowly
        except (OSError, ValueError) as error:
            raise ValueError(f"local backend '{model}': cannot load a model from {path}: {error}") from None
        self.model.eval()
        self.chat_template = (
            self.options.chat_template or self.tokenizer.chat_template or FALLBACK_CHAT_TEMPLATE
        )
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.eos_ids = self.find_eos_ids()
        self.keeps_last_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.token_texts: dict[int, str] = {}
        # A fast tokenizer's Rust core refuses concurrent use ("Already borrowed"): one at a time.
        self.tokenizer_lock = threading.Lock()
        context_length = self.context_length = self.find_context_length()
        self.capabilities = Capabilities(
            modalities=frozenset({"text"}),
            parameters=parameter_table(context_length, self.vocab_size),
            response_formats=frozenset({"text"}),
            max_n=MAX_N,
            max_top_logprobs=MAX_TOP_LOGPROBS,
            context_length=context_length,
        )
        workers = self.options.max_concurrency or (1 if self.device.type == "cpu" else 2)
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chatgate-local")
        self.closed = threading.Event()

    # ----- loading ---------------------------------------------------------------------

    @staticmethod
    def pick_device(choice: str) -> torch.device:
        if choice == "cuda" and not torch.cuda.is_available():
            raise ValueError("local backend: device 'cuda' was asked for but CUDA is not available")
        if choice == "auto":
            choice = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.device(choice)

    def pick_dtype(self) -> torch.dtype:
        choice = self.options.dtype
        if choice == "auto" and self.device.type == "cpu":
            return torch.float32
        if choice == "auto":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return getattr(torch, choice)

    def find_eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            ids.update([value] if isinstance(value, int) else value or [])
        return frozenset(ids)

    def find_context_length(self) -> int:
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        model_length = next(
            (v for a in CONTEXT_LENGTH_ATTRIBUTES if isinstance(v := getattr(text_config, a, None), int)),
            None,
        )
        if model_length is None:
            tokenizer_length = getattr(self.tokenizer, "model_max_length", None)
            model_length = (
                tokenizer_length if isinstance(tokenizer_length, int) and tokenizer_length < 1 << 24 else 2048
            )
        cap = self.options.context_length
        return min(model_length, cap) if cap else model_length

    async def aclose(self) -> None:
        self.closed.set()  # queued and running jobs see it and end at once
        self.executor.shutdown(wait=False)

    # ----- the async face --------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        sampling = sampling_for(request, self.capabilities.parameters, self.options.default_max_tokens)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()
        cancelled = threading.Event()

        def send(item: Event | BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def job() -> None:
            try:
                if not cancelled.is_set() and not self.closed.is_set():
                    self.decode(request.messages, sampling, send, cancelled)
            except BaseException as error:  # handed to the event loop and raised there
                send(error)
            finally:
                send(None)

        if self.closed.is_set():
            raise ServiceUnavailable("The local model is shutting down.")
        loop.run_in_executor(self.executor, job)
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise self.gateway_error(item)
                yield item
        finally:
            cancelled.set()  # the worker stops at its next token if the client went away

    @staticmethod
    def gateway_error(error: BaseException) -> GatewayError:
        if isinstance(error, GatewayError):
            return error
        if isinstance(error, torch.OutOfMemoryError):
            return ServiceUnavailable(
                "The local model is out of memory; try again later or ask for fewer tokens.",
                headers={"Retry-After": "1"},
            )
        log.error("local model failed", exc_info=error)
        return InternalError("The local model failed while generating.")

    # ----- the decode loop (runs in a worker thread) -----------------------------------

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        try:
            with self.tokenizer_lock:
                text = self.tokenizer.apply_chat_template(
                    template_messages(messages),
                    chat_template=self.chat_template,
                    add_generation_prompt=True,
                    tokenize=False,
                )
        except GatewayError:
            raise
        except Exception as error:  # a template that refuses the conversation (e.g. role order)
            raise BadRequest(
                f"The model's chat template refused the messages: {error}", param="messages"
            ) from None
        with self.tokenizer_lock:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def output_budget(self, prompt_length: int, sampling: Sampling) -> int:
        context = self.context_length
        room = context - prompt_length
        asked = sampling.max_new_tokens
        if room < 1 or (asked is not None and asked > room):  # as OpenAI words it
            raise BadRequest(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_length + (asked or 1)} tokens ({prompt_length} in the messages, "
                f"{asked or 1} in the completion).",
                param="messages" if room < 1 else "max_tokens",
                code="context_length_exceeded",
            )
        return room if asked is None else asked

    def token_text(self, token_id: int) -> str:
        text = self.token_texts.get(token_id)
        if text is None:
            with self.tokenizer_lock:
                text = self.token_texts[token_id] = str(self.tokenizer.decode([token_id]))
        return text

    def decode_text(self, ids: list[int]) -> str:
        with self.tokenizer_lock:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def forward(self, input_ids: torch.Tensor, past: Any) -> tuple[torch.Tensor, Any]:
        kwargs = {"logits_to_keep": 1} if self.keeps_last_logits else {}
        output = self.model(input_ids=input_ids, past_key_values=past, use_cache=True, **kwargs)
        return output.logits[:, -1, :].float(), output.past_key_values

    def decode(
        self,
        messages: list[dict[str, Any]],
        sampling: Sampling,
        send: Callable[[Event], None],
        cancelled: threading.Event,
    ) -> None:
        prompt = self.prompt_ids(messages)
        if not prompt:
            raise BadRequest("The chat template made an empty prompt of these messages.", param="messages")
        budget = self.output_budget(len(prompt), sampling)
        n, device = sampling.n, self.device
        generator = torch.Generator(device=device)
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed % (1 << 64))
        context = prompt[-PROMPT_CONTEXT_TOKENS:]
        choices = [ChoiceState(TextAssembler(self.decode_text, context, sampling)) for _ in range(n)]
        processor = LogitsProcessor(sampling, self.vocab_size, prompt, n, device)
        with torch.inference_mode():
            logits, past = self.forward(torch.tensor([prompt] * n, device=device), None)
            for step in range(budget):
                if cancelled.is_set() or self.closed.is_set():
                    return
                scores = processor.process(logits)
                tokens = processor.choose(scores, generator)
                logprobs = self.step_logprobs(scores, tokens, sampling) if sampling.logprobs else None
                last_step = step == budget - 1
                for index, choice in enumerate(choices):
                    if not choice.finished:
                        entry = logprobs[index] if logprobs else None
                        self.advance(index, choice, tokens[index], entry, last_step, sampling, send)
                if all(choice.finished for choice in choices):
                    break
                processor.count(tokens)
                logits, past = self.forward(torch.tensor(tokens, device=device)[:, None], past)
        send(Usage(len(prompt), sum(choice.tokens for choice in choices)))

    def step_logprobs(
        self, scores: torch.Tensor, tokens: list[int], sampling: Sampling
    ) -> list[TokenLogprob]:
        """One logprob entry per choice for this step's tokens, from the processed distribution."""
        logprobs = torch.log_softmax(scores, dim=-1)
        rows = torch.arange(len(tokens), device=scores.device)
        chosen = logprobs[rows, torch.tensor(tokens, device=scores.device)].tolist()
        entries = []
        tops: Iterable[tuple[list[float], list[int]]]
        if sampling.top_logprobs:
            values, ids = torch.topk(logprobs, sampling.top_logprobs, dim=-1)  # sorted, largest first
            tops = zip(values.tolist(), ids.tolist(), strict=True)
        else:
            tops = (([], []) for _ in tokens)
        for token, logprob, (top_values, top_ids) in zip(tokens, chosen, tops, strict=True):
            top = [TopLogprob(self.token_text(i), v) for v, i in zip(top_values, top_ids, strict=True)]
            entries.append(TokenLogprob(self.token_text(token), logprob, top))
        return entries

    def advance(
        self,
        index: int,
        choice: ChoiceState,
        token: int,
        entry: TokenLogprob | None,
        last_step: bool,
        sampling: Sampling,
        send: Callable[[Event], None],
    ) -> None:
        """Feed one sampled token to a choice and send the events it causes."""
        choice.tokens += 1
        if token in self.eos_ids and not sampling.ignore_eos:
            choice.finished = True
            self.send_text(index, choice, choice.assembler.flush(), send, force=True, last=True)
            send(Finish(index, "stop"))
            return
        if entry is not None:
            choice.logprobs.append(entry)
        text, stopped = choice.assembler.push(token)
        if stopped:
            choice.finished = True
            self.send_text(index, choice, text, send, force=True, last=True)
            send(Finish(index, "stop_sequence", choice.assembler.matched))
            return
        if last_step:
            choice.finished = True
            self.send_text(index, choice, text + choice.assembler.flush(), send, force=True, last=True)
            send(Finish(index, "length"))
            return
        self.send_text(index, choice, text, send)

    @staticmethod
    def send_text(
        index: int,
        choice: ChoiceState,
        text: str,
        send: Callable[[Event], None],
        force: bool = False,
        last: bool = False,
    ) -> None:
        """Send text with the logprobs of the tokens it came from (`force`: even with no text;
        `last`: the choice's Finish is sent next)."""
        if not text and not (force and choice.logprobs):
            return
        send(TextDelta(index, text, choice.logprobs or None, last=last))
        choice.logprobs = []


class LogitsProcessor:
    """Turns a step's logits into scores (bias, penalties, temperature) and picks the next tokens."""

    def __init__(self, sampling: Sampling, vocab_size: int, prompt: list[int], n: int, device: Any) -> None:
        self.sampling = sampling
        self.counts = torch.zeros(n, vocab_size, device=device)
        self.rows = torch.arange(n, device=device)
        self.in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.in_prompt[
            torch.tensor([i for i in prompt if i < vocab_size], dtype=torch.long, device=device)
        ] = True
        self.bias = None
        if sampling.logit_bias:
            self.bias = torch.zeros(vocab_size, device=device)
            for token_id, bias in sampling.logit_bias.items():
                self.bias[token_id] = bias

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        s = self.sampling
        scores = logits[:, : self.counts.shape[1]]
        if self.bias is not None:
            scores = scores + self.bias
        if s.repetition_penalty != 1.0:
            seen = self.in_prompt | (self.counts > 0)
            penalised = torch.where(scores > 0, scores / s.repetition_penalty, scores * s.repetition_penalty)
            scores = torch.where(seen, penalised, scores)
        if s.frequency_penalty or s.presence_penalty:
            scores = scores - self.counts * s.frequency_penalty - (self.counts > 0) * s.presence_penalty
        if not s.greedy and s.temperature != 1.0:
            scores = scores / s.temperature
        return scores

    def choose(self, scores: torch.Tensor, generator: torch.Generator) -> list[int]:
        s = self.sampling
        if s.greedy:
            return scores.argmax(dim=-1).tolist()
        if s.top_k and s.top_k < scores.shape[-1]:
            kth = torch.topk(scores, s.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if s.top_p < 1.0:
            ordered, order = torch.sort(scores, dim=-1, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            outside = (probs.cumsum(dim=-1) - probs) > s.top_p  # the most likely token always stays
            ordered = ordered.masked_fill(outside, float("-inf"))
            scores = torch.full_like(scores, float("-inf")).scatter(-1, order, ordered)
        if s.min_p > 0:
            probs = torch.softmax(scores, dim=-1)
            floor = probs.max(dim=-1, keepdim=True).values * s.min_p
            scores = scores.masked_fill(probs < floor, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1).tolist()

    def count(self, tokens: list[int]) -> None:
        self.counts[self.rows, torch.tensor(tokens, device=self.counts.device)] += 1
