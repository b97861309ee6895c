"""Text a client or a server chose, made safe to show in a terminal.

A path, an error text or a model name printed raw reaches an operator's terminal (a log tailed,
a tool's output), where escape sequences retitle the window, clear the screen, hide text or fake
a verdict (OSC 52 even writes the clipboard). What the gateway logs of a client's request and
what the tools print of a server's answer pass through here: control characters other than
newline and tab are shown escaped (`\\x1b`), never sent."""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides that reorder
# what a terminal shows
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
ELLIPSIS = "…"


def escaped(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]


def terminal_safe(text: str) -> str:
    """`text` with every control character shown as its escape, newlines and tabs kept."""
    return UNSAFE.sub(escaped, text)


def bounded(text: str, limit: int) -> str:
    """`text` safe for a terminal and on one line, cut to `limit` characters (then ending in …)."""
    shown = terminal_safe(text[:limit]).replace("\n", "\\n").replace("\t", "\\t")
    return shown if len(shown) <= limit and len(text) <= limit else shown[: limit - 1] + ELLIPSIS
