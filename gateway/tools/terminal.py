"""What the tools print of what a server said, made safe for a terminal and for XML.

A server under test chooses its error texts, model names and answers. Every line `chatgate probe`
and `chatgate conformance` print, and every text of their JUnit XML, passes through here (the
terminal rule itself lives in gateway/core/terminal.py, which the access log uses too)."""

from __future__ import annotations

import re

from gateway.core.terminal import UNSAFE, escaped, terminal_safe

__all__ = ["NOT_XML", "UNSAFE", "terminal_safe", "xml_safe"]

# what XML 1.0 cannot hold at all (the JUnit file would not parse)
NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """`text` as XML may hold it, and as a terminal may show it (a JUnit file is read in both)."""
    return NOT_XML.sub(escaped, terminal_safe(text))
