"""What a probe finds: one verdict per feature, and the report of one run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["honoured", "deviates", "ignored", "refused", "broken"]
# honoured: the answer shows the feature at work, as the document describes it; deviates: the
# feature works, but the answer differs from what the document says of it (generation stopped at
# the stop string, and the text keeps it); ignored: a 2xx answer without it; refused: a 4xx
# naming the request wrong; broken: no usable answer (a 5xx, a timeout, a malformed body).
NOT_HONOURED: frozenset[str] = frozenset({"ignored", "refused"})


@dataclass(frozen=True, slots=True)
class Finding:
    feature: str
    verdict: Verdict
    detail: str = ""

    def as_json(self) -> dict[str, str]:
        return {"verdict": self.verdict, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """One probe run against one URL."""

    url: str
    model: str | None  # None: no model named
    dialect: str
    findings: list[Finding] = field(default_factory=list)
    not_probed: dict[str, str] = field(default_factory=dict)  # features the dialect lacks: why

    def verdicts(self) -> dict[str, Verdict]:
        return {f.feature: f.verdict for f in self.findings}

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "model": self.model,
            "dialect": self.dialect,
            "findings": {f.feature: f.as_json() for f in self.findings},
            "not_probed": self.not_probed,
        }

    def render(self) -> str:
        """A table for people: feature, verdict, what was seen."""
        width = max((len(name) for name in [*self.verdicts(), *self.not_probed]), default=0)
        model = f"model {self.model}" if self.model is not None else "no model named"
        lines = [f"{self.url} ({model}, dialect {self.dialect})"]
        lines += [f"  {f.feature:<{width}}  {f.verdict:<8}  {f.detail}" for f in self.findings]
        lines += [
            f"  {name:<{width}}  {'n/a':<8}  not probed: {why}" for name, why in self.not_probed.items()
        ]
        return "\n".join(lines)


class ProbeUnavailable(Exception):
    """The probes cannot run: the upstream does not answer a plain request (down, a key needed,
    no such model), so nothing it does with a feature can be told."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status  # the plain request's HTTP status; 0: no answer
