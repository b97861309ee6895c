"""schemathesis again, with keys configured: every operation also rejects invalid data
(negative_data_rejection) and refuses requests without credentials (ignored_auth)."""

from __future__ import annotations

import pytest
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.config.settings import Key, Settings
from gateway.policy.auth import new_key
from tests.support.schemathesis_setup import dialect_tests

pytestmark = pytest.mark.slow  # out of the fast lane (docs/development/tests.md)

KEY, KEY_SHA = new_key()
APP = create_app(Settings(keys=[Key(name="conformance", sha256=KEY_SHA)]))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]


def check(case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, checks=CHECKS)


globals().update(dialect_tests(APP, check))
