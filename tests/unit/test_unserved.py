"""What a path nothing serves is told, built from the configured mounts and their documents:
table-driven, one row a reason a client lands there."""

from __future__ import annotations

import pytest

from gateway.config.settings import Settings
from gateway.dialects.registry import DIALECTS
from gateway.http.documents import load_document
from gateway.http.unserved import SOME_GATEWAY, Unserved, gateway_address

BASE = "http://gw:8080"
API_VERSION = "api-version=2024-05-01-preview"
AZURE_CHAT = f"/azure/chat/completions?{API_VERSION}"


def unserved(**mounts: str | None) -> Unserved:
    built = Unserved()
    for name, mount in Settings(mounts=mounts).mounts.items():
        if mount is not None:
            built.add(name, mount, load_document(DIALECTS[name].document))
    return built


# (mounts, path, what the answer must say)
CASES = [
    ({}, "/v1/embeddings", ["does not serve embeddings", "On /v1 (OpenAI)", "POST /v1/chat/completions",
                            "POST /v1/responses"]),
    ({}, "/v1/completions", ["does not serve text completions", "POST /v1/chat/completions"]),
    ({}, "/v1/audio/transcriptions", ["does not serve audio", "POST /v1/chat/completions"]),
    ({}, "/v1/images/generations", ["does not serve images"]),
    ({}, "/v1/moderations", ["does not serve moderations"]),
    ({}, "/v1/files/file-1/content", ["does not serve files"]),
    ({}, "/anthropic/v1/messages/batches", ["does not serve message batches", "POST /anthropic/v1/messages"]),
    ({}, "/azure/embeddings", ["does not serve embeddings", f"POST /azure/chat/completions?{API_VERSION}"]),
    ({}, "/azure/openai/deployments/gpt-4o/chat/completions",
     ["Azure OpenAI path", f"POST /azure/chat/completions?{API_VERSION}", '"model": "gpt-4o"',
      f'OpenAI(base_url="{BASE}/azure", default_query={{"api-version": "2024-05-01-preview"}})']),
    ({}, "/azure/deployments/gpt-4o/chat/completions", ["Azure OpenAI path", AZURE_CHAT]),
    ({}, "/azure/openai/v1/chat/completions", ["Azure OpenAI path", AZURE_CHAT]),
    ({}, "/openai/deployments/d/chat/completions", ["Azure OpenAI path", AZURE_CHAT]),
    ({}, "/azure/openai/deployments/d/embeddings", ["Azure OpenAI path", "On /azure this gateway serves"]),
    # the Azure mount wherever it is configured
    ({"azure": "/inference"}, "/inference/openai/deployments/d/chat/completions",
     [f"POST /inference/chat/completions?{API_VERSION}", f'base_url="{BASE}/inference"']),
    ({"azure": "/"}, "/openai/deployments/d/chat/completions", [f"POST /chat/completions?{API_VERSION}"]),
    ({"azure": None}, "/azure/openai/deployments/d/chat/completions",
     ["Azure OpenAI path", "This gateway serves: /aleph-alpha"]),
    # Anthropic's SDKs pointed at the root, or at the OpenAI mount
    ({}, "/v1/messages", ["POST /anthropic/v1/messages", f"ANTHROPIC_BASE_URL={BASE}/anthropic"]),
    ({"anthropic": "/claude"}, "/v1/messages/count_tokens",
     ["POST /claude/v1/messages/count_tokens", f"ANTHROPIC_BASE_URL={BASE}/claude"]),
    ({"openai": "/openai/v1"}, "/openai/v1/messages", ["POST /anthropic/v1/messages"]),
    # a base URL that ends in /v1 once too often
    ({}, "/v1/v1/chat/completions", ["repeats /v1", "once too often", "POST /v1/chat/completions"]),
    ({}, "/anthropic/v1/v1/messages", ["repeats /v1", "POST /anthropic/v1/messages"]),
    # a client pointed at the root: each mount that has the path
    ({}, "/chat/completions", ["POST /v1/chat/completions", f'OpenAI(base_url="{BASE}/v1")',
                               f"POST /azure/chat/completions?{API_VERSION}", "POST /v3/chat/completions"]),
    ({}, "/responses", ["POST /v1/responses"]),
    # otherwise: the path, and what this gateway serves
    ({}, "/v1/nothing", ["On /v1 (OpenAI) this gateway serves: POST /v1/chat/completions"]),
    ({}, "/nothing", ["This gateway serves: /aleph-alpha (", "/anthropic (Anthropic Messages)",
                      "/azure (Azure AI Model Inference)", "/v1 (OpenAI)", "<mount>/openapi.json"]),
    ({"openai": "/openai/v1"}, "/openai/v1/embeddings",
     ["On /openai/v1 (OpenAI)", "POST /openai/v1/chat/completions"]),
]  # fmt: skip


@pytest.mark.parametrize(("mounts", "path", "said"), CASES, ids=[f"{c[1]}{c[0] or ''}" for c in CASES])
def test_a_path_nothing_serves_is_told_the_way_forward(mounts, path, said):
    message = unserved(**mounts).message(path, BASE)
    assert message.startswith(f"Not found: {path}. ")
    for part in said:
        assert part in message, message


def test_the_hints_name_only_configured_mounts():
    """The hints come from the configured mounts, never the defaults."""
    message = unserved(openai="/openai/v1", anthropic=None).message("/v1/messages", BASE)
    assert "/anthropic" not in message and "ANTHROPIC_BASE_URL" not in message
    assert "This gateway serves: " in message and "/openai/v1 (OpenAI)" in message


def test_the_asked_path_is_shown_bounded_and_terminal_safe():
    message = unserved().message("/v1/\x1b]52;c;aGk=\x07" + "a" * 1000, BASE)
    assert "\x1b" not in message and "\x07" not in message and "\\x1b]52" in message
    shown = message.removeprefix("Not found: ").partition(". ")[0]
    assert len(shown) <= 200 and shown.endswith("…")


@pytest.mark.parametrize(
    ("host", "address"),
    [(b"gw.example:8080", "http://gw.example:8080"), (b"[::1]:80", "http://[::1]:80"),
     (b"evil\x1b[2J", SOME_GATEWAY), (b"a b", SOME_GATEWAY), (None, SOME_GATEWAY)],
)  # fmt: skip
def test_the_gateway_address_is_the_host_asked_or_a_placeholder(host, address):
    assert gateway_address("http", host) == address
