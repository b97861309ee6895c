"""The registered dialects' code: each name in the data registry (`gateway.dialects`) loaded
from its module, `gateway.dialects.<name>`, whose `DIALECT` must carry that name."""

from __future__ import annotations

import importlib

from gateway.dialects import DEFAULT_MOUNTS
from gateway.dialects.dialect import Dialect


def load_dialect(name: str) -> Dialect:
    module = f"{__package__}.{name}"
    dialect = getattr(importlib.import_module(module), "DIALECT", None)
    if not isinstance(dialect, Dialect):
        raise TypeError(f"{module} declares no DIALECT (a gateway.dialects.dialect.Dialect)")
    if dialect.name != name:
        raise ValueError(f"{module} declares the dialect {dialect.name!r}; it is registered as {name!r}")
    return dialect


DIALECTS: dict[str, Dialect] = {name: load_dialect(name) for name in DEFAULT_MOUNTS}

__all__ = ["DIALECTS", "Dialect", "load_dialect"]
