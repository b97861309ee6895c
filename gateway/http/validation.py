"""Checking requests against the documents: OpenAPI 3.0 schemas as JSON Schema compiled with
jsonschema-rs (microseconds per body; python-jsonschema took 1–2 ms), bodies read within a size
limit and parsed with orjson, and errors that say where the request breaks its document."""

from __future__ import annotations

import json
import typing as t

import jiter
import jsonschema_rs
import orjson
from starlette.types import Receive

from gateway.core.errors import BadRequest, ClientGone, PayloadTooLarge
from gateway.http.discriminators import by_discriminator, underlying

OPENAPI_ONLY_KEYWORDS = ("nullable", "example", "examples", "discriminator", "xml", "externalDocs")


# A schema marked so counts integers as JSON Schema 2020-12 does (2.0 is an integer), as a
# vendor's 3.1 document does (OpenAI's); Draft 4 says it as a number that is a multiple of 1.
INTEGERS_EXTENSION = "x-chatgate-integers"
INTEGERS_2020_12 = "json-schema-2020-12"
COMPONENTS_REF = "#/components/"


def to_json_schema(schema: t.Any, integral: bool = False) -> t.Any:
    """OpenAPI 3.0 schema object → JSON Schema Draft 4 (`nullable` becomes a "null" type)."""
    if isinstance(schema, list):
        return [to_json_schema(item, integral) for item in schema]
    if not isinstance(schema, dict):
        return schema
    integral = integral or schema.get(INTEGERS_EXTENSION) == INTEGERS_2020_12
    converted = {
        key: to_json_schema(value, integral)
        for key, value in schema.items()
        if key not in OPENAPI_ONLY_KEYWORDS and not key.startswith("x-")
    }
    if isinstance(schema.get("discriminator"), dict):  # a `oneOf` read by its discriminator
        converted = by_discriminator(converted, schema["discriminator"])
    if integral and schema.get("type") == "integer":
        converted["type"] = "number"
        converted["multipleOf"] = 1
    if schema.get("nullable") is True:
        kind = converted.get("type")
        if isinstance(kind, str):
            converted["type"] = [kind, "null"]
        if "enum" in converted and None not in converted["enum"]:
            converted["enum"] = [*converted["enum"], None]
        for combinator in ("oneOf", "anyOf"):
            if combinator in converted:
                converted[combinator] = [*converted[combinator], {"type": "null"}]
    return converted


def location(path: t.Iterable[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def validation_error(error: jsonschema_rs.ValidationError) -> BadRequest:
    error = underlying(error)
    path = list(error.instance_path)
    where = location(path)
    message = f"{error.message} at '{where}'" if where else error.message
    return BadRequest(
        f"Invalid request body: {message}",
        param=where or None,
        loc=["body", *path],
        value=error.instance if path else None,
    )


async def read_body(receive: Receive, max_body_bytes: int) -> bytes:
    """The whole request body, refused with 413 past the limit."""
    chunks: list[bytes] = []
    size = 0
    more_body = True
    while more_body:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone("The client went away before sending the whole body.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body_bytes:
            raise PayloadTooLarge(f"Request body exceeds the gateway's limit of {max_body_bytes} bytes.")
        chunks.append(chunk)
        more_body = message.get("more_body", False)
    return b"".join(chunks)


MAX_DEPTH = 64  # nesting of objects and arrays a body may have (orjson alone allows 255)


class DuplicateKey(ValueError):
    pass


def no_duplicates(pairs: list[tuple[str, t.Any]]) -> dict[str, t.Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise DuplicateKey(repeated)
    return found


# The second reading only looks for keys given twice; orjson keeps the last silently, while a
# proxy in front may have read the first: the two would disagree about what was asked.
KEY_CHECKER = json.JSONDecoder(object_pairs_hook=no_duplicates)


def repeated_key(raw: bytes) -> str | None:
    """A key an object of the body (which orjson read) gives twice, or None.

    jiter (pydantic's parser) finds one in a pass at about orjson's speed; the standard
    library's decoder, with a Python call for every object, took three to four times orjson's
    time (280 µs for a 100 KB conversation, as agents send). It is asked only when jiter
    refuses the body, and its reading decides: it names the key, and a body jiter refuses for
    another reason is read as before."""
    try:
        jiter.from_json(raw, catch_duplicate_keys=True, cache_mode=False)
        return None
    except ValueError:
        pass
    try:
        KEY_CHECKER.decode(raw.decode("utf-8"))
    except DuplicateKey as duplicate:
        return str(duplicate)
    return None


def deeper_than(value: t.Any, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels (without recursion): level by
    level, each level's containers gathered by a comprehension (a stack of (node, depth) pairs
    took five times as long: about 240 µs for a 100 KB conversation, which every agent sends).
    `value` is orjson's reading, whose objects and arrays are exactly dicts and lists."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 1
    while level:
        if depth > limit:
            return True
        below: list[t.Any] = []
        for node in level:
            children = node.values() if type(node) is dict else node
            below += [child for child in children if type(child) is dict or type(child) is list]
        level = below
        depth += 1
    return False


def parse_json(raw: bytes) -> t.Any:
    """The body as JSON, strictly: valid UTF-8, no NaN, 64-bit integers, no key given twice,
    nested at most 64 deep; else a 400 that says what is wrong."""
    if not raw:
        raise BadRequest("The request body is required and must be a JSON object.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"The request body is not valid JSON: {error}") from None
    if isinstance(body, dict | list):
        # counting brackets is cheap; most bodies cannot nest that deep and skip the walk
        if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH and deeper_than(body, MAX_DEPTH):
            raise BadRequest(f"The request body nests objects and arrays deeper than {MAX_DEPTH} levels.")
        if (repeated := repeated_key(raw)) is not None:
            raise BadRequest(
                f"The request body gives the key '{repeated}' twice in one object.", param=repeated
            )
    return body


def parse_and_validate(raw: bytes, validator: jsonschema_rs.Draft4Validator) -> t.Any:
    """The body as JSON, valid for the operation's schema, or a 400 that says where it is not."""
    body = parse_json(raw)
    problem = next(validator.iter_errors(body), None)
    if problem is not None:
        raise validation_error(problem)
    return body


def reachable(schema: t.Any, components: t.Any) -> dict[str, dict[str, t.Any]]:
    """The part of a document's `components` that `schema` reaches through `$ref`s.

    A validator holds what it was compiled with: compiling every parameter and body with all of
    a document's components kept tens of megabytes that nothing reads."""
    found: dict[str, dict[str, t.Any]] = {}
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(COMPONENTS_REF):
            section, _, name = ref.removeprefix(COMPONENTS_REF).partition("/")
            name = name.replace("~1", "/").replace("~0", "~")
            target = components.get(section, {}).get(name) if isinstance(components, dict) else None
            if target is not None and name not in found.setdefault(section, {}):
                found[section][name] = target
                pending.append(target)
        pending.extend(node.values())
        mapping = (
            node.get("discriminator", {}).get("mapping")
            if isinstance(node.get("discriminator"), dict)
            else None
        )
        if isinstance(mapping, dict):  # `by_discriminator` turns each target into a `$ref`
            pending.extend({"$ref": target} for target in mapping.values())
    return found


def compile_schema(schema: t.Any, components: t.Any = None) -> jsonschema_rs.Draft4Validator:
    converted = to_json_schema(schema)
    if components is not None and (used := reachable(schema, components)):
        converted = {**converted, "components": to_json_schema(used)}
    return jsonschema_rs.Draft4Validator(converted, validate_formats=False)
