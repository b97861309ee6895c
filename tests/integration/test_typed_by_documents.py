"""mypy holds every translator to its own document: a field renamed in a copy of openapi/ (one in
each dialect's completion), with generated/ regenerated from it, fails the type check at the
translator line that writes the old name, before any test runs."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.servers import ROOT

# dialect → (schema of its completion, field the translator writes there)
RENAMED = {
    "openai": ("CreateChatCompletionResponse", "system_fingerprint"),
    "azure": ("ChatCompletions", "system_fingerprint"),
    "aleph_alpha": ("ChatResponseChoice", "finish_reason"),
    "lmi": ("Choice", "finish_reason"),
    "ovms": ("ChatCompletionChoice", "finish_reason"),
}
ERROR = re.compile(r"^(gateway/dialects/\w+\.py):(\d+): error: (.*)$", re.MULTILINE)


def rename_field(document: Path, schema: str, old: str, new: str) -> None:
    spec = yaml.safe_load(document.read_text(encoding="utf-8"))
    found = spec["components"]["schemas"][schema]
    found["properties"] = {new if k == old else k: v for k, v in found["properties"].items()}
    found["required"] = [new if k == old else k for k in found.get("required", [])]
    document.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")


def writes(source: str, line: int, key: str) -> bool:
    """Whether the code at `line` writes `key`: a dict literal opening there that holds it (mypy
    names a literal's first line), or a subscript there that assigns it."""
    for node in ast.walk(ast.parse(source)):
        if getattr(node, "lineno", None) != line:
            continue
        if isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == key for k in node.keys
        ):
            return True
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == key
        ):
            return True
    return False


def test_a_field_renamed_in_a_document_fails_the_type_check_at_its_translator(tmp_path: Path):
    tree = tmp_path / "tree"
    for part in ("gateway", "backends", "openapi", "generated"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree)
    for dialect, (schema, field) in RENAMED.items():
        rename_field(tree / "openapi" / f"{dialect}.yaml", schema, field, f"renamed_{field}")
    subprocess.run(
        [sys.executable, "-m", "gateway.tools.codegen"],
        cwd=tree,
        check=True,
        capture_output=True,
        timeout=120,
    )
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache"), "gateway/dialects"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    errors = ERROR.findall(checked.stdout)
    for dialect, (_, field) in RENAMED.items():
        path = f"gateway/dialects/{dialect}.py"
        source = (tree / path).read_text(encoding="utf-8")
        named = [
            line
            for file, line, message in errors
            if file == path and f'"{field}"' in message and writes(source, int(line), field)
        ]
        assert named, f"{path}: no error at a line writing {field!r}:\n{checked.stdout}"
