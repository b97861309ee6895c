"""A stream's text pieces framed from a template (gateway/dialects/text_pieces.py): every
translator that has one frames each piece byte for byte as its `chunks` and its framing would,
whatever the text, and falls back to them wherever a template does not apply."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from gateway.app import facts_of
from gateway.chat import ChatPipeline
from gateway.core.canonical import Finish, RefusalDelta, ServedBy, TextDelta, ToolCallDelta
from gateway.dialects.openai import OpenAITranslator
from gateway.dialects.registry import DIALECTS
from gateway.dialects.responses import ResponsesTranslator
from gateway.dialects.responses import answers as responses_answers
from gateway.dialects.text_pieces import NUMBER_MARK, TEXT_MARK, cut
from gateway.dialects.translator import Answer
from gateway.http.documents import load_document
from tests.support.readers import chat_shaped
from tests.unit.dialects import cases
from tests.unit.dialects.cases import USAGE

# Texts whose JSON differs from the text: quotes, escapes, control and line-separator
# characters, non-ASCII, an SSE line and a JSON line inside the text, the empty text (which
# some dialects write nothing for), and the template's own marks.
HOSTILE_TEXTS = [
    "Hello",
    "",
    " ",
    'a "quote" and a \\ backslash',
    "é 日本 🎉",
    "\n\r\t\x00\x1f\x7f",
    "\u2028\u2029",
    "</script>",
    "data: [DONE]\n\n",
    '{"choices":[]}\n',
    TEXT_MARK,
    TEXT_MARK + NUMBER_MARK,
]
SAID = sum(bool(text) for text in HOSTILE_TEXTS)  # the texts that are written in every dialect

# Two choices begun, pieces of each, the backend's fingerprint arriving mid-stream, one choice
# finished while the other goes on (Azure holds that finish for the usage), then the end.
CHOICES_STREAM = [
    TextDelta(0, "first"),
    TextDelta(1, "first"),
    *(TextDelta(index, text) for text in HOSTILE_TEXTS for index in (0, 1)),
    ServedBy(system_fingerprint="fp_1", service_tier="default"),
    *(TextDelta(index, text) for text in HOSTILE_TEXTS for index in (1, 0)),
    Finish(0, "stop"),
    *(TextDelta(1, text) for text in HOSTILE_TEXTS),
    Finish(1, "length"),
    USAGE,
]
# One answer's blocks (Messages) or parts and items (Responses): text, a refusal in the midst of
# it, text again, a tool call that closes it, and text in a new block or message.
BLOCKS_STREAM = [
    TextDelta(0, "first"),
    *(TextDelta(0, text) for text in HOSTILE_TEXTS),
    RefusalDelta(0, "I can't."),
    *(TextDelta(0, text) for text in HOSTILE_TEXTS),
    ToolCallDelta(0, 0, "call_1", "get_weather", '{"city":"Paris"}'),
    TextDelta(0, "again"),
    *(TextDelta(0, text) for text in HOSTILE_TEXTS),
    ServedBy(system_fingerprint="fp_1", service_tier="default"),
    Finish(0, "stop"),
    USAGE,
]
# The pieces each stream's template frames: all but each choice's first (OpenAI-shaped), or
# each written piece but a block's first (Messages: the refusal goes on in the text block) or a
# text part's first (Responses: the refusal is a part of its own, and the text after it a new one).
TEMPLATED = {
    "chat": sum(type(event) is TextDelta for event in CHOICES_STREAM) - 2,
    "anthropic": 3 * SAID,
    "responses": 3 * SAID - 1,
}


# The Responses API's translator, an operation of OpenAI's document (test_responses.py)
RESPONSES = ResponsesTranslator(
    facts_of(load_document("openai.yaml"), ("createResponse",)), errors=OpenAITranslator
)


def translator_of(name: str) -> Any:
    return RESPONSES if name == "responses" else cases.translator(name)


def answer_of(name: str) -> Answer:
    """A streamed answer, its usage asked for, to a request read in the dialect's own way."""
    if name == "responses":
        request = RESPONSES.read({"model": cases.MODEL, "input": "Hi", "stream": True})
        return Answer("resp_0123456789abcdef", cases.CREATED, cases.MODEL, request)
    return cases.answer(include_usage=True)


