"""A stream's text pieces, framed from a template.

Most of a stream's events are pieces of a text already begun, and a dialect frames each of them
as it framed the last one but for the text (and, in the Responses API, the event's sequence
number). A translator renders such a piece once with a mark in each of those places, cuts the
framed bytes at the marks' JSON, and frames the next pieces by joining the parts around their
own values: the same bytes, without a payload built and encoded whole for every piece. The
translators' `text_frame` say when a piece is such a piece; gateway/chat.py asks them first.
"""

from __future__ import annotations

import orjson

# What a template is rendered with, found again in the framed bytes by its JSON: private-use
# characters, which no field of a document has; a frame holding a mark anywhere else (a model
# named with it) is not cut.
TEXT_MARK = "\ue000chatgate text\ue001"
NUMBER_MARK = "\ue000chatgate number\ue001"


def cut(framed: bytes, *marks: str) -> tuple[bytes, ...] | None:
    """`framed` cut at each mark's JSON, in order (the parts before, between and after them);
    None unless each mark's JSON is in it exactly once, in that order."""
    parts = []
    rest = framed
    for mark in marks:
        encoded = orjson.dumps(mark)
        if framed.count(encoded) != 1:
            return None
        before, found, rest = rest.partition(encoded)
        if not found:  # there once, but before the last mark: not in the order asked
            return None
        parts.append(before)
    parts.append(rest)
    return tuple(parts)
