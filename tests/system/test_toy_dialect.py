"""A dialect that is not OpenAI-shaped fits the translator seam: in a copy of the tree, a throwaway
`toy` dialect — its own small document (a prompt in parts; an answer of its own; a stream of
named events), a translator module that implements `gateway.dialects.translator.Translator`
directly (no `OpenAIShaped`), one registry line and its generated types — type-checks against
the protocol and is served end to end: a whole answer, a stream of named events that opens and
closes in its own words, and errors in its own shape, before the stream and in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port, wait_until_healthy
from tests.support.tree_copy import copy_tree, run_in

TREE = ("backends", "gateway", "generated", "openapi", "pyproject.toml")
REGISTRY = Path("gateway/dialects/__init__.py")
MAX_RESPONSE_BYTES = 1024  # the smallest the configuration takes: a long stream breaks off past it

DOCUMENT = """\
openapi: 3.0.3
info:
  title: chatgate — toy dialect (throwaway)
  version: "1.0.0"
  description: A prompt in parts; an answer of its own; a stream of named events.
paths:
  /generate:
    post:
      operationId: generate
      requestBody:
        required: true
        content:
          application/json:
            schema:
              $ref: "#/components/schemas/ToyRequest"
      responses:
        "200":
          description: The answer, whole or as named events.
          content:
            application/json:
              schema:
                $ref: "#/components/schemas/ToyAnswer"
            text/event-stream:
              schema:
                type: string
        default:
          description: An error.
          content:
            application/json:
              schema:
                $ref: "#/components/schemas/ToyError"
components:
  schemas:
    ToyRequest:
      type: object
      additionalProperties: false
      required: [prompt_parts]
      properties:
        model:
          type: string
        prompt_parts:
          type: array
          minItems: 1
          items:
            type: string
        stream:
          type: boolean
        max_tokens:
          type: integer
          minimum: 1
    ToyAnswer:
      type: object
      required: [type, answer_id, text, ended_by, tokens]
      properties:
        type:
          type: string
          enum: [answer]
        answer_id:
          type: string
        text:
          type: string
        ended_by:
          type: string
        tokens:
          $ref: "#/components/schemas/ToyTokens"
    ToyTokens:
      type: object
      required: [read, written]
      properties:
        read:
          type: integer
        written:
          type: integer
    ToyError:
      type: object
      required: [type, problem]
      properties:
        type:
          type: string
          enum: [error]
        problem:
          type: object
          required: [kind, says]
          properties:
            kind:
              type: string
            says:
              type: string
"""

TRANSLATOR_MODULE = '''"""Toy: POST /generate, a prompt in parts; a whole answer or named events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.core.canonical import ChatRequest, Completion, Event, Finish, TextDelta, Usage
from gateway.core.errors import GatewayError
from gateway.dialects.dialect import Dialect
from gateway.dialects.framing import NamedEventSSE
from gateway.dialects.translator import Answer, DocumentFacts, RenderedError

if TYPE_CHECKING:
    from generated import toy as toy_doc


@dataclass(slots=True)
class ToyStream:
    """What a toy stream remembers: whether it has begun, and how many pieces went out."""

    begun: bool = False
    pieces: int = 0


class ToyTranslator:
    framing = NamedEventSSE()
    id_prefix = "toy_"

    def __init__(self, facts: DocumentFacts) -> None:
        self.facts = facts

    def read(self, body: toy_doc.ToyRequest) -> ChatRequest:
        return ChatRequest(
            model=body.get("model"),
            messages=[{"role": "user", "content": part} for part in body["prompt_parts"]],
            stream=bool(body.get("stream")),
            max_tokens=body.get("max_tokens"),
        )

    def completion(self, answer: Answer, completion: Completion) -> toy_doc.ToyAnswer:
        choice = completion.choices[0]
        usage = completion.usage
        return {
            "type": "answer",
            "answer_id": answer.id,
            "text": choice.text or "",
            "ended_by": choice.finish_reason or "stop",
            "tokens": {"read": usage.prompt_tokens, "written": usage.completion_tokens},
        }

    def new_stream_state(self) -> ToyStream:
        return ToyStream()

    def chunks(self, answer: Answer, event: Event, state: ToyStream) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not state.begun:  # the first event opens the stream
            state.begun = True
            out.append({"type": "toy.begin", "answer_id": answer.id, "model": answer.model})
        if isinstance(event, TextDelta) and event.text:
            state.pieces += 1
            out.append({"type": "toy.piece", "seq": state.pieces, "text": event.text})
        elif isinstance(event, Finish):
            out.append({"type": "toy.ended", "ended_by": event.reason})
        elif isinstance(event, Usage):  # the last event of every answer closes the stream
            tokens = {"read": event.prompt_tokens, "written": event.completion_tokens}
            out.append({"type": "toy.done", "pieces": state.pieces, "tokens": tokens})
        return out

    def error_body(self, error: GatewayError) -> toy_doc.ToyError:
        return {"type": "error", "problem": {"kind": error.kind, "says": error.message}}

    def error(self, error: GatewayError, request_id: str) -> RenderedError:
        return RenderedError(error.status, self.error_body(error), dict(error.headers))

    def stream_error(self, error: GatewayError, request_id: str, state: ToyStream) -> toy_doc.ToyError:
        return self.error_body(error)


