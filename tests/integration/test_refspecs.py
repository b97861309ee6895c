"""Where the vendors' documents (the refspecs) are found, and scripts/fetch-refspecs, which puts
the pinned versions in place. Downloads cannot be tried offline: they are replaced by a fake
`fetch`, and the download itself is only `urllib` behind `download`. Copying from a folder is
tried for real, from the folder the tests found (skipped when there is none)."""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gateway.tools import vendor_specs
from gateway.tools.vendor_specs import REFSPECS_ENV, VENDOR_DOCUMENTS, RefspecsError, default_refspecs_dir
from tests.support.servers import ROOT
from tests.support.tgi_server import REFSPEC_FILE as TGI_REFSPEC

SCRIPT = ROOT / "scripts" / "fetch-refspecs"


def load_script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("fetch_refspecs", str(SCRIPT))
    spec = importlib.util.spec_from_loader("fetch_refspecs", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fetch_refspecs"] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


fetch_refspecs = load_script()
PINS = fetch_refspecs.load_pins()


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


# ----- where the documents are found ------------------------------------------------------------


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A source checkout in tmp_path/repo, with a developers' shared/refspecs beside it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("")
    (tmp_path / "shared" / "refspecs").mkdir(parents=True)
    monkeypatch.setattr(vendor_specs, "REPO_ROOT", repo)
    monkeypatch.delenv(REFSPECS_ENV, raising=False)
    return repo


def test_the_environment_variable_comes_first(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (checkout / "refspecs").mkdir()
    monkeypatch.setenv(REFSPECS_ENV, str(tmp_path))
    assert default_refspecs_dir() == tmp_path


def test_an_environment_variable_that_is_not_a_folder_is_an_error(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (checkout / "refspecs").mkdir()  # no quiet fallback to it
    monkeypatch.setenv(REFSPECS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(RefspecsError, match=f"{REFSPECS_ENV}=.*nowhere is not a folder"):
        default_refspecs_dir()


def test_else_the_checkouts_refspecs_folder(checkout: Path):
    (checkout / "refspecs").mkdir()
    assert default_refspecs_dir() == checkout / "refspecs"


def test_never_a_shared_folder_beside_the_checkout(checkout: Path):
    assert default_refspecs_dir() is None


def test_refspecs_is_git_ignored():
    assert "refspecs/" in (ROOT / ".gitignore").read_text().splitlines()


# ----- the pins ---------------------------------------------------------------------------------


def test_the_lock_pins_every_document_chatgate_reads():
    pinned = {pin.path for pin in PINS}
    assert {vendor.file for vendor in VENDOR_DOCUMENTS.values()} | {TGI_REFSPEC} <= pinned
    for pin in PINS:
        assert not Path(pin.path).is_absolute() and ".." not in Path(pin.path).parts
        assert re.fullmatch(r"[0-9a-f]{40}", pin.commit), pin
        assert pin.url == f"https://raw.githubusercontent.com/{pin.repo}/{pin.commit}/{pin.source}"
        digest = pin.canonical_sha256 if pin.extract else pin.sha256
        assert re.fullmatch(r"[0-9a-f]{64}", digest), pin
    assert [pin.path for pin in PINS if pin.extract] == [VENDOR_DOCUMENTS["aleph_alpha"].file]


# ----- fetching, offline ------------------------------------------------------------------------

PLAIN = b'{"openapi": "3.0.3", "paths": {}}\n'
FULL = {  # a made-up "full document" from which an extract is taken
    "openapi": "3.0.3",
    "info": {"title": "T", "version": "1"},
    "servers": [{"url": "https://example.invalid"}],
    "components": {
        "securitySchemes": {"token": {"type": "http"}, "other": {"type": "apiKey"}},
        "schemas": {"B": {"type": "string", "nullable": "true"}, "X": {}, "A": {"minimum": "-2"}},
    },
    "paths": {"/chat": {"post": {}}, "/other": {}},
}
PARTS = {"security_schemes": ["token"], "schemas": ["A", "B"], "paths": ["/chat"], "note": "An extract."}
EXTRACT = {
    "openapi": "3.0.3",
    "info": {"title": "T", "version": "1", "x-extract-note": "An extract."},
    "components": {
        "securitySchemes": {"token": {"type": "http"}},
        "schemas": {"B": {"type": "string", "nullable": "true"}, "A": {"minimum": "-2"}},
    },
    "paths": {"/chat": {"post": {}}},
}


def sha256(data: bytes) -> str:
    return fetch_refspecs.sha256(data)


def synthetic_pins(tmp_path: Path) -> list[Any]:
    lock = tmp_path / "lock.yaml"
    entries = [
        {"path": "plain.json", "repo": "o/r", "commit": "1" * 40, "source": "docs/plain.json",
         "bytes": len(PLAIN), "sha256": sha256(PLAIN)},
        {"path": "sub/extract.json", "repo": "o/s", "commit": "2" * 40, "source": "full.json",
         "extract": PARTS, "canonical_sha256": sha256(fetch_refspecs.canonical_json(EXTRACT))},
    ]  # fmt: skip
    lock.write_text(yaml.safe_dump({"files": entries}))
    return fetch_refspecs.load_pins(lock)


class FakeGitHub:
    """Serves bodies by URL and remembers what was asked for."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        self.bodies = bodies
        self.asked: list[str] = []

    def __call__(self, url: str, limit: int) -> bytes:
        self.asked.append(url)
        if url not in self.bodies:
            raise fetch_refspecs.Problem(f"cannot download {url}: HTTP 404 Not Found")
        return self.bodies[url]


def test_extraction_takes_the_pinned_parts_verbatim():
    shuffled = {**FULL, "components": {**FULL["components"], "schemas": {"A": {"minimum": "-2"}, "X": {},
                "B": {"type": "string", "nullable": "true"}}}}  # fmt: skip
    for full in (FULL, shuffled):
        extract = fetch_refspecs.extract_parts(copy.deepcopy(full), PARTS)
        assert fetch_refspecs.canonical_json(extract) == fetch_refspecs.canonical_json(EXTRACT)
    assert list(fetch_refspecs.extract_parts(FULL, PARTS)["components"]["schemas"]) == ["B", "A"]  # its order
    with pytest.raises(fetch_refspecs.Problem, match="has no schemas C"):
        fetch_refspecs.extract_parts(FULL, {**PARTS, "schemas": ["A", "C"]})


def test_canonical_json_ignores_formatting_only(tmp_path: Path):
    data = json.dumps(EXTRACT, indent=2).encode()
    pin = synthetic_pins(tmp_path)[1]
    assert fetch_refspecs.problem_with(pin, data) is None
    assert fetch_refspecs.problem_with(pin, fetch_refspecs.write_extract(EXTRACT)) is None
    changed = copy.deepcopy(EXTRACT)
    changed["components"]["schemas"]["A"]["minimum"] = -2  # the copy's strings are part of the pin
    assert "canonical JSON has sha256" in fetch_refspecs.problem_with(pin, json.dumps(changed).encode())


def test_fetch_downloads_checks_writes_and_then_keeps(tmp_path: Path):
    pins = synthetic_pins(tmp_path)
    github = FakeGitHub({pins[0].url: PLAIN, pins[1].url: json.dumps(FULL).encode()})
    dest = tmp_path / "refspecs"
    said: list[str] = []
    assert fetch_refspecs.fetch_all(pins, dest, fetch=github, say=said.append) == []
    assert github.asked == [
        "https://raw.githubusercontent.com/o/r/1111111111111111111111111111111111111111/docs/plain.json",
        "https://raw.githubusercontent.com/o/s/2222222222222222222222222222222222222222/full.json",
    ]
    assert (dest / "plain.json").read_bytes() == PLAIN
    assert json.loads((dest / "sub" / "extract.json").read_bytes()) == EXTRACT
    assert said == ["fetched  plain.json", "fetched  sub/extract.json"]
    # again: everything is there and right, so nothing is downloaded
    github.asked.clear()
    assert fetch_refspecs.fetch_all(pins, dest, fetch=github, say=said.append) == []
    assert github.asked == []
    # a damaged file is fetched again
    (dest / "plain.json").write_bytes(b"{}")
    assert fetch_refspecs.fetch_all(pins, dest, fetch=github, say=said.append) == []
    assert github.asked == [pins[0].url] and (dest / "plain.json").read_bytes() == PLAIN


def test_fetch_names_each_problem_in_one_line_and_writes_nothing_wrong(tmp_path: Path):
    pins = synthetic_pins(tmp_path)
    changed = {**FULL, "paths": {"/chat": {"post": {"summary": "changed"}}}}
    github = FakeGitHub({pins[0].url: PLAIN + b" ", pins[1].url: json.dumps(changed).encode()})
    dest = tmp_path / "refspecs"
    problems = fetch_refspecs.fetch_all(pins, dest, fetch=github, say=lambda line: None)
    assert len(problems) == 2 and all("\n" not in p for p in problems)
    assert problems[0].startswith("plain.json: https://raw.githubusercontent.com/o/r/")
    assert f"{len(PLAIN) + 1} bytes with sha256" in problems[0] and f"{len(PLAIN)} bytes" in problems[0]
    assert problems[1].startswith("sub/extract.json: ") and "canonical JSON has sha256" in problems[1]
    assert not dest.exists() or not any(dest.rglob("*.json"))
    problems = fetch_refspecs.fetch_all(pins, dest, fetch=FakeGitHub({}), say=lambda line: None)
    assert [p.split(":")[0] for p in problems] == ["plain.json", "sub/extract.json"]
    assert all("HTTP 404" in p for p in problems)


def test_check_only_reports_and_changes_nothing(tmp_path: Path):
    pins = synthetic_pins(tmp_path)
    dest = tmp_path / "refspecs"
    (dest / "sub").mkdir(parents=True)
    (dest / "sub" / "extract.json").write_bytes(fetch_refspecs.write_extract(EXTRACT))
    problems = fetch_refspecs.fetch_all(pins, dest, fetch=FakeGitHub({}), check_only=True, say=lambda _: None)
    assert problems == [f"{dest / 'plain.json'}: missing"]
    assert not (dest / "plain.json").exists()


# ----- with the real documents ------------------------------------------------------------------


def test_the_real_extract_comes_out_of_a_full_document(refspecs: Path):
    """A full document made of the real extract's parts among others: the extraction gives back
    the pinned extract, byte for byte when the parts keep their order."""
    pin = next(pin for pin in PINS if pin.extract)
    original = (refspecs / pin.path).read_bytes()
    extract = json.loads(original)
    full = copy.deepcopy(extract)
    del full["info"]["x-extract-note"]
    full["servers"] = [{"url": "https://example.invalid"}]
    full["components"]["securitySchemes"]["other"] = {"type": "apiKey"}
    full["components"]["schemas"] = {"Hosting": {"type": "string"}, **full["components"]["schemas"], "Z": {}}
    full["paths"] = {"/complete": {"post": {}}, **full["paths"], "/tokenize": {}}

    def extracted() -> bytes:
        return fetch_refspecs.from_source(pin, lambda url, limit: json.dumps(full).encode())

    assert fetch_refspecs.problem_with(pin, extracted()) is None
    assert extracted() == original
    full["components"]["schemas"] = dict(reversed(full["components"]["schemas"].items()))
    assert fetch_refspecs.problem_with(pin, extracted()) is None  # another order, the same JSON
    full["components"]["schemas"]["ChatResponse"]["type"] = "array"
    assert "canonical JSON has sha256" in fetch_refspecs.problem_with(pin, extracted())


def test_copies_from_a_folder_for_real(refspecs: Path, tmp_path: Path):
    dest = tmp_path / "refspecs"
    result = run_script("--from", str(refspecs), "--dest", str(dest))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(line.split()[1] for line in result.stdout.splitlines()[:-1]) == sorted(p.path for p in PINS)
    assert all(line.startswith("copied ") for line in result.stdout.splitlines()[:-1])
    result = run_script("--check", "--dest", str(dest))
    assert result.returncode == 0, result.stdout + result.stderr
    tgi = dest / TGI_REFSPEC
    tgi.write_bytes(tgi.read_bytes().replace(b'"3.0.3"', b'"3.0.4"', 1))
    result = run_script("--check", "--dest", str(dest))
    assert result.returncode == 1
    assert result.stderr.splitlines()[0].startswith(f"fetch-refspecs: {tgi}: 68003 bytes with sha256 ")
    result = run_script("--from", str(refspecs), "--dest", str(dest))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "copied   tgi-openapi.json" in result.stdout.splitlines()
    assert sum(line.startswith("ok ") for line in result.stdout.splitlines()) == len(PINS) - 1


def test_copying_from_an_incomplete_folder_names_what_is_missing(refspecs: Path, tmp_path: Path):
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / TGI_REFSPEC).write_bytes((refspecs / TGI_REFSPEC).read_bytes())
    result = run_script("--from", str(partial), "--dest", str(tmp_path / "refspecs"))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == len(PINS)  # one per missing file, then the summary
    assert all("does not exist" in line for line in lines[:-1])
    assert lines[-1] == f"fetch-refspecs: {len(PINS) - 1} of {len(PINS)} files not in {tmp_path / 'refspecs'}"
