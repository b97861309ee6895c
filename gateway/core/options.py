"""What a config file's models need on both sides of the backend line: the strict model base,
the error a bad file raises, how a validation error is said in one line, secrets read from files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names the bad key."""


def describe(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "(top level)"
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return "; ".join(lines)


def read_secret(path: Path) -> str:
    """A secret kept in a file (a mounted Kubernetes Secret, a Docker secret): its text, stripped."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None


def from_file(values: Any, field_name: str) -> Any:
    """`<field>_file: PATH` in place of `<field>`: the value read from the file (the path stays
    in `<field>_file`, a declared field, so editors and the schema know it)."""
    if not isinstance(values, dict) or values.get(f"{field_name}_file") is None:
        return values
    if values.get(field_name) is not None:
        raise ValueError(f"give {field_name} or {field_name}_file, not both")
    return {**values, field_name: read_secret(Path(values[f"{field_name}_file"]))}


def one_of(*fields: str) -> dict[str, Any]:
    """JSON Schema: at least one of these fields is given."""
    return {"anyOf": [{"required": [name]} for name in fields]}
