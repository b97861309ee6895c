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
from tests.schemathesis_setup import EXAMPLES, dialect_schema

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
APP = create_app(Settings())


openai = dialect_schema("openai", APP)
azure = dialect_schema("azure", APP)
aleph_alpha = dialect_schema("aleph_alpha", APP)
lmi = dialect_schema("lmi", APP)
ovms = dialect_schema("ovms", APP)


def check(case) -> None:
    case.call_and_validate(checks=CHECKS)


@openai.parametrize()
@EXAMPLES
def test_openai(case):
    check(case)


@azure.parametrize()
@EXAMPLES
def test_azure(case):
    check(case)


@aleph_alpha.parametrize()
@EXAMPLES
def test_aleph_alpha(case):
    check(case)


@lmi.parametrize()
@EXAMPLES
def test_lmi(case):
    check(case)


@ovms.parametrize()
@EXAMPLES
def test_ovms(case):
    check(case)


def test_every_operation_is_covered():
    counted = {
        name: sum(1 for _ in schema.get_all_operations())
        for name, schema in {
            "openai": openai, "azure": azure, "aleph_alpha": aleph_alpha, "lmi": lmi, "ovms": ovms
        }.items()
    }  # fmt: skip
    assert counted == {"openai": 3, "azure": 2, "aleph_alpha": 1, "lmi": 3, "ovms": 1}
