"""What a `chatgate conformance` run found, and the forms a person reads it in: the terminal
lines, `--report` JSON, `--junit` XML for CI and an `--html` page.

A run has two parts: the feature matrix (the probes of gateway/probes: feature → honoured,
ignored, refused or broken) and the findings of the fuzzing (one per check and operation, with
how many cases failed it and one short example). Every example is bounded: a status, at most
`BODY_CHARS` of the answer and a printable `curl` of at most `CURL_BYTES`.
"""

from __future__ import annotations

import html
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from gateway.tools.terminal import xml_safe

BODY_CHARS = 300
CURL_BYTES = 1024
# Reported, not failed, when a key is asked for or the server is open (the deployment's choice).
REPORTED_ONLY = frozenset({"auth"})
AUTH_SHOWN = {"honoured": "key asked", "ignored": "open"}
NOT_PROBED = "n/a"  # the verdict of a feature the dialect does not have: not probed


@dataclass
class Finding:
    """One check failing on one operation: how many cases failed it, and the shortest of them."""

    check: str
    operation: str
    title: str
    message: str = ""
    count: int = 0
    status: int | None = None  # the example's HTTP status; None: no answer came
    body: str = ""  # the example's answer, bounded and printable
    curl: str = ""  # the example, printable, at most CURL_BYTES

    def as_json(self) -> dict[str, Any]:
        example = {"title": self.title, "message": self.message, "body": self.body, "curl": self.curl}
        return {
            "check": self.check,
            "operation": self.operation,
            "count": self.count,
            "status": self.status,
            "example": example,
        }


@dataclass
class OperationResult:
    label: str
    cases: int = 0
    findings: dict[str, Finding] = field(default_factory=dict)  # by check
    errors: list[str] = field(default_factory=list)
    answers: int = 0  # responses recorded
    unauthorized: int = 0  # of them 401


@dataclass
class Feature:
    name: str
    verdict: str  # honoured | ignored | refused | broken, or n/a: not in the dialect, not probed
    detail: str = ""

    @property
    def probed(self) -> bool:
        return self.verdict != NOT_PROBED

    @property
    def shown(self) -> str:
        """The verdict as the report shows it (auth: `key asked` or `open`)."""
        return AUTH_SHOWN.get(self.verdict, self.verdict) if self.name in REPORTED_ONLY else self.verdict

    @property
    def failed(self) -> bool:
        """Not honoured; for auth, only no usable answer (a 500 where a 401 belongs)."""
        if not self.probed:
            return False
        if self.name in REPORTED_ONLY:
            return self.verdict not in AUTH_SHOWN
        return self.verdict != "honoured"


@dataclass
class Report:
    dialect: str
    url: str
    spec_file: str
    vendor_file: str | None
    max_examples: int
    operations: dict[str, OperationResult] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    auth: str = ""  # how the run authenticated, as the report says it
    key_sent: bool = False
    against: str = "seed"
    model: str | None = None
    model_said: str = ""  # how the model was found (--model, a listing), or why there is none
    features: list[Feature] = field(default_factory=list)
    features_note: str = ""  # why there is no feature matrix, when there is none
    seconds: float = 0.0
    stopped: str = ""  # why the fuzzing ended before its cases did (the time budget)
    # the document's operations a server other than chatgate does not serve (404/405): not tested
    not_served: list[str] = field(default_factory=list)
    # why the features were not probed (--no-probes, no model, the plain request failed): a run
    # that did not probe them is not conformant, whatever the fuzzing found
    not_tested: str = ""
    vendor_note: str = ""  # which vendor document judged the answers, or why none did
    budget: str = ""  # the run's budget: examples, seconds a request, --max-time, phases

    def operation(self, label: str) -> OperationResult:
        return self.operations.setdefault(label, OperationResult(label))

    @property
    def findings(self) -> list[Finding]:
        return [f for op in self.operations.values() for f in op.findings.values()]

    @property
    def answers(self) -> int:
        return sum(op.answers for op in self.operations.values())

    @property
    def unauthorized(self) -> int:
        return sum(op.unauthorized for op in self.operations.values())

    @property
    def cases(self) -> int:
        return sum(op.cases for op in self.operations.values())

    @property
    def locked_out(self) -> bool:
        """Most answers were 401: the run tested the endpoint's key check, not its document (a
        schema check has nothing to say of a 401 body, so such a run would otherwise look clean)."""
        return self.answers > 0 and self.unauthorized * 2 > self.answers

    @property
    def all_errors(self) -> list[str]:
        return self.errors + [e for op in self.operations.values() for e in op.errors]

    @property
    def untested(self) -> str:
        """Why the run cannot say the endpoint conforms though nothing failed: the features were
        not probed, or no case was sent; empty when it tested both."""
        if self.not_tested:
            return f"the features were not probed because {self.not_tested}"
        if not self.cases:
            return "no case was sent: the fuzzing tested nothing"
        return ""

    @property
    def clean(self) -> bool:
        """Conformant: everything was tried, and nothing failed."""
        failed = any(f.failed for f in self.features)
        return not (self.findings or self.all_errors or failed or self.locked_out or self.untested)

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "dialect": self.dialect,
            "against": self.against,
            "model": self.model,
            "model_found": self.model_said,
            "conformant": self.clean,
            "not_tested": self.untested or None,
            "vendor_document": self.vendor_note,
            "budget": self.budget,
            "seconds": round(self.seconds, 1),
            "cases": self.cases,
            "features": {f.name: f.shown for f in self.features if f.probed},
            "feature_details": {f.name: f.detail for f in self.features if f.probed},
            "not_probed": {f.name: f.detail for f in self.features if not f.probed},
            "findings": [f.as_json() for f in self.findings],
            "operations": {
                op.label: {"cases": op.cases, "errors": op.errors} for op in self.operations.values()
            },
            "auth": self.auth,
            "errors": self.errors,
            "stopped": self.stopped,
            "not_served": self.not_served,
        }


