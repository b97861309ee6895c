"""The published config schema is the settings models' own, and every config the docs show is
accepted by both the schema (what an editor checks) and the loader (what the gateway checks)."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import orjson
import pytest
import yaml

from gateway.config.schema import config_json_schema
from gateway.config.source import load_settings
from tests.support.servers import ROOT

SCHEMA_FILE = ROOT / "docs" / "config.schema.json"
DOCUMENTED_CONFIGS = [ROOT / "README.md", ROOT / "deploy" / "README.md"]
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
# what the documented examples reference with ${…}
EXAMPLE_ENVIRONMENT = {
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "LLAMA_API_KEY": "sk-example",
    "BACKUP_API_KEY": "sk-example",
    "OPENAI_API_KEY": "sk-example",
}


def documented_blocks() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTED_CONFIGS:
        if document.exists():
            for number, block in enumerate(YAML_BLOCK.findall(document.read_text(encoding="utf-8"))):
                found.append((f"{document.name}#{number}", block))
    return found


def test_the_committed_schema_is_current():
    committed = orjson.loads(SCHEMA_FILE.read_bytes())
    assert committed == config_json_schema(), "run: chatgate config schema > docs/config.schema.json"


def test_the_schema_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(config_json_schema())


def test_the_schema_knows_each_backends_options():
    validator = jsonschema.Draft202012Validator(config_json_schema())
    typo = {"deployments": [{"name": "x", "backend": "openai-compatible", "options": {"base_urll": "h"}}]}
    assert any("base_urll" in error.message for error in validator.iter_errors(typo))
    good = {"deployments": [{"name": "x", "backend": "tgi", "options": {"url": "http://tgi:80"}}]}
    assert list(validator.iter_errors(good)) == []


@pytest.mark.parametrize("name, block", documented_blocks(), ids=lambda value: value if "#" in value else "")
def test_every_documented_config_is_accepted(tmp_path: Path, name: str, block: str):
    validator = jsonschema.Draft202012Validator(config_json_schema())
    raw = yaml.safe_load(block)
    assert [e.message for e in validator.iter_errors(raw)] == [], name
    path = tmp_path / "chatgate.yaml"
    path.write_text(block)
    load_settings(path, environ=EXAMPLE_ENVIRONMENT)
