"""Sends a dialect's probe set to one URL and judges the answers: a plain request first (when
it fails, nothing else can be told, and `ProbeUnavailable` says why), then every probe, one
request at a time and in order, each bounded by the target's timeout."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.http.client import ConnectFailed, Limits, ProtocolError, UpstreamClient, UpstreamError
from backends.http.stream_decoders import decoder_for
from gateway.probes.findings import Finding, ProbeReport, ProbeUnavailable
from gateway.probes.probe_set import Answer, ProbeSet

KEY_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})
# Probe requests go one at a time, in order: a server's answer may depend on what else it is
# doing (llama-cpp-python's server cuts a stream short when another request comes in), and the
# verdicts must be the same on every run.
AT_ONCE = 1  # the connections a probe run holds
MAX_ANSWER_BYTES = 4 * 1024 * 1024
HEADERS = {"content-type": "application/json", "accept-encoding": "identity", "user-agent": "chatgate-probe"}


@dataclass(frozen=True, slots=True)
class Target:
    """Where to probe and how to reach it."""

    base_url: str  # where the dialect's paths begin, e.g. http://host:8000/v1
    model: str | None  # None: the requests name none (a dialect whose document needs none: LMI)
    headers: Mapping[str, str] = field(default_factory=dict)  # the key among them, if any
    timeout: float = 30.0  # seconds for each probe request's whole answer
    connect: float = 5.0
    proxy: str | None = None
    tls: ssl.SSLContext | None = None


async def probe(target: Target, probes: ProbeSet) -> ProbeReport:
    """Every probe of the set, judged; raises ProbeUnavailable when a plain request fails."""
    keyed = client(target, target.headers)
    keyless = client(target, {k: v for k, v in target.headers.items() if k.lower() not in KEY_HEADERS})
    try:
        named = {"model": target.model} if target.model is not None else {}
        plain = await ask(keyed, probes.path, {**named, **probes.plain}, target.timeout)
        if (failed := probes.gate(plain)) is not None:
            where = f"{target.base_url}{probes.path}"
            raise ProbeUnavailable(f"a plain request to {where} failed: {failed[1]}", plain.status)
        findings = []
        for one in probes.probes:  # one request at a time, in order (AT_ONCE)
            sent = keyless if one.keyless else keyed
            answers = [await ask(sent, probes.path, {**named, **body}, target.timeout) for body in one.bodies]
            gated = None if one.any_status else next(filter(None, map(probes.gate, answers)), None)
            verdict, detail = gated or one.judge(answers)
            if dropped := next((answer.first_failure for answer in answers if answer.first_failure), ""):
                detail = f"{detail} (asked twice: the first time, {dropped})"
            findings.append(Finding(one.feature, verdict, detail))
    finally:
        await keyed.aclose()
        await keyless.aclose()
    return ProbeReport(target.base_url, target.model, probes.dialect, list(findings), dict(probes.absent))


def client(target: Target, headers: Mapping[str, str]) -> UpstreamClient:
    limits = Limits(
        connect=target.connect,
        max_connections=AT_ONCE,
        keepalive_seconds=2.0,
        max_header_bytes=64 * 1024,
        max_response_bytes=MAX_ANSWER_BYTES,
    )
    sent = {**HEADERS, **{k.lower(): v for k, v in headers.items()}}
    return UpstreamClient(target.base_url, sent, limits, proxy=target.proxy, ssl_context=target.tls)


def parsed(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


async def ask(upstream: UpstreamClient, path: str, body: dict[str, Any], timeout: float) -> Answer:
    """One probe request's answer, read whole (a stream chunk by chunk); never raises.

    A request the transport failed (the connection refused or dropped, the answer cut short)
    is asked once more before it is judged: a server that drops one connection under load has
    not shown that it lacks the feature probed. A second failure is the answer, and says so."""
    first = await ask_once(upstream, path, body, timeout)
    if not first.transport_failed:
        return first
    again = await ask_once(upstream, path, body, timeout)
    if not again.transport_failed:
        return dataclasses.replace(again, first_failure=first.failure)
    said = again.failure if again.failure == first.failure else f"{first.failure}, then {again.failure}"
    return Answer(failure=f"{said} (asked twice)", transport_failed=True)


async def ask_once(upstream: UpstreamClient, path: str, body: dict[str, Any], timeout: float) -> Answer:
    answer = None
    try:
        async with asyncio.timeout(timeout):
            answer = await upstream.post(path, orjson.dumps(body))
            status = answer.status
            decoder = decoder_for(answer.media_type) if 200 <= status < 300 else None
            if decoder is None:
                raw = await answer.read()
                return Answer(status, parsed(raw), raw)
            chunks = []
            while piece := await answer.read_some():
                chunks += [parsed(payload) for payload in decoder.feed(piece)]
            chunks += [parsed(payload) for payload in decoder.close()]
            return Answer(
                status, streamed=True, chunks=tuple(chunks), done=decoder.done, media_type=answer.media_type
            )
    except TimeoutError:
        return Answer(failure=f"no answer within {timeout:g} s")
    except UpstreamError as error:
        dropped = isinstance(error, ConnectFailed | ProtocolError)  # not an answer too large
        return Answer(failure=f"{type(error).__name__}: {error}", transport_failed=dropped)
    finally:
        if answer is not None:
            answer.close()
