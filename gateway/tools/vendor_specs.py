"""The vendors' own machine-readable documents (the "refspecs") as validators for what a
dialect answers.

They are not part of the repository: `scripts/fetch-refspecs` downloads the pinned versions
(refspecs.lock.yaml) into `refspecs/` at the repository root, or `$CHATGATE_REFSPECS` names a
folder that holds them (see `default_refspecs_dir`).

Each document is read once, the schemas we need are extracted with their `$ref` closure and
rewritten as JSON Schema 2020-12: OpenAI's 3.1 file still writes `nullable: true`, Azure's
Swagger 2.0 writes `x-nullable`, and the Aleph Alpha extract stores numbers and booleans as
strings ("-2", "true") and points at a schema it does not contain (SteeringConceptRef). Where
chatgate answers differently from a vendor's document on purpose (the seed, or the real
service, says otherwise), the difference is a `Deviation` applied to the vendor's schema, with
its reason; tests/integration/test_vendor_specs.py proves each one is still needed by what the gateway
answers (not by the project's own examples). Where the vendor's error bodies and the seed's
disagree in kind, errors are checked against the seed's tables (`seed_errors`).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
import yaml

REFSPECS_ENV = "CHATGATE_REFSPECS"
REPO_ROOT = Path(__file__).resolve().parents[2]
REF_PREFIXES = ("#/components/schemas/", "#/definitions/")
NUMBER_KEYWORDS = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
    }
)
BOOLEAN_KEYWORDS = frozenset(
    {"nullable", "x-nullable", "deprecated", "readOnly", "writeOnly", "uniqueItems", "additionalProperties"}
)
# (OpenAI's file also writes draft 2019-09's `$recursiveAnchor`/`$recursiveRef`, in a file-search
# filter the Responses schemas reach: dropped, so the recursive branch admits any filter)
NOT_SCHEMA_KEYWORDS = frozenset(
    {
        "nullable",
        "x-nullable",
        "example",
        "examples",
        "discriminator",
        "xml",
        "$recursiveAnchor",
        "$recursiveRef",
    }
)

# What a body is, for the validators: a whole completion, one stream chunk, an error body, …
COMPLETION, CHUNK, ERROR = "completion", "chunk", "error"


class RefspecsError(Exception):
    """`$CHATGATE_REFSPECS` (or `--refspecs`) names something that is not a folder."""


REFSPECS_HOW = f"run scripts/fetch-refspecs (needs internet) or set {REFSPECS_ENV}=DIR"


def checkout_refspecs_dir() -> Path | None:
    """`refspecs/` at the repository root, where `scripts/fetch-refspecs` writes; None when not
    running from a source checkout."""
    if not (REPO_ROOT / "pyproject.toml").is_file():
        return None
    return REPO_ROOT / "refspecs"


def default_refspecs_dir() -> Path | None:
    """Where the vendor documents are: `$CHATGATE_REFSPECS` when set (a `RefspecsError` when it
    is not a folder: no silent fallback), else `refspecs/` at the repository root of a source
    checkout if it exists, else None."""
    configured = os.environ.get(REFSPECS_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not path.is_dir():
            raise RefspecsError(f"{REFSPECS_ENV}={configured} is not a folder")
        return path
    fetched = checkout_refspecs_dir()
    return fetched if fetched is not None and fetched.is_dir() else None


# ----- reading a vendor document --------------------------------------------------------------


def read_document(path: Path) -> dict[str, Any]:
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader reads OpenAI's 3 MB in ~3 s
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader)


def schema_name(ref: str) -> str | None:
    for prefix in REF_PREFIXES:
        if ref.startswith(prefix):
            return ref.removeprefix(prefix).split("/", 1)[0]
    return None


def destring(key: str, value: Any, schema_type: Any) -> Any:
    """Undo the Aleph Alpha copy's strings: "-2" → -2, "true" → True."""
    if not isinstance(value, str):
        return value
    if key in NUMBER_KEYWORDS:
        number = float(value)
        return int(number) if number.is_integer() else number
    if key in BOOLEAN_KEYWORDS and value in ("true", "false"):
        return value == "true"
    if key == "default" and schema_type == "boolean" and value in ("true", "false"):
        return value == "true"
    return value


