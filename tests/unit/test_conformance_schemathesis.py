"""schemathesis, in process, over every operation of every dialect: no 5xx, every status, content
type and body as the dialect's own document says."""

from __future__ import annotations

import pytest
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.config.settings import Settings
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
from tests.support.schemathesis_setup import dialect_schema, dialect_tests

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
APP = create_app(Settings())


def check(case) -> None:
    case.call_and_validate(checks=CHECKS)


@pytest.mark.parametrize("name", DIALECTS)
def test_every_operation_is_covered(name: str):
    """schemathesis sees every operation of the dialect's document (and there is one per dialect)."""
    covered = {
        result.ok().definition.raw["operationId"] for result in dialect_schema(name, APP).get_all_operations()
    }
    document = load_document(DIALECTS[name].document)
    documented = {
        op["operationId"]
        for item in document["paths"].values()
        for op in item.values()
        if "operationId" in op
    }
    assert covered == documented and covered


globals().update(dialect_tests(APP, check))
