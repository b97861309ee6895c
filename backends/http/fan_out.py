"""Fan-out: a request for n choices made as n requests of one choice each, for an upstream that
ignores `n`. Their answers are joined as they arrive, request k's choice under index k; their
usages are summed into one, sent last (each request read the prompt: the upstream's work, and
what the request costs, is the sum).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from gateway.core.canonical import (
    CompletionTokensDetails,
    Event,
    EventStream,
    Item,
    Passed,
    PromptTokensDetails,
    ServedBy,
    Usage,
    each,
)

Details = TypeVar("Details", CompletionTokensDetails, PromptTokensDetails)


@dataclass(slots=True)
class Failure:
    error: Exception


async def joined(answers: list[EventStream]) -> EventStream:
    """The items of one-choice answers as they arrive, answer k's events indexed k, and then
    their summed usage; the first failure ends them all. Each answer is read at most one item
    ahead of the client (the queue holds one item per answer)."""
    queue: asyncio.Queue[tuple[int, Item] | Failure | None] = asyncio.Queue(len(answers))

    async def pump(k: int, answer: EventStream) -> None:
        try:
            async for item in answer:
                await queue.put((k, item))
        except Exception as error:
            await queue.put(Failure(error))
        else:
            await queue.put(None)
        finally:
            await answer.aclose()  # the upstream hung up on, when this ends early

    tasks = [asyncio.create_task(pump(k, answer)) for k, answer in enumerate(answers)]
    usages: list[Usage] = []
    try:
        running = len(tasks)
        while running:
            got = await queue.get()
            if got is None:
                running -= 1
                continue
            if isinstance(got, Failure):
                raise got.error
            k, item = got
            batch: list[Event] = []
            for event in each(item):
                if isinstance(event, Usage):
                    usages.append(event)
                    continue
                if not isinstance(event, ServedBy | Passed):
                    event.index = k
                batch.append(event)
            if batch:
                yield batch
        yield summed(usages)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def summed(usages: list[Usage]) -> Usage:
    """The usages added up, their details too (a count no usage gave stays unsaid)."""
    total = Usage(0, 0)
    for usage in usages:
        total = Usage(
            total.prompt_tokens + usage.prompt_tokens,
            total.completion_tokens + usage.completion_tokens,
            added(total.completion_tokens_details, usage.completion_tokens_details),
            added(total.prompt_tokens_details, usage.prompt_tokens_details),
        )
    return total


def added(first: Details | None, second: Details | None) -> Details | None:
    if first is None or second is None:
        return second if first is None else first
    counts: dict[str, Any] = {}
    for name in (f.name for f in fields(first)):
        mine, theirs = getattr(first, name), getattr(second, name)
        counts[name] = None if mine is None and theirs is None else (mine or 0) + (theirs or 0)
    return type(first)(**counts)
