"""Stop strings in streamed text: the end of the text that must wait, because it could be the start
of a stop string that the next tokens complete. What a backend does with a match differs (TGI
stops itself and keeps the match, so the match is cut at the end; the local backend finds it), so
only this is shared."""

from __future__ import annotations

from collections.abc import Iterable


def held_back(text: str, stops: Iterable[str]) -> int:
    """How many characters at the end of `text` could begin a stop string (a whole one included)."""
    held = 0
    for stop in stops:
        for length in range(min(len(stop), len(text)), held, -1):
            if text.endswith(stop[:length]):
                held = length
                break
    return held


def ending(text: str, stops: Iterable[str]) -> str | None:
    """The stop string `text` ends with (the longest, when several do), or None."""
    return max((stop for stop in stops if stop and text.endswith(stop)), key=len, default=None)
