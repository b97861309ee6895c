from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import running_gateway


@pytest.fixture(scope="session")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A chatgate server with the default configuration: every dialect on the echo backend."""
    with running_gateway(tmp_path_factory.mktemp("gateway")) as url:
        yield url


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")
