"""A `tgi` deployment's `options:`, validated at start; the limits mirror TGI's launcher settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from backends.http.options import NetworkOptions
from gateway.core.options import from_file


class TGIOptions(NetworkOptions):
    """A `tgi` deployment's `options:`; the limits mirror TGI's launcher settings. The proxy, TLS
    and connect fields are every HTTP backend's (backends.http.options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="TGI's base URL, e.g. http://tgi:80")
    timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for a response or token.")
    token: SecretStr | None = Field(default=None, description="Bearer token TGI (or its proxy) wants.")
    token_file: Path | None = Field(default=None, description="A file holding the token instead.")
    use_messages_api: Literal["auto"] | bool = "auto"
    adapter_id: str | None = Field(default=None, description="A LoRA adapter TGI serves (default: base).")
    max_top_n_tokens: int = Field(default=5, ge=0, description="TGI --max-top-n-tokens")
    max_stop_sequences: int = Field(default=4, ge=0, description="TGI --max-stop-sequences")
    max_n: int = Field(default=8, ge=1, description="Most choices per request (parallel requests).")
    context_length: int = Field(default=4096, ge=1, description="TGI --max-total-tokens")
    modalities: frozenset[Literal["text", "image"]] = frozenset({"text"})
    max_connections: int = Field(default=100, ge=1)

    @model_validator(mode="before")
    @classmethod
    def token_from_file(cls, values: Any) -> Any:
        return from_file(values, "token")

    @field_validator("url")
    @classmethod
    def http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url.rstrip("/")
