"""The content filter: configured words and regular expressions, on prompts and on completions.

A prompt that trips it is refused (ContentFiltered, the Azure ContentFilterError); a
completion that trips it ends with finish_reason `content_filter`, cut before the match.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gateway.config.settings import ContentFilter, FilterRules
from gateway.core.canonical import (
    Event,
    Finish,
    Item,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    each,
    prompt_text,
)
from gateway.core.errors import ContentFiltered


def compile_rules(rules: FilterRules) -> re.Pattern[str] | None:
    return rules.compiled()


class Filter:
    def __init__(self, settings: ContentFilter) -> None:
        self.input = compile_rules(settings.input)
        self.output = compile_rules(settings.output)

    def check_prompt(self, messages: list[dict]) -> None:
        if self.input is not None and self.input.search(prompt_text(messages)):
            raise ContentFiltered(
                "The prompt was refused by the content filter; change it and try again.",
                param="messages",
                loc=["body", "messages"],
                code="content_filter",
            )

    def answer_screen(self) -> Callable[[Item], Item | None]:
        """One answer's screen (streamed or whole): an item through the output rules, each
        choice ended at its first filtered text; None when nothing of it passes."""
        assert self.output is not None, "answer_screen() only when there are output rules"
        seen: dict[int, str] = {}
        stopped: set[int] = set()
        screened = self.screened

        def screen(item: Item) -> Item | None:
            return [out for event in each(item) for out in screened(event, seen, stopped)] or None

        return screen

    def screened(self, event: Event, seen: dict[int, str], stopped: set[int]) -> list[Event]:
        """One event through the output rules: as it is, cut short, or not at all."""
        assert self.output is not None
        if isinstance(event, TextDelta | RefusalDelta | ToolCallDelta | Finish) and event.index in stopped:
            return []
        if isinstance(event, TextDelta):
            index = event.index
            before = seen.get(index, "")
            text = before + event.text
            match = self.output.search(text, max(0, len(before) - 200))
            if match:
                stopped.add(index)
                keep = max(0, match.start() - len(before))
                finish = Finish(index, "content_filter")
                return [TextDelta(index, event.text[:keep], None), finish] if keep else [finish]
            seen[index] = text
        return [event]
