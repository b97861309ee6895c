"""How an HTTP backend reaches its upstream on a real network: an outbound proxy, TLS (a private
CA, a client certificate, or no check at all) and the connect timeout. Every HTTP backend's
options take these fields (`NetworkOptions`), so a deployment says them the same way whatever
its backend; `proxy_for` and `ssl_context` turn them into what a client library takes, once, at
start. The certificate files are read then, when the backend is built: a missing or bad one stops
the gateway naming it, and `chatgate config check` passes where the secrets are not mounted.
`ChoiceOptions` says how a deployment gets n choices from an upstream that may ignore `n`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator

PROXY_FROM_ENVIRONMENT = "env"
NO_PROXY = "none"


class NetworkOptions(BaseModel):
    """The proxy, TLS and connect fields of an HTTP backend's `options:`."""

    proxy: str = Field(
        default=PROXY_FROM_ENVIRONMENT,
        description='"env": the proxy the environment names for the upstream\'s scheme '
        "(HTTPS_PROXY, HTTP_PROXY or ALL_PROXY, either case), unless NO_PROXY names its host; read "
        'once, at start. "none": connect directly. Or the proxy\'s URL, '
        "http://[user:password@]host:port (an https upstream is reached through it with CONNECT).",
    )
    ca_file: Path | None = Field(
        default=None,
        description="PEM file of the CA certificates an https upstream's certificate is checked "
        "against, in place of the system's (a private CA).",
    )
    client_cert: Path | None = Field(
        default=None, description="PEM certificate presented to an upstream that asks for one (mTLS)."
    )
    client_key: Path | None = Field(
        default=None, description="Its private key (PEM), when client_cert does not hold it."
    )
    verify: bool = Field(
        default=True,
        description="false: accept any certificate and host name (testing only: anyone on the path "
        "can read and change the traffic).",
    )
    connect: float = Field(default=5.0, gt=0, description="Seconds to connect (TCP, proxy and TLS).")

    @field_validator("proxy")
    @classmethod
    def proxy_url(cls, value: str) -> str:
        if value in (PROXY_FROM_ENVIRONMENT, NO_PROXY):
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError('must be "env", "none" or a proxy URL such as http://proxy:3128')
        return value

    @model_validator(mode="after")
    def key_needs_certificate(self) -> Any:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert")
        return self

    def proxy_for(self, url: str, environment: Mapping[str, str]) -> str | None:
        """The proxy URL requests to `url` go through (None: directly); `environment` is read
        only for `proxy: env`."""
        if self.proxy == NO_PROXY:
            return None
        if self.proxy != PROXY_FROM_ENVIRONMENT:
            return self.proxy
        return environment_proxy(url, environment)

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings for an https upstream (files are read now: a bad one fails at start,
        named)."""
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(f"ca_file {self.ca_file}: {error.strerror or error}") from None
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert is not None:
            key = str(self.client_key) if self.client_key is not None else None
            try:
                context.load_cert_chain(str(self.client_cert), key)
            except (OSError, ssl.SSLError) as error:
                files = f"{self.client_cert}" + (f", {self.client_key}" if key else "")
                raise ValueError(f"client_cert {files}: {error.strerror or error}") from None
        return context


class ProbeOptions(BaseModel):
    """The probing fields of a backend whose upstream speaks a dialect chatgate can probe."""

    probe: bool = Field(
        default=False,
        description="Probe the upstream at start and on reload, in the background (`chatgate "
        "probe`'s requests): a feature it ignores or refuses (n, logprobs, tools, json_object, "
        "json_schema, stop, seed) is then refused with 422 rather than silently dropped. Until the "
        "probes are done, and while the upstream cannot be probed, the capabilities are as declared. "
        "/ready shows what was found.",
    )
    probe_timeout: float = Field(default=30.0, gt=0, description="Seconds for each probe request's answer.")


def environment_proxy(url: str, environment: Mapping[str, str]) -> str | None:
    """The proxy the environment names for `url`, as curl and Python's urllib read it:
    `<scheme>_proxy`, else `all_proxy` (lower case before upper); `no_proxy` lists hosts (a name
    also covers its subdomains; `host:port` only that port; `*` every host) reached directly."""

    def variable(name: str) -> str:
        return environment.get(name) or environment.get(name.upper()) or ""

    parts = urlsplit(url)
    proxy = variable(f"{parts.scheme}_proxy") or variable("all_proxy")
    if not proxy or bypassed(parts.hostname or "", parts.port, variable("no_proxy")):
        return None
    return proxy


def bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    host = host.lower().strip("[]")
    for entry in no_proxy.lower().replace(" ", "").split(","):
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        name = name.lstrip(".").strip("[]")
        if not name or (entry_port and entry_port != str(port)):
            continue
        if host == name or host.endswith("." + name):
            return True
    return False


ChoicesMode = Literal["native", "fan-out", "refuse"]


class ChoiceOptions(BaseModel):
    """How a deployment gets a request's `n` choices from an upstream that answers one request."""

    n: ChoicesMode = Field(
        default="native",
        description='"native": the upstream is asked for n choices in one request, and an answer '
        "with fewer is refused (422 naming n), never padded; "
        '"fan-out": n requests of one choice each, run at once and joined (seeds seed, seed+1 …; '
        "usage summed: the prompt counted once a choice; each request takes a slot of max_concurrent; "
        "n at most 16), for an upstream that ignores n (transformers serve, llama.cpp); "
        '"refuse": a request for more than one choice gets 422 naming n, before the upstream is asked.',
    )
