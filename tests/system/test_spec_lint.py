"""The documents in openapi/ pass Spectral with the committed ruleset (.spectral.yaml): no errors,
no warnings. Spectral is pinned in tests/support/spectral/package-lock.json and installed by this test
into a temporary folder with `npm ci`; nothing is installed into the repository.

By hand: `npm ci --prefix /tmp/spectral` (after copying tests/support/spectral/package*.json there), then
`/tmp/spectral/node_modules/.bin/spectral lint --ruleset .spectral.yaml openapi/*.yaml`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.dialects.registry import DIALECTS
from tests.support.servers import ROOT

RULESET = ROOT / ".spectral.yaml"
SPEC_FILES = [dialect.document for dialect in DIALECTS.values()]
ERROR, WARNING = 0, 1  # Spectral's severities


@pytest.fixture(scope="module")
def spectral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    npm = shutil.which("npm")
    assert npm, "npm is needed to install Spectral (Node.js 18 or later)"
    folder = tmp_path_factory.mktemp("spectral")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / "tests" / "support" / "spectral" / name, folder / name)
    subprocess.run(
        [npm, "ci", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return folder / "node_modules" / ".bin" / "spectral"


def lint(spectral: Path, *documents: Path) -> list[dict[str, Any]]:
    """Spectral's findings (JSON format) for the documents."""
    result = subprocess.run(
        [str(spectral), "lint", "--ruleset", str(RULESET), "--format", "json", "--quiet",
         "--fail-severity", "error", *map(str, documents)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr  # 1: findings at error severity
    return json.loads(result.stdout or "[]")


def readable(findings: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"{Path(f['source']).name}:{f['range']['start']['line'] + 1} {f['code']}: {f['message']} "
        f"({'.'.join(map(str, f['path']))})"
        for f in findings
    )


def test_documents_pass_the_ruleset(spectral: Path):
    findings = lint(spectral, *(ROOT / "openapi" / name for name in SPEC_FILES))
    serious = [f for f in findings if f["severity"] in (ERROR, WARNING)]
    assert serious == [], readable(serious)


def test_the_ruleset_catches_what_it_promises(spectral: Path, tmp_path: Path):
    """A document broken on purpose trips every chatgate-* rule, so the rules are live."""
    document = yaml.safe_load((ROOT / "openapi" / "openai.yaml").read_text())
    chat = document["paths"]["/chat/completions"]["post"]
    del chat["summary"]
    chat["operationId"] = "Create_Chat"
    del chat["requestBody"]["content"]["application/json"]["examples"]
    del chat["responses"]["200"]["content"]["text/event-stream"]["examples"]
    chat["responses"]["429"] = {"description": "Slow down.", "headers": {}}
    del chat["responses"]["504"]
    chat["responses"]["418"] = {"description": "No body, no request id."}
    document["components"]["schemas"]["Model"]["properties"]["owner"] = {"$ref": "other.yaml#/Owner"}
    document["openapi"] = "3.1.0"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False))

    fired = {f["code"] for f in lint(spectral, broken)}
    chatgate_rules = {
        name for name in yaml.safe_load(RULESET.read_text())["rules"] if name.startswith("chatgate-")
    }
    assert chatgate_rules - fired == set()
