"""The documents in openapi/ are valid OpenAPI 3.0, and generated/ is what they generate."""

from __future__ import annotations

import importlib

import pytest
from openapi_spec_validator import validate

from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
from gateway.tools.codegen import stale_files

SPEC_FILES = [dialect.document for dialect in DIALECTS.values()]


@pytest.mark.parametrize("spec_file", SPEC_FILES)
def test_document_is_valid_openapi_3_0(spec_file: str):
    document = load_document(spec_file)
    assert document["openapi"] == "3.0.3"
    validate(document)


@pytest.mark.parametrize("spec_file", SPEC_FILES)
def test_every_operation_is_described(spec_file: str):
    document = load_document(spec_file)
    for path, item in document["paths"].items():
        for method, operation in item.items():
            assert operation.get("operationId"), (path, method)
            assert operation.get("summary"), (path, method)
            for status in ("400", "401", "404", "429", "500"):
                assert status in operation["responses"], (path, method, status)


def test_generated_types_are_fresh():
    assert stale_files() == []


@pytest.mark.parametrize("spec_file", SPEC_FILES)
def test_generated_types_import(spec_file: str):
    module = importlib.import_module(f"generated.{spec_file.removesuffix('.yaml')}")
    assert module.__name__.startswith("generated.")