def printable(text: str, limit: int) -> str:
    """`text` in printable ASCII (other characters escaped), at most about `limit` characters."""
    shown = "".join(c if c.isascii() and (c.isprintable() or c == " ") else ascii(c)[1:-1] for c in text)
    return shown if len(shown) <= limit else shown[:limit] + f"… ({len(shown)} chars)"


def verdict_line(report: Report) -> str:
    if report.locked_out:
        why = "the key was refused" if report.key_sent else "the endpoint needs a key: pass --key KEY"
        return (
            f"result: NOT conformant — not tested: {report.unauthorized} of {report.answers} answers "
            f"were 401 Unauthorized ({why}); the document's checks ran on almost nothing but the key check"
        )
    if report.clean:
        return "result: conformant — every feature honoured, no failures"
    parts = []
    failed = [f.name for f in report.features if f.failed]
    if failed:
        parts.append(f"{len(failed)} feature(s) not honoured: {', '.join(failed)}")
    if report.findings:
        named = sorted({f"{f.check} on {f.operation}" for f in report.findings})
        parts.append(f"{len(report.findings)} failing check(s): {'; '.join(named)}")
    if report.all_errors:
        parts.append(f"{len(report.all_errors)} error(s)")
    if report.untested:
        if not report.cases and report.not_tested:
            parts.append(f"nothing was probed because {report.not_tested}")
        else:
            quiet = " (and the fuzzing found no failure)" if not parts else ""
            parts.append(report.untested + quiet)
    return f"result: NOT conformant — {' — '.join(parts)}"


def model_text(report: Report) -> str:
    if report.model:
        return report.model + (f" ({report.model_said})" if report.model_said not in ("", "--model") else "")
    return f"none ({report.model_said})" if report.model_said else "(the document’s examples)"


def render(report: Report, vendor: str) -> str:
    """The terminal report: one line per feature and per failing check; `vendor` says which
    vendor document was used."""
    lines = [
        f"chatgate conformance: {report.dialect} dialect at {report.url} (against the {report.against})",
        f"  document: {report.spec_file}   vendor document: {vendor}",
        f"  model: {model_text(report)}   cases: {report.cases}   {report.seconds:.1f} s",
        f"  budget: {report.budget or f'{report.max_examples} examples per operation and phase'}",
        *([f"  auth: {report.auth}"] if report.auth else []),
        "",
        "features:" + (f" {report.features_note}" if report.features_note else ""),
    ]
    width = max((len(f.name) for f in report.features), default=0)
    for feature in report.features:
        seen = feature.detail if feature.probed else f"not probed: {feature.detail}"
        lines.append(f"  {feature.name:<{width}}  {feature.shown:<9}  {printable(seen, 160)}")
    lines += ["", "operations:"]
    width = max((len(label) for label in report.operations), default=10)
    for result in report.operations.values():
        lines.append(f"  {result.label:<{width}}  {result.cases:>5} cases  {operation_verdict(result)}")
        for finding in result.findings.values():
            status = f"HTTP {finding.status}" if finding.status is not None else "no answer"
            lines.append(f"    FAILED {finding.check} ({finding.count} failing): {finding.title}; {status}")
            if finding.message:
                lines.append(f"      {textwrap.shorten(' '.join(finding.message.split()), 300)}")
            if finding.body:
                lines.append(f"      body: {finding.body}")
            if finding.curl:
                lines.append(f"      {finding.curl}")
        for error in result.errors:
            lines.append(f"    ERROR {textwrap.shorten(error, 300)}")
    for error in report.errors:
        lines.append(f"  ERROR {textwrap.shorten(error, 300)}")
    if report.stopped:
        lines.append(f"  NOTE {report.stopped}")
    for label in report.not_served:
        lines.append(f"  NOTE not served, not tested: {label}")
    lines += ["", verdict_line(report)]
    return "\n".join(lines)