def to_2020_12(node: Any, known: set[str], dangling: set[str]) -> Any:
    """One OpenAPI 3.0/3.1 or Swagger 2.0 schema → JSON Schema 2020-12 with refs into `$defs`."""
    if isinstance(node, list):
        return [to_2020_12(item, known, dangling) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: destring(key, value, node.get("type")) for key, value in node.items()}
    if "$ref" in node and isinstance(node["$ref"], str):
        name = schema_name(node["$ref"])
        if name is not None and name not in known:
            dangling.add(name)  # the document points at a schema it does not hold: accept anything
            node = {k: v for k, v in node.items() if k != "$ref"}
        elif name is not None:
            prefix = next(p for p in REF_PREFIXES if node["$ref"].startswith(p))
            node["$ref"] = "#/$defs/" + node["$ref"].removeprefix(prefix)
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key in NOT_SCHEMA_KEYWORDS or (key.startswith("x-") and key != "x-nullable"):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
            converted[key] = {k: to_2020_12(v, known, dangling) for k, v in value.items()}
        elif key in ("enum", "const", "default", "required", "type"):
            converted[key] = value
        else:
            converted[key] = to_2020_12(value, known, dangling)
    if node.get("nullable") is True or node.get("x-nullable") is True:
        converted = admit_null(converted)
    return converted


def admit_null(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if (
        isinstance(kind, str)
        and "$ref" not in schema
        and not any(k in schema for k in ("allOf", "anyOf", "oneOf"))
    ):
        schema = {**schema, "type": [kind, "null"]}
        if "enum" in schema and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def closure(schemas: dict[str, Any], roots: list[str]) -> tuple[dict[str, Any], set[str]]:
    """The named schemas and every schema they reach, converted; and the names that dangle."""
    known = set(schemas)
    dangling: set[str] = set()
    found: dict[str, Any] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in found or name not in known:
            continue
        found[name] = to_2020_12(schemas[name], known, dangling)
        pending.extend(refs_in(found[name]))
    return found, dangling


def refs_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            yield ref.removeprefix("#/$defs/").split("/", 1)[0]
        for value in node.values():
            yield from refs_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs_in(item)


# ----- where chatgate differs on purpose ------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    """A change to a vendor schema that chatgate's answers need, and why it is right for us."""

    schema: str  # the vendor schema's name
    pointer: str  # a JSON pointer inside it ("/properties/object/enum")
    value: Any  # what is written there
    why: str

    @property
    def name(self) -> str:
        return f"{self.schema}{self.pointer}"

    def apply(self, schemas: dict[str, Any]) -> None:
        if not self.pointer:  # the whole schema
            schemas[self.schema] = copy.deepcopy(self.value)
            return
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in self.pointer.split("/")[1:]]
        target = schemas[self.schema]
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = copy.deepcopy(self.value)


@dataclass(frozen=True)
class VendorDocument:
    """One vendor document and the schema each kind of body of a dialect must match."""

    dialect: str
    file: str
    schemas_at: tuple[str, ...]  # where the document keeps its schemas
    kinds: dict[str, str]  # body kind → vendor schema name
    answers: dict[tuple[str, str], str]  # (method, path in our document) → what its 200 JSON is
    # (method, path) → what each event of its stream is, where not a chat chunk (CHUNK)
    streams: dict[tuple[str, str], str] = field(default_factory=dict)
    deviations: tuple[Deviation, ...] = ()
    # bodies the vendor's document describes differently in kind, not in detail: not checked
    not_checked: dict[str, str] = field(default_factory=dict)
    # schemas the document writes inline rather than under a name: name given here → its JSON
    # pointer in the document (a 200 answer's schema, say)
    inline: dict[str, str] = field(default_factory=dict)
    # the error bodies of the dialect's seed, status → JSON Schema ("default": any other status),
    # checked in place of the vendor document's (see `not_checked`)
    seed_errors: dict[int | str, dict[str, Any]] = field(default_factory=dict)


def seed_error(
    name: str, status: int | None, error: dict[str, Any] | None = None, **more: dict[str, Any]
) -> dict[str, Any]:
    """One error table of a seed as JSON Schema: its fields and no others (a seed's table lists
    every field of the body), typed as the table says (`error`: where a dialect reads it
    differently); none of them marked required."""
    properties: dict[str, Any] = {
        "error": error or {"type": "string"},
        "message": {"type": "string"},
        "status": {"type": "integer"} if status is None else {"enum": [status]},
        **more,
    }
    return {"title": name, "type": "object", "properties": properties, "additionalProperties": False}