def rendered_both_ways(
    translator: Any, events: list[Any], answer: Answer
) -> tuple[list[bytes], list[bytes], int]:
    """Each event's bytes rendered by `chunks` and the framing, and rendered with the text pieces
    `text_frame` frames, as gateway/chat.py renders them (each way through a stream state of its
    own); and how many pieces `text_frame` framed."""
    expected, _, _ = rendered(translator, events, answer, templated=False)
    got, made, _ = rendered(translator, events, answer, templated=True)
    return expected, got, made


def rendered(
    translator: Any, events: list[Any], answer: Answer, *, templated: bool
) -> tuple[list[bytes], int, Any]:
    """The events' bytes, how many pieces `text_frame` framed, and the stream's state after."""
    ids["next"] = itertools.count(1)
    frame, state = translator.framing.frame, translator.new_stream_state()
    pieces, made = [], 0
    for event in events:
        piece = None
        if templated and type(event) is TextDelta:
            piece = translator.text_frame(answer, event, state)
        if piece is None:
            piece = b"".join(map(frame, translator.chunks(answer, event, state)))
        else:
            made += 1
        pieces.append(piece)
    return pieces, made, state


# The Responses API's item ids, counted from 1 again in each pass over a stream (`rendered`),
# and its time stood still, so that two passes compare byte for byte.
ids = {"next": itertools.count(1)}


@pytest.fixture(autouse=True)
def counted_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(responses_answers, "random_hex", lambda: f"{next(ids['next']):032x}")
    monkeypatch.setattr(responses_answers.time, "time", lambda: float(cases.CREATED))


def test_every_dialect_but_lmi_frames_text_pieces_from_a_template():
    """A translator without `text_frame` renders every piece whole: slower, not wrong, so a new
    dialect may come without one. This says which have one, so that one lost is seen."""
    every = [*DIALECTS, "responses"]
    framed = {name for name in every if hasattr(translator_of(name), "text_frame")}
    assert framed >= {"openai", "azure", "aleph_alpha", "ovms", "lmi", "anthropic", "responses"}
    assert not cases.translator("lmi").text_templated


@pytest.mark.parametrize("include_usage", [False, True], ids=["usage not asked for", "usage asked for"])
@pytest.mark.parametrize("dialect_name", [name for name in sorted(chat_shaped()) if name != "lmi"])
def test_an_openai_shaped_text_piece_is_the_piece_chunks_make(dialect_name: str, include_usage: bool):
    """Byte for byte what `chunks` and the framing make, whatever the text, with a fingerprint
    that arrives mid-stream or a finish held back; every piece but each choice's first is
    framed from its template."""
    translator = cases.translator(dialect_name)
    answer = cases.answer(include_usage=include_usage, n=2)
    expected, got, made = rendered_both_ways(translator, CHOICES_STREAM, answer)
    assert got == expected
    assert made == TEMPLATED["chat"]


@pytest.mark.parametrize("dialect_name", ["anthropic", "responses"])
def test_a_messages_or_responses_text_piece_is_the_piece_chunks_make(dialect_name: str):
    """Byte for byte what `chunks` and the framing make (the Responses API's sequence numbers
    counted alike), across the blocks, parts and items an answer opens and closes; and the
    answer the Responses stream keeps (its output text) is the same."""
    translator, answer = translator_of(dialect_name), answer_of(dialect_name)
    expected, got, made = rendered_both_ways(translator, BLOCKS_STREAM, answer)
    assert got == expected
    assert made == TEMPLATED[dialect_name]


def test_the_responses_stream_keeps_the_text_its_template_framed():
    """The Responses API keeps the whole response (`store`, `previous_response_id`): the text
    framed from a template is in it as text `chunks` wrote is."""
    answer = answer_of("responses")
    _, _, by_chunks = rendered(RESPONSES, BLOCKS_STREAM, answer, templated=False)
    _, made, by_template = rendered(RESPONSES, BLOCKS_STREAM, answer, templated=True)
    assert made == TEMPLATED["responses"]
    assert by_template.response == by_chunks.response
    assert by_template.sequence == by_chunks.sequence


