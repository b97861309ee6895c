"""Prefix affinity: send a request to the replica whose prompt cache most likely holds the start
of its prompt, as llm-d's approximate prefix-cache scorer does, without asking the servers.

The prompt (its tools, then its messages, rendered as JSON) is cut into blocks of `block_chars`
characters; each block's hash is chained to the one before it, so one hash stands for the whole
prompt up to the end of its block. The table remembers which replicas were sent which block
hashes (a bounded table: the least recently used go first); a request goes to the replica
holding its deepest block, unless that replica is loaded past `bound` times the mean load of the
deployment's replicas (bounded-load consistent hashing), has no room, or is ejected: then the
usual pick chooses, and the replica it chooses is remembered too. A client's key
(`prompt_cache_key`, else a session header of gateway/core/trace.py's SESSION_HEADERS, else
`user`) sticks its requests to the replica that served the key last, before any prefix.

Python's string hash is salted per process; each worker keeps its own table, so that is fine.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import orjson

Outcome = Literal["", "hit", "miss", "overridden"]
HOLDERS_PER_BLOCK = 4  # replicas remembered for one block (the most recent first)


class Candidate(Protocol):
    @property
    def name(self) -> str: ...


R = TypeVar("R", bound=Candidate)


@dataclass(slots=True)
class Prompt:
    """A request's prompt as the table reads it; `outcome`: what the last pick made of it."""

    blocks: list[int]
    key: str | None = None
    outcome: Outcome = ""


def rendered(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> str:
    """The prompt in a stable text form: a template renders the tools first, then each message
    in order, so an equal start here is an equal start of the tokens the server caches."""
    parts = [orjson.dumps(tools, option=orjson.OPT_SORT_KEYS, default=str)] if tools else []
    parts.extend(orjson.dumps(m, option=orjson.OPT_SORT_KEYS, default=str) for m in messages)
    return b"\n".join(parts).decode()


def block_hashes(text: str, block_chars: int) -> list[int]:
    """The chained hashes of the prompt's whole blocks (a partial last block is not cached
    alike by every server, and changes with every token the client adds)."""
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        previous = hash((previous, text[start : start + block_chars]))
        hashes.append(previous)
    return hashes


def prompt_of(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], key: str | None, block_chars: int
) -> Prompt:
    return Prompt(block_hashes(rendered(messages, tools), block_chars), key)


class AffinityTable:
    """Which replicas hold which prefix blocks, and which replica each client key went to."""

    def __init__(self, max_blocks: int, bound: float) -> None:
        self.max_blocks = max_blocks
        self.bound = bound
        self.holders: OrderedDict[int, list[str]] = OrderedDict()
        self.keys: OrderedDict[str, str] = OrderedDict()

    def depths(self, prompt: Prompt) -> dict[str, int]:
        """Each replica's deepest block of the prompt (in blocks; the key's replica: deeper than
        any block)."""
        found: dict[str, int] = {}
        holders = self.holders
        for depth in range(len(prompt.blocks), 0, -1):
            for name in holders.get(prompt.blocks[depth - 1], ()):
                found.setdefault(name, depth)
        if prompt.key is not None and (keyed := self.keys.get(prompt.key)) is not None:
            found[keyed] = len(prompt.blocks) + 1
        return found

    def choose(
        self, prompt: Prompt, candidates: Sequence[R], loads: Sequence[float], load: Callable[[R], float]
    ) -> R | None:
        """The candidate (a replica with room, not ejected, not excluded) holding the deepest
        prefix of the prompt and loaded no more than `bound` times the mean of `loads` (the
        replicas' loads, in requests, this one's included); None when none holds any (a
        miss) or the one that holds it is overloaded or cannot take it (overridden). Sets
        `prompt.outcome`."""
        depths = self.depths(prompt)
        if not depths:
            prompt.outcome = "miss"
            return None
        deepest = max(depths.values())
        capacity = math.ceil(self.bound * (sum(loads) + 1) / max(1, len(loads)))
        best: R | None = None
        best_depth = 0
        for candidate in candidates:
            depth = depths.get(candidate.name, 0)
            if depth > best_depth and load(candidate) + 1 <= capacity:
                best, best_depth = candidate, depth
        prompt.outcome = "hit" if best is not None and best_depth == deepest else "overridden"
        return best if prompt.outcome == "hit" else None

    def learn(self, prompt: Prompt, name: str) -> None:
        """`name` was sent the prompt: it now holds its blocks (and the client's key)."""
        holders = self.holders
        for block in prompt.blocks:
            names = holders.get(block)
            if names is None:
                holders[block] = [name]
                if len(holders) > self.max_blocks:
                    holders.popitem(last=False)
                continue
            holders.move_to_end(block)
            if names[0] != name:
                if name in names:
                    names.remove(name)
                names.insert(0, name)
                del names[HOLDERS_PER_BLOCK:]
        if prompt.key is not None:
            self.keys[prompt.key] = name
            self.keys.move_to_end(prompt.key)
            if len(self.keys) > self.max_blocks:
                self.keys.popitem(last=False)
