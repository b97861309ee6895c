"""An upstream's streamed answer → one JSON payload per chunk, as its Content-Type says it is
framed: server-sent events (`data:` lines, ending with `[DONE]`), or JSON lines (one chunk per
line, no end marker: DJL LMI's `application/jsonlines`).

Both decoders take the body in whatever pieces the network delivers (an event split anywhere,
CRLF or LF line ends) and keep only the unfinished end between pieces, in a growing buffer
searched from where the last search stopped: one large event arriving in many pieces costs time
in proportion to its size, not to its size squared.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

# Content types of JSON lines streams: LMI's, and the common others.
JSON_LINES_TYPES = frozenset(
    {"application/jsonlines", "application/jsonl", "application/x-jsonlines", "application/x-ndjson"}
)
EVENT_STREAM_TYPE = "text/event-stream"


class StreamDecoder(Protocol):
    done: bool  # the stream said it is complete (SSE's [DONE]); JSON lines never say so

    def feed(self, piece: bytes) -> Iterable[bytes]: ...

    def close(self) -> Iterable[bytes]: ...


def decoder_for(media_type: str) -> StreamDecoder | None:
    """The decoder for a stream of this Content-Type (without parameters); None: not a stream."""
    if media_type == EVENT_STREAM_TYPE:
        return SSEDecoder()
    if media_type in JSON_LINES_TYPES:
        return JSONLinesDecoder()
    return None


class LineBuffer:
    """The unfinished end of a stream, with CRLF and CR line ends turned into LF as it arrives."""

    __slots__ = ("cr_held", "data", "separator")

    def __init__(self, separator: bytes) -> None:
        self.data = bytearray()
        self.separator = separator
        self.cr_held = False  # a CR that ended the last piece may be half a CRLF

    def complete(self, piece: bytes) -> bytes:
        """Add a piece; return everything up to the last separator (b"" if there is none yet)."""
        if self.cr_held:
            piece = b"\r" + piece
            self.cr_held = False
        # find, not `in`: a bytes `in` first tries its operand as an integer, and makes and drops
        # a TypeError for every piece and event (about twice find's time, twice a chunk)
        if piece.find(b"\r") >= 0:
            if piece.endswith(b"\r"):
                piece = piece[:-1]
                self.cr_held = True
            piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        data = self.data
        if not data:  # the usual case: nothing held from before
            end = piece.rfind(self.separator)
            if end < 0:
                data += piece
                return b""
            cut = end + len(self.separator)
            data += piece[cut:]
            return piece[:cut]
        start = max(0, len(data) - len(self.separator) + 1)
        data += piece
        end = data.find(self.separator, start)
        if end < 0:
            return b""
        end = data.rfind(self.separator, end)
        cut = end + len(self.separator)
        complete = bytes(data[:cut])
        del data[:cut]
        return complete

    def remainder(self) -> bytes:
        rest = bytes(self.data) + (b"\n" if self.cr_held else b"")
        self.data.clear()
        self.cr_held = False
        return rest


class SSEDecoder:
    """Server-sent events → the payload of each event's `data:` lines; stops at `[DONE]`.

    Payloads are produced lazily, event by event: a piece holding a whole stream (a fast
    upstream) yields its first event without scanning the rest first.
    """

    __slots__ = ("buffer", "done")

    def __init__(self) -> None:
        self.buffer = LineBuffer(b"\n\n")
        self.done = False

    def feed(self, piece: bytes) -> Iterable[bytes]:
        complete = self.buffer.complete(piece)
        if not complete:
            return ()
        # at a model's pace a piece is one event of one `data:` line (it ends the piece, so its
        # first line end is the piece's last but one byte): its payload without a generator
        if complete.startswith(b"data:") and complete.find(b"\n") == len(complete) - 2 and not self.done:
            value = complete[6:-2] if complete[5:6] == b" " else complete[5:-2]
            if value != b"[DONE]":
                return (value,)
        return self.payloads(complete)

    def close(self) -> Iterable[bytes]:
        """The stream ended: what its last lines still hold."""
        rest = self.buffer.remainder()
        return self.payloads(rest) if rest else ()

    def payloads(self, data: bytes) -> Iterator[bytes]:
        for event in data.split(b"\n\n"):
            if self.done:
                return
            if not event:
                continue
            if event.startswith(b"data:") and event.find(b"\n") < 0:  # the usual one-line event
                value = event[6:] if event[5:6] == b" " else event[5:]
            else:
                lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
                if not lines:
                    continue  # comments, event:, id:, retry: carry nothing needed here
                value = b"\n".join(line[6:] if line[5:6] == b" " else line[5:] for line in lines)
            if value == b"[DONE]":
                self.done = True
                return
            yield value


class JSONLinesDecoder:
    """JSON lines → each non-blank line; the stream's end is the body's end."""

    __slots__ = ("buffer", "done")

    def __init__(self) -> None:
        self.buffer = LineBuffer(b"\n")
        self.done = False

    def feed(self, piece: bytes) -> Iterable[bytes]:
        complete = self.buffer.complete(piece)
        return self.lines(complete) if complete else ()

    def close(self) -> Iterable[bytes]:
        rest = self.buffer.remainder()
        return self.lines(rest) if rest else ()

    @staticmethod
    def lines(data: bytes) -> Iterator[bytes]:
        for line in data.split(b"\n"):
            if line.strip():
                yield line