def test_a_model_named_with_the_mark_is_rendered_without_a_template():
    """The template is cut at the mark's one place in the frame: a frame that holds it twice
    (a model named with it) is rendered as every other event is, never cut at the wrong place."""
    translator = cases.translator("openai")
    answer = Answer(cases.ANSWER_ID, cases.CREATED, TEXT_MARK, cases.request(stream=True))
    events = [TextDelta(0, "first"), *(TextDelta(0, text) for text in HOSTILE_TEXTS)]
    expected, got, made = rendered_both_ways(translator, events, answer)
    assert got == expected
    assert made == 0


def test_lmi_text_pieces_are_not_templated():
    """LMI holds a text marked `last` back for its finish reason (test_lmi.py): its pieces are
    rendered by `chunks`, which knows that."""
    translator = cases.translator("lmi")
    state, answer = translator.new_stream_state(), cases.answer()
    translator.chunks(answer, TextDelta(0, "first"), state)
    assert translator.text_frame(answer, TextDelta(0, "more"), state) is None


TEXT_JSON, NUMBER_JSON = orjson.dumps(TEXT_MARK), orjson.dumps(NUMBER_MARK)


@pytest.mark.parametrize(
    ("framed", "marks", "parts"),
    [
        (b'data: {"a":' + TEXT_JSON + b"}\n\n", (TEXT_MARK,), (b'data: {"a":', b"}\n\n")),
        (b"[" + TEXT_JSON + b"," + NUMBER_JSON + b"]", (TEXT_MARK, NUMBER_MARK), (b"[", b",", b"]")),
        (b"no mark", (TEXT_MARK,), None),
        (TEXT_JSON + b" twice " + TEXT_JSON, (TEXT_MARK,), None),
        (b"[" + NUMBER_JSON + b"," + TEXT_JSON + b"]", (TEXT_MARK, NUMBER_MARK), None),
    ],
    ids=["once", "two marks", "absent", "twice", "out of order"],
)
def test_cut(framed: bytes, marks: tuple[str, ...], parts: tuple[bytes, ...] | None):
    assert cut(framed, *marks) == parts


def pipeline_of(translator: Any) -> ChatPipeline:
    """The chat flow, as far as rendering an item needs it (its translator, and its `text_frame`
    as ChatPipeline.__init__ keeps it), without a runtime."""
    pipeline = object.__new__(ChatPipeline)
    pipeline.translator = translator
    pipeline.text_frame = translator.text_frame if getattr(translator, "text_templated", True) else None
    return pipeline


@pytest.mark.parametrize(
    "size", [0, 1, 3, 1000], ids=["events as items", "items of one event", "items of three", "one item"]
)
@pytest.mark.parametrize(
    ("dialect_name", "events"),
    [
        ("openai", CHOICES_STREAM),
        ("lmi", CHOICES_STREAM),
        ("anthropic", BLOCKS_STREAM),
        ("responses", BLOCKS_STREAM),
    ],
)
def test_the_chat_flow_renders_items_of_any_size_as_chunks_would(
    dialect_name: str, events: list[Any], size: int
):
    """gateway/chat.py renders what one read brought as one piece: the same bytes however the
    events are grouped into items (a model's pace: one an item; a burst: many)."""
    translator = translator_of(dialect_name)
    answer = cases.answer(include_usage=True, n=2) if events is CHOICES_STREAM else answer_of(dialect_name)
    expected, _, _ = rendered(translator, events, answer, templated=False)
    ids["next"] = itertools.count(1)
    pipeline, state = pipeline_of(translator), translator.new_stream_state()
    items = events if size == 0 else [events[at : at + size] for at in range(0, len(events), size)]
    assert b"".join(pipeline.rendered(answer, item, state) for item in items) == b"".join(expected)
