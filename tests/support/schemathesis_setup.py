"""What both schemathesis suites share: each dialect's document loaded for an in-process app."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from gateway.config.settings import Settings
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
from gateway.tools.conformance_schema import for_schemathesis, register_json_lines

SPEC_FILES = {name: dialect.document for name, dialect in DIALECTS.items()}
EXAMPLES = settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
register_json_lines()


def dialect_schema(name: str, app):
    document = for_schemathesis(load_document(SPEC_FILES[name]), Settings().mounts[name])
    schema = schemathesis.openapi.from_dict(document)
    schema.app = app
    return schema


def dialect_tests(app, check) -> dict[str, object]:
    """One schemathesis test per dialect (`test_openai`, …), each running `check(case)`."""
    tests = {}
    for name in SPEC_FILES:
        schema = dialect_schema(name, app)

        @schema.parametrize()
        @EXAMPLES
        def test(case):
            check(case)

        test.__name__ = f"test_{name}"
        tests[test.__name__] = test
    return tests
