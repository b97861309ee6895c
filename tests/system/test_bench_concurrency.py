"""The concurrency point names each failed stream's error closely enough to find its cause: a
reset (the listen backlog overflowing) is not a refusal, though aiohttp raises both as
ClientOSError."""

from __future__ import annotations

import errno

import aiohttp

from bench.concurrency import error_kind


def test_an_error_with_an_errno_is_named_by_it():
    reset = aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer")
    refused = aiohttp.ClientOSError(errno.ECONNREFUSED, "Connection refused")
    assert error_kind(reset) == "ClientOSError ECONNRESET"
    assert error_kind(refused) == "ClientOSError ECONNREFUSED"


def test_an_error_without_one_is_named_by_its_type():
    assert error_kind(TimeoutError()) == "TimeoutError"
    assert error_kind(aiohttp.ServerDisconnectedError()) == "ServerDisconnectedError"