OPENAI = VendorDocument(
    dialect="openai",
    file="openai-openapi.yaml",
    schemas_at=("components", "schemas"),
    kinds={
        COMPLETION: "CreateChatCompletionResponse",
        CHUNK: "CreateChatCompletionStreamResponse",
        ERROR: "ErrorResponse",
        "model": "Model",
        "model_list": "ListModelsResponse",
        "request": "CreateChatCompletionRequest",
        # the Responses API, served under the same mount
        "response": "Response",
        "response_event": "ResponseStreamEvent",
        "response_request": "CreateResponse",
        "response_items": "ResponseItemList",
        "input_tokens": "TokenCountsResource",
    },
    answers={
        ("post", "/chat/completions"): COMPLETION,
        ("get", "/models"): "model_list",
        ("get", "/models/{model}"): "model",
        ("post", "/responses"): "response",
        ("get", "/responses/{response_id}"): "response",
        ("get", "/responses/{response_id}/input_items"): "response_items",
        ("post", "/responses/input_tokens"): "input_tokens",
    },
    streams={("post", "/responses"): "response_event"},
)

# Azure's `error`: the seed's field, holding the document's (Azure.Core's) error object, which
# the azure-ai-inference SDK reads into HttpResponseError.error (openapi/azure.yaml, the reading
# at the error bodies).
AZURE_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    "additionalProperties": False,
}

AZURE = VendorDocument(
    dialect="azure",
    file="azure-ai-model-inference/2024-05-01-preview.openapi.json",
    schemas_at=("definitions",),
    kinds={
        COMPLETION: "ChatCompletions",
        CHUNK: "StreamingChatCompletionsUpdate",
        "model_info": "ModelInfo",
        "request": "ChatCompletionsOptions",
        ERROR: "Azure.Core.Foundations.ErrorResponse",
    },
    answers={("post", "/chat/completions"): COMPLETION, ("get", "/info"): "model_info"},
    deviations=(
        Deviation(
            "StreamingChatCompletionsUpdate",
            "/properties/object/enum",
            ["chat.completion", "chat.completion.chunk"],
            "The document says chunks are `chat.completion`; the real service, the SDK's samples and "
            "every OpenAI-compatible backend send `chat.completion.chunk`, which chatgate sends.",
        ),
        Deviation(
            "StreamingChatCompletionsUpdate",
            "/required",
            ["id", "object", "created", "model", "choices"],
            "The document requires `usage` in every chunk; the service sends it in the last one only "
            "(the SDK's model has it optional).",
        ),
        Deviation(
            "StreamingChatResponseMessageUpdate",
            "/properties/content",
            {"type": ["string", "null"]},
            "Real streams send `content: null` in chunks that carry only tool calls.",
        ),
        Deviation(
            "ChatCompletionsOptions",
            "/properties/stop",
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "The seed's own request example sends `stop` as one string, and chatgate answers it; "
            "the document only has a list.",
        ),
        Deviation(
            "ModelInfo",
            "/properties/model_type",
            {"enum": ["embeddings", "chat-completion", "chat_completion"]},
            "The seed does not document /info. The document spells the chat type `chat-completion`; "
            "the azure-ai-inference SDK (1.0.0b9), which is what reads this answer, has only "
            "`chat_completion` in its ModelType, which chatgate sends.",
        ),
    ),
    seed_errors={
        401: seed_error("UnauthorizedError", 401, AZURE_ERROR),
        404: seed_error("NotFoundError", 404, AZURE_ERROR),
        422: seed_error(
            "UnprocessableContentError",
            422,
            AZURE_ERROR,
            code={"type": "string"},
            detail={
                "type": "object",
                "properties": {
                    "loc": {"type": "array", "items": {"type": "string"}},
                    "value": {"type": "string"},
                },
                "additionalProperties": False,
            },
        ),
        429: seed_error("TooManyRequestsError", 429, AZURE_ERROR),
        "default": seed_error(
            "ContentFilterError", None, AZURE_ERROR, code={"type": "string"}, param={"type": "string"}
        ),
    },
)

# where the extract writes its chat answer's schema
ANSWER_200 = "/paths/~1chat~1completions/post/responses/200/content/application~1json/schema"

