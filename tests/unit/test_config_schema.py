"""The published config schema is the settings models' own. (Every config the docs show is held
to both the schema and the loader by tests/integration/test_docs.py.)"""

from __future__ import annotations

import jsonschema
import orjson

from gateway.config.schema import config_json_schema
from tests.support.servers import ROOT

SCHEMA_FILE = ROOT / "docs" / "config.schema.json"


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
