"""What the tools print of what a server said, made safe for a terminal and for XML.

A server under test chooses its error texts, model names and answers; printed raw they reach the
operator's terminal, where escape sequences retitle the window, clear the screen, hide text or
fake a verdict (OSC 52 even writes the clipboard). Every line `chatgate probe` and `chatgate
conformance` print, and every text of their JUnit XML, passes through here: control characters
other than newline and tab are shown escaped (`\\x1b`), never sent."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides that reorder
# what a terminal shows
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# what XML 1.0 cannot hold at all (the JUnit file would not parse)
NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def escaped(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]


def terminal_safe(text: str) -> str:
    """`text` with every control character shown as its escape, newlines and tabs kept."""
    return UNSAFE.sub(escaped, text)


def xml_safe(text: str) -> str:
    """`text` as XML may hold it, and as a terminal may show it (a JUnit file is read in both)."""
    return NOT_XML.sub(escaped, terminal_safe(text))