ALEPH_ALPHA = VendorDocument(
    dialect="aleph_alpha",
    file="aleph-alpha/aleph-alpha-api-4.7.0.chat-completions.extract.json",
    schemas_at=("components", "schemas"),
    kinds={COMPLETION: "ChatCompletionsAnswer", CHUNK: "ChatResponse", "request": "ChatRequest"},
    answers={("post", "/chat/completions"): COMPLETION},
    inline={"ChatCompletionsAnswer": ANSWER_200},
    deviations=(
        Deviation(
            "ChatCompletionsAnswer",
            "",
            {"$ref": "#/$defs/ChatResponse"},
            "The seed and the document type the 200 answer as an array of ChatResponse (the seed's "
            "example is wrapped in [...]); the real service answers one ChatResponse object, which "
            "Aleph Alpha's own clients read (`choices` straight from the body), and so does "
            "chatgate (aleph_alpha.yaml's reading). Each stream event's data is one ChatResponse too.",
        ),
        Deviation(
            "ChatResponseMessage",
            "/properties/finish_reason",
            {"type": ["string", "null"], "enum": ["stop", "length", "content_filter", "tool_calls", None]},
            "The document's own description: when streaming, `finish_reason` is set only in the last "
            "chunk of a completion and null otherwise; the schema forgot `nullable`. And a completion "
            "that calls the document's tools ends with `tool_calls`, which its official client 11.x "
            "reads (FinishReason.ToolCalls) and its enum forgot.",
        ),
        Deviation(
            "ChatResponseMessage",
            "/properties/logprobs/type",
            ["object", "null"],
            "The document's own description and example: `logprobs` is null when not requested (its "
            'example sends "null") and at the end of a stream; the schema forgot `nullable`.',
        ),
        Deviation(
            "ChatResponse",
            "/properties/usage/type",
            ["object", "null"],
            "The document's own description: when streaming, `usage` is null except in the "
            "usage-only chunk that include_usage adds; the schema forgot `nullable`.",
        ),
        Deviation(
            "ChatResponse",
            "/properties/system_fingerprint/type",
            ["string", "null"],
            "The document's own description: when streaming, `system_fingerprint` is set only in the "
            "last chunk and null otherwise; the schema forgot `nullable`.",
        ),
    ),
    not_checked={
        ERROR: "Neither the seed nor the extract documents an error body (only the 200 answer); "
        "chatgate's, aleph_alpha.yaml's {error, code}, is checked against that document.",
    },
)

VENDOR_DOCUMENTS = {doc.dialect: doc for doc in (OPENAI, AZURE, ALEPH_ALPHA)}


# ----- reading an answer off the wire ---------------------------------------------------------


SSE_LINE_END = re.compile(r"\r\n|\r|\n")


def stream_payloads(content: bytes, complete: bool = True) -> list[str]:
    """The `data:` payloads of a server-sent event stream; a cut-off last event is left out.
    Lines end only where SSE says (CR, LF, CRLF): `str.splitlines` would also cut a payload at
    U+2028, U+0085 and the like, which JSON carries unescaped."""
    text = content.decode("utf-8", errors="replace")
    if not complete:
        text = text[: text.rfind("\n\n") + 1]
    return [line[5:].removeprefix(" ") for line in SSE_LINE_END.split(text) if line.startswith("data:")]


def answer_bodies(
    vendor: VendorDocument,
    method: str,
    path: str,
    status: int,
    media_type: str,
    content: bytes,
    complete: bool,
) -> list[tuple[str, Any]]:
    """(kind, body) for each JSON body or stream chunk of one answer that the vendor describes."""
    if media_type == "text/event-stream":
        if (event_kind := vendor.streams.get((method.lower(), path))) is not None:
            return [(event_kind, json.loads(payload)) for payload in stream_payloads(content, complete)]
        found = []
        for payload in stream_payloads(content, complete):
            if payload == "[DONE]":
                continue
            chunk = json.loads(payload)
            is_error = isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk
            found.append((ERROR if is_error else CHUNK, chunk))
        return found
    if media_type != "application/json" or not content:
        return []
    kind = ERROR if status >= 400 else vendor.answers.get((method.lower(), path)) if status == 200 else None
    return [] if kind is None else [(kind, json.loads(content))]


# ----- validators -----------------------------------------------------------------------------


@cache
def vendor_schemas(refspecs_dir: Path, dialect: str) -> tuple[dict[str, Any], frozenset[str]]:
    """The converted closure of every schema the dialect's kinds name, before deviations."""
    vendor = VENDOR_DOCUMENTS[dialect]
    whole: Any = read_document(refspecs_dir / vendor.file)
    named: Any = whole
    for part in vendor.schemas_at:
        named = named[part]
    named = {**named, **{name: pointed(whole, pointer) for name, pointer in vendor.inline.items()}}
    schemas, dangling = closure(named, sorted(set(vendor.kinds.values())))
    return schemas, frozenset(dangling)


