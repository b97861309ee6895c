"""The dialects, registered in one place and as data only: each one's name and where it mounts
by default, one line a dialect. Its code is found by convention (`gateway.dialects.<name>`
declares `DIALECT`) and loaded by `gateway.dialects.registry`, so the configuration validates
the mounts against this table without importing a translator.

A new dialect is its document in openapi/, its module here and one line below."""

DEFAULT_MOUNTS: dict[str, str] = {
    "openai": "/v1",
    "azure": "/azure",
    "aleph_alpha": "/aleph-alpha",
    "lmi": "/lmi",
    "ovms": "/v3",
    "anthropic": "/anthropic",
}

__all__ = ["DEFAULT_MOUNTS"]