DIALECT = Dialect(
    name="toy",
    document="toy.yaml",
    translator=ToyTranslator,
    chat_operations=("generate",),
)
'''

CONFIG = f"server:\n  max_response_bytes: {MAX_RESPONSE_BYTES}\n"


@pytest.fixture(scope="module")
def copy_with_a_toy_dialect(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = copy_tree(TREE, tmp_path_factory.mktemp("toy") / "chatgate")
    # 1. its document
    (tree / "openapi" / "toy.yaml").write_text(DOCUMENT)
    # 2. its translator module, implementing the protocol
    (tree / "gateway" / "dialects" / "toy.py").write_text(TRANSLATOR_MODULE)
    # 3. one line in the registry
    registry = tree / REGISTRY
    text = registry.read_text()
    last = '    "ovms": "/v3",\n'
    assert text.count(last) == 1, "the registry's shape changed: update the recipe"
    registry.write_text(text.replace(last, last + '    "toy": "/toy",\n'))
    # 4. its types, as `python -m gateway.tools.codegen` writes them (for its document only)
    generate = "from gateway.tools.codegen import FLAGS; print('\\0'.join(FLAGS))"
    flags = run_in(tree, [sys.executable, "-c", generate]).stdout.strip().split("\0")
    module = ["--input", "openapi/toy.yaml", "--output", "generated/toy.py"]
    run_in(tree, [sys.executable, "-m", "datamodel_code_generator", *module, *flags])
    return tree


@pytest.fixture(scope="module")
def toy_url(copy_with_a_toy_dialect: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tree = copy_with_a_toy_dialect
    logs = tmp_path_factory.mktemp("toy-logs")
    (logs / "config.yaml").write_text(CONFIG)
    port = free_port()
    log = logs / "gateway.log"
    command = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--config", str(logs / "config.yaml")],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log)
        yield url
    finally:
        process.terminate()
        process.wait(20)


def named_events(raw: str) -> list[tuple[str, dict]]:
    """(event name, data) of each event of a named-event stream; every event has both lines."""
    found = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        found.append((lines[0].removeprefix("event: "), json.loads(lines[1].removeprefix("data: "))))
    return found


def test_the_type_check_holds_it_to_the_protocol(copy_with_a_toy_dialect: Path):
    run_in(
        copy_with_a_toy_dialect,
        [sys.executable, "-m", "mypy", "gateway/dialects/toy.py", "gateway/dialects/registry.py"],
    )


def test_a_whole_answer_in_its_shape(toy_url: str):
    body = {"model": "echo", "prompt_parts": ["Hello,", "toy"]}
    answer = httpx.post(f"{toy_url}/toy/generate", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    said = answer.json()
    assert said["type"] == "answer" and said["answer_id"].startswith("toy_")
    assert "toy" in said["text"] and said["ended_by"] == "stop"
    assert said["tokens"]["read"] > 0 and said["tokens"]["written"] > 0


def test_a_stream_of_named_events(toy_url: str):
    # a few tokens: the stream stays below the largest answer relayed (the next test passes it)
    body = {"model": "echo", "prompt_parts": ["Hello, toy stream"], "max_tokens": 6}
    whole = httpx.post(f"{toy_url}/toy/generate", json=body, timeout=30).json()
    with httpx.stream("POST", f"{toy_url}/toy/generate", json={**body, "stream": True}, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        raw = answer.read().decode()
    events = named_events(raw)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)  # each event is named by its type
    pieces = [data for name, data in events if name == "toy.piece"]
    assert names == ["toy.begin", *["toy.piece"] * len(pieces), "toy.ended", "toy.done"]
    assert [p["seq"] for p in pieces] == list(range(1, len(pieces) + 1))
    assert "".join(p["text"] for p in pieces) == whole["text"]  # the same answer, in pieces
    assert events[-2][1] == {"type": "toy.ended", "ended_by": whole["ended_by"]}
    begin, done = events[0][1], events[-1][1]
    assert begin["answer_id"].startswith("toy_") and begin["model"] == "echo"
    assert done["pieces"] == len(pieces) and done["tokens"]["written"] > 0
    assert "[DONE]" not in raw  # no end marker: the last named event ends it


def test_an_error_before_the_answer_in_its_shape(toy_url: str):
    refused = httpx.post(f"{toy_url}/toy/generate", json={"model": "echo"}, timeout=30)
    assert refused.status_code == 400  # its document validates: prompt_parts is required
    said = refused.json()
    assert said["type"] == "error" and "prompt_parts" in said["problem"]["says"]
    assert set(said) == {"type", "problem"} and set(said["problem"]) == {"kind", "says"}


def test_an_error_in_the_stream_in_its_shape(toy_url: str):
    """Past the largest answer relayed, the stream breaks off with the dialect's own error
    event (after the 200 went out), and nothing closes it as if it had ended well."""
    long_prompt = " ".join(f"word{i}" for i in range(400))
    body = {"model": "echo", "prompt_parts": [long_prompt], "stream": True}
    with httpx.stream("POST", f"{toy_url}/toy/generate", json=body, timeout=30) as answer:
        assert answer.status_code == 200
        raw = answer.read().decode()
    events = named_events(raw)
    names = [name for name, _ in events]
    assert names[0] == "toy.begin" and names[-1] == "error"
    assert "toy.done" not in names
    error = events[-1][1]
    assert error["type"] == "error" and set(error["problem"]) == {"kind", "says"}


def test_a_dialect_without_probes_is_said_not_probed(copy_with_a_toy_dialect: Path):
    """It names no probe set: the conformance run's features say so, no KeyError."""
    check = (
        "from gateway.tools.conformance_target import Model, features_of;"
        "print(features_of('http://127.0.0.1:9/toy', 'toy', Model('echo', '--model'), {}, 1.0))"
    )
    said = run_in(copy_with_a_toy_dialect, [sys.executable, "-c", check]).stdout
    assert "not probed" in said and "toy" in said
