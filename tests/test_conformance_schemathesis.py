"""schemathesis, in process, over every operation of every dialect: no 5xx, every status, content
type and body as the dialect's own document says."""

from __future__ import annotations

from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.config import Settings
from tests.schemathesis_setup import dialect_schema, dialect_tests

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
APP = create_app(Settings())


def check(case) -> None:
    case.call_and_validate(checks=CHECKS)


def test_every_operation_is_covered():
    counted = {
        name: sum(1 for _ in dialect_schema(name, APP).get_all_operations())
        for name in ("openai", "azure", "aleph_alpha", "lmi", "ovms")
    }
    assert counted == {"openai": 3, "azure": 2, "aleph_alpha": 1, "lmi": 3, "ovms": 1}


globals().update(dialect_tests(APP, check))
