"""scripts/vendor-fidelity: every body OpenAI's current document calls valid that the gateway
refuses is refused under a `# reading:` of openai.yaml (issue 26), none for want of a field,
a part or a tool call the vendor defines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "vendor-fidelity"


def test_no_refusal_of_a_valid_openai_body_goes_unnamed(refspecs: Path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--examples", "100"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = re.search(r"refused \(400\): (\d+); named by no reading: (\d+)", result.stdout)
    assert counts is not None, result.stdout
    refused, unnamed = map(int, counts.groups())
    assert refused > 0 and unnamed == 0, result.stdout
    assert "seed rule top_logprobs-needs-logprobs" in result.stdout  # the rules are told apart
