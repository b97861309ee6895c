"""scripts/vendor-fidelity: every body a vendor's current document calls valid that the gateway
refuses is refused under a `# reading:` of the dialect's document in openapi/, or by one of the
seed's rules (issue 26), none for want of a field, a part or a tool call the vendor defines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vendor-fidelity"


@pytest.mark.parametrize("document", ["openai", "openai-responses", "azure", "aleph-alpha"])
def test_no_refusal_of_a_valid_vendor_body_goes_unnamed(refspecs: Path, document: str):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--document", document, "--examples", "100"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = re.search(r"refused \(400\): (\d+): .*; named by no reading of \S+: (\d+)", result.stdout)
    assert counts is not None, result.stdout
    refused, unnamed = map(int, counts.groups())
    assert refused > 0 and unnamed == 0, result.stdout
    sent = re.search(r"^(\d+) valid bodies", result.stdout, re.M)
    assert sent is not None and int(sent.group(1)) >= 50, result.stdout  # the count means something
