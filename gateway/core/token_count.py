"""How many tokens a prompt is, before any backend has said: what admission charges to the token
limits and budgets, and what the context check adds to `max_tokens`.

With a deployment's `tokenizer` (a Hugging Face `tokenizer.json`) the count is the model's own;
without one it is about four characters a token. Either way the charge is corrected when the
backend reports the true count (gateway/runtime.py), so an estimate's error does not accumulate.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from gateway.core.canonical import prompt_text
from gateway.core.options import ConfigError

MESSAGE_OVERHEAD_TOKENS = 3  # role and separators, as chat templates add them
CHARACTERS_PER_TOKEN = 4
# Prompts longer than this are counted in a thread: a tokenizer takes milliseconds per 100 KB,
# far too long to hold the event loop (the tokenizers library releases the GIL while it works).
IN_THREAD_CHARACTERS = 64 * 1024


def estimate(messages: list[dict[str, Any]]) -> int:
    """About four characters a token, plus a few per message: cheap, and never zero."""
    return math.ceil(len(prompt_text(messages)) / CHARACTERS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS * len(
        messages
    )


class PromptCounter:
    """A deployment's way of counting prompt tokens."""

    def __init__(self, tokenizer_file: Path | None) -> None:
        self.tokenizer: Any = None
        if tokenizer_file is not None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ConfigError(
                    f"tokenizer {tokenizer_file}: the tokenizers package is not installed "
                    "(pip install 'chatgate[tokenizers]')"
                ) from None
            try:
                self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
            except Exception as error:  # the library raises its own kinds for a bad file
                raise ConfigError(f"tokenizer {tokenizer_file}: cannot be read: {error}") from None

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    async def count(self, messages: list[dict[str, Any]]) -> int:
        if self.tokenizer is None:
            return estimate(messages)
        texts = [prompt_text([message]) for message in messages]
        if sum(map(len, texts)) > IN_THREAD_CHARACTERS:
            return await asyncio.to_thread(self.tokens_in, texts)
        return self.tokens_in(texts)

    def tokens_in(self, texts: list[str]) -> int:
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return sum(len(e.ids) for e in encodings) + MESSAGE_OVERHEAD_TOKENS * len(texts)