def pointed(document: Any, pointer: str) -> Any:
    """What a JSON pointer ("/a/b~1c") points at in the document."""
    for part in pointer.split("/")[1:]:
        document = document[part.replace("~1", "/").replace("~0", "~")]
    return document


Validate = Callable[[Any], list[str]]


@cache
def validator(refspecs_dir: Path, dialect: str, kind: str, without: str | None = None) -> Validate | None:
    """A function that lists how a body breaks the vendor's schema for `kind` ([] when it
    conforms), with every deviation applied except the one named `without`; None when the
    vendor's document does not describe that kind of body."""
    vendor = VENDOR_DOCUMENTS[dialect]
    if kind not in vendor.kinds:
        return None
    schemas, _dangling = vendor_schemas(refspecs_dir, dialect)
    schemas = copy.deepcopy(schemas)
    for deviation in vendor.deviations:
        if deviation.name != without:
            deviation.apply(schemas)
    root = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"#/$defs/{vendor.kinds[kind]}",
        "$defs": schemas,
    }
    compiled = jsonschema_rs.Draft202012Validator(root)

    def validate(body: Any) -> list[str]:
        return [
            f"{vendor.kinds[kind]}: /{'/'.join(map(str, e.instance_path))}: {e.message}"
            for e in compiled.iter_errors(body)
        ]

    return validate


class VendorSpecs:
    """The vendor documents in one refspecs folder, for the dialects that have one."""

    def __init__(self, refspecs_dir: Path) -> None:
        self.refspecs_dir = refspecs_dir.resolve()

    @classmethod
    def find(cls, refspecs_dir: Path | None = None) -> VendorSpecs | None:
        """The documents in `refspecs_dir` (a `RefspecsError` when it is not a folder), else in
        the default place; None when there are none."""
        if refspecs_dir is not None and not refspecs_dir.is_dir():
            raise RefspecsError(f"{refspecs_dir} is not a folder")
        found = refspecs_dir or default_refspecs_dir()
        return cls(found) if found is not None else None

    def missing(self, dialect: str) -> str | None:
        """The dialect's vendor file when this folder lacks it, else None."""
        vendor = VENDOR_DOCUMENTS.get(dialect)
        if vendor is None or (self.refspecs_dir / vendor.file).is_file():
            return None
        return vendor.file

    def answer_errors(
        self,
        dialect: str,
        method: str,
        path: str,
        status: int,
        media_type: str,
        content: bytes,
        complete: bool = True,
    ) -> list[str]:
        """How one answer of an operation of our document (`path` as the document writes it)
        breaks the vendor's document; [] when it conforms or the vendor does not describe it."""
        vendor = VENDOR_DOCUMENTS.get(dialect)
        if vendor is None:
            return []
        try:
            bodies = answer_bodies(vendor, method, path, status, media_type, content, complete)
        except ValueError as error:
            return [f"the body is not JSON: {error}"]
        return [
            message for kind, body in bodies for message in self.errors(dialect, kind, body, status=status)
        ]

    def errors(
        self, dialect: str, kind: str, body: Any, without: str | None = None, status: int | None = None
    ) -> list[str]:
        """How `body` breaks the vendor's schema for `kind` (an error body: the seed's table for
        its `status`, where the vendor's own is not checked); [] when it conforms or is not
        described."""
        vendor = VENDOR_DOCUMENTS.get(dialect)
        if vendor is None:
            return []
        by_seed = kind == ERROR and bool(vendor.seed_errors) and status is not None
        seed = seed_error_errors(vendor, status, body) if by_seed and status is not None else []
        if by_seed and ERROR not in vendor.kinds:  # the seed's tables in place of the vendor's
            return seed
        if kind in vendor.not_checked:
            return []
        validate = validator(self.refspecs_dir, dialect, kind, without)
        return seed + ([] if validate is None else validate(body))


def seed_error_errors(vendor: VendorDocument, status: int, body: Any) -> list[str]:
    title, compiled = seed_error_validator(vendor.dialect, status)
    return [
        f"seed {title} ({status}): /{'/'.join(map(str, e.instance_path))}: {e.message}"
        for e in compiled.iter_errors(body)
    ]


@cache
def seed_error_validator(dialect: str, status: int) -> tuple[str, jsonschema_rs.Draft202012Validator]:
    tables = VENDOR_DOCUMENTS[dialect].seed_errors
    schema = tables.get(status) or tables["default"]
    return schema["title"], jsonschema_rs.Draft202012Validator(schema)