def junit(report: Report) -> str:
    """JUnit XML: one test case per feature and per operation; a failure per failing check."""
    suite = ET.Element("testsuite", name=xml_safe(f"chatgate conformance {report.dialect} {report.url}"))
    failures = 0
    for feature in report.features:
        case = ET.SubElement(suite, "testcase", classname="features", name=feature.name)
        if not feature.probed:
            ET.SubElement(case, "skipped", message=xml_safe(feature.detail))
        elif feature.failed:
            failures += 1
            ET.SubElement(
                case, "failure", message=xml_safe(f"{feature.verdict}: {feature.detail}")
            ).text = xml_safe(feature.detail)
    for result in report.operations.values():
        case = ET.SubElement(suite, "testcase", classname="operations", name=xml_safe(result.label))
        for finding in result.findings.values():
            failures += 1
            text = f"{finding.message}\nHTTP {finding.status}: {finding.body}\n{finding.curl}"
            message = f"{finding.check} ({finding.count} failing): {finding.title}"
            failure = ET.SubElement(case, "failure", message=xml_safe(message), type=xml_safe(finding.check))
            failure.text = xml_safe(text)
        for error in result.errors:
            ET.SubElement(case, "error", message=xml_safe(error[:300])).text = xml_safe(error)
    for error in report.errors:
        case = ET.SubElement(suite, "testcase", classname="run", name="run")
        ET.SubElement(case, "error", message=xml_safe(error[:300])).text = xml_safe(error)
    if report.untested:  # nothing failed, but not everything was tried: not a pass either
        failures += 1
        case = ET.SubElement(suite, "testcase", classname="run", name="tested")
        ET.SubElement(case, "failure", message=xml_safe(report.untested)).text = xml_safe(report.untested)
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("errors", str(len(report.all_errors)))
    suite.set("time", f"{report.seconds:.1f}")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def row_class(feature: Feature) -> str:
    return "na" if not feature.probed else "bad" if feature.failed else "good"


def html_page(report: Report) -> str:
    """A page with every fact the terminal report carries: the run (model, vendor document,
    budget, auth), the verdict, the feature matrix, each operation's cases and each finding with
    why it failed, the notes (the time budget, paths not served) and the errors."""
    e = html.escape
    rows = "".join(
        f'<tr class="{row_class(f)}"><td>{e(f.name)}</td><td>{e(f.shown)}</td><td>{e(f.detail)}</td></tr>'
        for f in report.features
    )
    features = f"<table><tr><th>feature</th><th>verdict</th><th>seen</th></tr>{rows}</table>" if rows else ""
    operations = "".join(
        f"<tr><td>{e(op.label)}</td><td>{op.cases}</td><td>{e(operation_verdict(op))}</td></tr>"
        for op in report.operations.values()
    )
    findings = "".join(
        f"<tr><td>{e(f.check)}</td><td>{e(f.operation)}</td><td>{f.count}</td><td>{f.status}</td>"
        f'<td>{e(f.title)}<p class="why">{e(f.message)}</p><code>{e(f.body)}</code>'
        f"<pre>{e(f.curl)}</pre></td></tr>"
        for f in report.findings
    )
    notes = [report.stopped] if report.stopped else []
    notes += [f"not served, not tested: {label}" for label in report.not_served]
    errors = "".join(f"<li>{e(error)}</li>" for error in report.all_errors)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>chatgate conformance: {e(report.url)}</title>
<style>body{{font-family:sans-serif}} td{{border:1px solid #ccc;padding:4px;vertical-align:top}}
table{{border-collapse:collapse}} .bad td:nth-child(2){{color:#a00}} .good td:nth-child(2){{color:#070}}
pre,.why{{white-space:pre-wrap;max-width:60em}}</style></head><body>
<h1>chatgate conformance</h1>
<p>{e(report.dialect)} dialect at <code>{e(report.url)}</code>, against the {e(report.against)};
model {e(model_text(report))}; {report.cases} cases in {report.seconds:.1f} s.</p>
<ul class="run"><li>document: {e(report.spec_file)}</li>
<li>vendor document: {e(report.vendor_note or "-")}</li>
<li>budget: {e(report.budget or f"{report.max_examples} examples per operation and phase")}</li>
{f"<li>auth: {e(report.auth)}</li>" if report.auth else ""}</ul>
<p><strong>{e(verdict_line(report))}</strong></p>
<h2>Features</h2>{f"<p>{e(report.features_note)}</p>" if report.features_note else ""}
{features}
<h2>Operations</h2>
{
        f"<table><tr><th>operation</th><th>cases</th><th>result</th></tr>{operations}</table>"
        if operations
        else "<p>no operation was tried</p>"
    }
<h2>Findings</h2>
{
        f"<table><tr><th>check</th><th>operation</th><th>cases</th><th>status</th><th>example</th></tr>{findings}</table>"
        if findings
        else '<p class="none">no findings</p>'
    }
{"<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>" if notes else ""}
{f"<h2>Errors</h2><ul>{errors}</ul>" if errors else ""}
</body></html>
"""


def operation_verdict(result: OperationResult) -> str:
    problems = len(result.findings) + len(result.errors)
    return "ok" if not problems else f"{problems} problem{'s' * (problems > 1)}"
