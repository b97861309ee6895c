"""The dialects' documents are parsed once per process, with libyaml where PyYAML has it, and the
parsed documents, shared by the translators, the front door and Connexion, are never changed by
building or serving a gateway (a change would leak from one gateway into the next)."""

from __future__ import annotations

import asyncio

import httpx
import yaml
from asgi_lifespan import LifespanManager

from gateway.app import build_gateway
from gateway.config.settings import Settings
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import SAFE_LOADER, SPEC_DIR, load_document


def fresh(file_name: str) -> dict:
    return yaml.safe_load((SPEC_DIR / file_name).read_text(encoding="utf-8"))


def test_each_document_is_parsed_once():
    load_document.cache_clear()
    for dialect in DIALECTS.values():
        assert load_document(dialect.document) is load_document(dialect.document)
    assert load_document.cache_info().misses == len({d.document for d in DIALECTS.values()})


def test_the_c_loader_is_used_where_pyyaml_has_it():
    if yaml.__with_libyaml__:
        assert SAFE_LOADER is yaml.CSafeLoader
    for dialect in DIALECTS.values():  # and it reads the documents as the pure-Python loader does
        assert load_document(dialect.document) == fresh(dialect.document)


def test_building_and_serving_leaves_the_shared_documents_as_parsed():
    async def serve_a_little() -> None:
        gateway = build_gateway(Settings())
        async with LifespanManager(gateway.app) as started:
            transport = httpx.ASGITransport(app=started.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
                assert (await client.get("/v1/openapi.json")).status_code == 200
                assert (await client.get("/azure/openapi.json")).status_code == 200

    asyncio.run(serve_a_little())
    for dialect in DIALECTS.values():
        assert load_document(dialect.document) == fresh(dialect.document), dialect.name
