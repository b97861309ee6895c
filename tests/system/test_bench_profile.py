"""bench/profile.py puts each py-spy sample to the part of the gateway its innermost frame is in;
samples of threads that wait (the log writer, the DNS resolver) are not the request path."""

from __future__ import annotations

import pytest

from bench.profile import OTHER, part_of, shares

SITE = "/usr/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("frame", "part"),
    [
        (f"data_received ({SITE}/uvicorn/protocols/http/httptools_impl.py:164)", "HTTP server"),
        ("data_received (/repo/gateway/server/edge.py:164)", "HTTP server"),
        (f"send ({SITE}/aiohttp/client_reqrep.py:1721)", "upstream HTTP client"),
        ("post (/repo/backends/http/client.py:40)", "upstream HTTP client"),
        ("answer (/repo/backends/echo.py:310)", "backend"),
        ("parse_and_validate (/repo/gateway/http/validation.py:144)", "front door"),
        ("first_breach (/repo/gateway/dialects/rules.py:145)", "translator"),
        ("apply (/repo/gateway/policy/admission_steps.py:119)", "policy steps"),
        ("next (/repo/gateway/fleet/attempt.py:103)", "dispatch"),
        ("add_item (/repo/gateway/core/canonical.py:307)", "answer"),
        ("finished (/repo/gateway/telemetry/metrics.py:129)", "records"),
    ],
)
def test_a_frame_goes_to_its_part(frame: str, part: str) -> None:
    assert part_of(frame).startswith(part)


def test_shares_count_busy_samples_only() -> None:
    raw = [
        "main (gateway/__main__.py:3);run (asyncio/runners.py:118) 6",
        "main (gateway/__main__.py:3);answer (/repo/backends/echo.py:310) 3",
        "drain (/repo/gateway/telemetry/log_sink.py:52) 50",  # the log writer, sleeping
        "something (/repo/elsewhere.py:1) 1",
        "not a sample line",
    ]
    found = shares(raw)
    assert found == {
        "HTTP server: uvicorn, the edge, the event loop": 0.6,
        "backend: its request and answer": 0.3,
        OTHER: 0.1,
    }
    assert shares([]) == {}
