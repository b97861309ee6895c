"""Every parameter a dialect's document defines is accounted for by every backend: taken
(mapped to the backend's own name), explicitly unsupported (→ 422), or documented as handled
by the gateway itself (structural, dropped, or refused by the dialect)."""

from __future__ import annotations

import pytest

from backends import echo, local, openai_compatible, tgi_options, tgi_tables
from gateway.core.parameters import HANDLED as GATEWAY_HANDLED
from gateway.core.parameters import canonical_name
from gateway.dialects import DIALECTS
from gateway.spec import DialectSpec, load_document

TABLES = {
    "echo": echo.EchoBackend.capabilities.parameters,
    "openai-compatible": openai_compatible.CAPABILITIES.parameters,
    "tgi": tgi_tables.parameter_table(tgi_options.TGIOptions(url="http://tgi:80")),
    "local": local.parameter_table(context_length=4096),
}


def dialect_parameters() -> list[tuple[str, str]]:
    found = []
    for dialect in DIALECTS.values():
        spec = DialectSpec(load_document(dialect.document), frozenset(dialect.chat_operations))
        for name in sorted(spec.chat_fields):
            if name not in spec.unsupported:  # the dialect itself drops or refuses these
                found.append((dialect.name, name))
    return found


@pytest.mark.parametrize("backend", TABLES)
@pytest.mark.parametrize(("dialect", "parameter"), dialect_parameters())
def test_every_parameter_is_accounted_for(backend: str, dialect: str, parameter: str):
    if parameter in GATEWAY_HANDLED:
        assert GATEWAY_HANDLED[parameter], f"{parameter}: say how the gateway handles it"
        return
    table = TABLES[backend]
    name = canonical_name(parameter)
    assert name in table, f"{backend}: '{parameter}' ({dialect}) is neither mapped nor marked unsupported"
    entry = table[name]
    assert entry.supported or entry.note, f"{backend}: say why '{name}' is unsupported"


@pytest.mark.parametrize("backend", TABLES)
def test_tables_are_data(backend: str):
    for name, entry in TABLES[backend].items():
        assert isinstance(name, str) and (entry.target is None or isinstance(entry.target, str))
        if entry.minimum is not None and entry.maximum is not None:
            assert entry.minimum <= entry.maximum, name
