from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.tools.vendor_specs import (
    REFSPECS_HOW,
    VENDOR_DOCUMENTS,
    RefspecsError,
    default_refspecs_dir,
)
from tests.support.servers import running_gateway

# The vendors' published documents are not in the repository (see gateway/tools/vendor_specs.py):
# tests that need them skip with this one reason when none are found.
REFSPECS_MISSING = f"vendor documents not found: {REFSPECS_HOW}"
TGI_REFSPEC = "tgi-openapi.json"  # what tests/support/tgi_server.py checks the TGI stand-in against
NEEDED_REFSPECS = (*(vendor.file for vendor in VENDOR_DOCUMENTS.values()), TGI_REFSPEC)
_refspecs = pytest.StashKey[Path | None]()


TESTS = Path(__file__).resolve().parent
# each folder of tests/ is a lane, and its tests carry its name as a marker; system tests and
# the modules marked `slow` are out of the fast lane, `pytest -m "not slow"`
# (docs/development/tests.md)
LANES = ("unit", "integration", "system")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        lane = item.path.resolve().relative_to(TESTS).parts[0]
        if lane in LANES:
            item.add_marker(getattr(pytest.mark, lane))
        if lane == "system":
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    try:
        config.stash[_refspecs] = default_refspecs_dir()
    except RefspecsError as error:  # set, but wrong: say so rather than skip quietly
        raise pytest.UsageError(f"{error}: point it at a folder of vendor documents, or unset it") from None


def refspecs_status(config: pytest.Config) -> str:
    found = config.stash.get(_refspecs, None)
    if found is None:
        return f"vendor documents: not found, so the tests that need them are skipped: {REFSPECS_HOW}"
    missing = [name for name in NEEDED_REFSPECS if not (found / name).is_file()]
    if missing:
        return f"vendor documents: {found} lacks {', '.join(missing)} (scripts/fetch-refspecs --dest DIR)"
    return f"vendor documents: {found}"


def pytest_report_header(config: pytest.Config) -> str:
    return refspecs_status(config)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    terminalreporter.write_line(refspecs_status(config))


@pytest.fixture(scope="session")
def refspecs_dir(pytestconfig: pytest.Config) -> Path | None:
    """The folder of vendor documents ($CHATGATE_REFSPECS, else refspecs/ in the checkout), or
    None: for tests that add a check against the documents when they are there."""
    found = pytestconfig.stash.get(_refspecs, None)
    if found is None:
        return None
    missing = [name for name in NEEDED_REFSPECS if not (found / name).is_file()]
    if missing:  # a folder was given or fetched, but not all of it: that is a mistake, not a skip
        pytest.fail(f"{found} lacks {', '.join(missing)}: run scripts/fetch-refspecs --dest {found}")
    return found.resolve()


@pytest.fixture(scope="session")
def refspecs(refspecs_dir: Path | None) -> Path:
    """The folder of vendor documents; skips the test when there is none."""
    if refspecs_dir is None:
        pytest.skip(REFSPECS_MISSING)
    return refspecs_dir


@pytest.fixture(scope="session")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A chatgate server with the default configuration: every dialect on the echo backend."""
    with running_gateway(tmp_path_factory.mktemp("gateway")) as url:
        yield url


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")
