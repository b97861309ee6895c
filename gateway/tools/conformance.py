"""`chatgate conformance URL`: schemathesis with every check, plus the vendors' own documents,
against any running endpoint of a dialect — chatgate or a real upstream — with a readable
report. schemathesis is a test dependency, so it is imported only here, when the command runs.

The document tested is the dialect's own, from openapi/. Parameters a document does not define
are governed by the gateway's extra-parameters policy (OpenAI and Azure themselves refuse them
by default), so by default generated bodies carry only the parameters the document defines.
`--extra-fields pass-through` (or `drop`) keeps the undefined properties schemathesis generates
and sends them with that policy, to see how the endpoint treats what it does not define (any
type, any depth); `--seed` makes a run repeatable.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.dialects import DIALECTS
from gateway.dialects.rules import Rule, first_breach
from gateway.spec import DialectSpec, load_document
from gateway.tools.conformance_schema import for_schemathesis, register_json_lines
from gateway.tools.vendor_specs import REFSPECS_HOW, VENDOR_DOCUMENTS, RefspecsError, VendorSpecs

VENDOR_CHECK = "vendor_spec_conformance"
RUN_EXTENSION = "x-chatgate-conformance"  # how the check learns the run's dialect: read off the document
SPEC_FILES = {name: dialect.document for name, dialect in DIALECTS.items()}
MISSING = (
    "chatgate conformance needs schemathesis, a test dependency: "
    'python -m pip install -e ".[test]"  (or: python -m pip install schemathesis)'
)


class ConformanceUnavailable(RuntimeError):
    """The run cannot start (schemathesis missing, the endpoint unreachable)."""


@dataclass
class Finding:
    check: str
    title: str
    message: str
    curl: str


@dataclass
class OperationResult:
    label: str
    cases: int = 0
    findings: dict[tuple[str, str], Finding] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    answers: int = 0  # responses recorded
    unauthorized: int = 0  # of them 401


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

    def operation(self, label: str) -> OperationResult:
        return self.operations.setdefault(label, OperationResult(label))

    @property
    def findings(self) -> list[tuple[str, Finding]]:
        return [(op.label, f) for op in self.operations.values() for f in op.findings.values()]

    @property
    def answers(self) -> int:
        return sum(op.answers for op in self.operations.values())

    @property
    def unauthorized(self) -> int:
        return sum(op.unauthorized for op in self.operations.values())

    @property
    def locked_out(self) -> bool:
        """Most answers were 401: the run tested the endpoint's key check, not its document (a
        schema check has nothing to say of a 401 body, so such a run would otherwise look clean)."""
        return self.answers > 0 and self.unauthorized * 2 > self.answers

    @property
    def clean(self) -> bool:
        problems = self.findings or self.errors or any(op.errors for op in self.operations.values())
        return not problems and not self.locked_out


# ----- the vendor check -----------------------------------------------------------------------

_vendors: dict[str, VendorSpecs] = {}  # refspecs folder → its documents, loaded once per process


def vendor_spec_conformance(ctx: Any, response: Any, case: Any) -> bool | None:
    """The answer is valid for the vendor's own document (the refspecs), where it has one."""
    settings = case.operation.schema.raw_schema.get(RUN_EXTENSION)
    if not settings or settings.get("refspecs") is None:
        return None  # not a chatgate conformance run, or no vendor documents
    vendors = _vendors.setdefault(settings["refspecs"], VendorSpecs(Path(settings["refspecs"])))
    media_type = (response.headers.get("content-type") or [""])[0].split(";")[0].strip()
    complete = not getattr(response, "stream_cut_short", False) and response.content_size <= len(
        response.content
    )
    errors = vendors.answer_errors(
        settings["dialect"],
        case.operation.method,
        case.operation.path,
        response.status_code,
        media_type,
        response.content,
        complete,
    )
    if errors:
        shown = "\n".join(errors[:5]) + (f"\n… and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise AssertionError(f"The answer breaks {settings['vendor_file']}:\n{shown}")
    return True


def register_checks() -> None:
    """Register the vendor check with schemathesis, once per process."""
    import schemathesis
    from schemathesis.checks import CHECKS

    if VENDOR_CHECK not in CHECKS.get_all_names():
        schemathesis.check(vendor_spec_conformance)
    register_json_lines()


# ----- running --------------------------------------------------------------------------------


def defined_body_fields(document: dict[str, Any]) -> dict[tuple[str, str], frozenset[str]]:
    """(METHOD, path) → the top-level properties its JSON request body defines."""
    spec = DialectSpec(document, frozenset())
    fields = {}
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            if isinstance(operation, dict) and "requestBody" in operation:
                schema = spec.request_schema(operation["operationId"])
                fields[(method.upper(), path)] = frozenset(spec.properties(schema))
    return fields


# A rule a dialect's document states in prose that no schema can say, and that generated
# positive bodies are shaped to keep (it is about the conversation, not about a parameter).
Body = dict[str, Any]


def aleph_alpha_message_order(body: Body) -> Body:
    """One optional system message first, then user/assistant alternating, first and last user."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return body
    head = messages[:1] if messages[0].get("role") == "system" and len(messages) > 1 else []
    turns = [{**m, "role": "assistant" if i % 2 else "user"} for i, m in enumerate(messages[len(head) :])]
    if len(turns) % 2 == 0:
        turns = turns[:-1]  # end with a user message
    return {**body, "messages": head + turns}


DOCUMENTED_RULES: dict[str, Callable[[Body], Body]] = {
    "aleph_alpha": aleph_alpha_message_order,
}


def breaks_a_rule(rules: tuple[Rule, ...], body: Body) -> bool:
    return first_breach(rules, body) is not None


def judged_by_the_rules(case: Any, rules: tuple[Rule, ...]) -> None:
    """A generated body that breaks a rule of the document's `x-chatgate-rules` is invalid by
    the document: the case becomes a negative one, which the endpoint must refuse
    (negative_data_rejection), instead of being reshaped to avoid the rule."""
    from schemathesis.core.parameters import ParameterLocation
    from schemathesis.generation import GenerationMode

    if case.meta is None or not isinstance(case.body, dict) or not breaks_a_rule(rules, case.body):
        return
    case.meta.generation.mode = GenerationMode.NEGATIVE
    body = case.meta.components.get(ParameterLocation.BODY)
    if body is not None:
        body.mode = GenerationMode.NEGATIVE


EXTRA_FIELDS = ("strip", "pass-through", "drop")


def shape_cases(
    dialect: str, document: dict[str, Any], extra_fields: str = "strip"
) -> Callable[[Any, Any], Any]:
    """A schemathesis `map_case` hook: bodies carry only the parameters the document defines (the
    rest is the extra-parameters policy's business) unless `extra_fields` keeps them; positive
    bodies follow the message order the document states in prose, and those that break one of
    its `x-chatgate-rules` are judged as the negative cases they are."""
    from schemathesis.generation import GenerationMode

    fields = defined_body_fields(document)
    shaping = DOCUMENTED_RULES.get(dialect)
    chat = frozenset(DIALECTS[dialect].chat_operations) if dialect in DIALECTS else frozenset()
    rules = DialectSpec(document, chat).rules

    def map_case(context: Any, case: Any) -> Any:
        defined = fields.get((case.operation.method.upper(), case.operation.path))
        if not defined or not isinstance(case.body, dict):
            return case
        if extra_fields == "strip":
            case.body = {k: v for k, v in case.body.items() if k in defined}
        else:
            case.headers = {**(case.headers or {}), "extra-parameters": extra_fields}
        positive = case.meta is None or case.meta.generation.mode == GenerationMode.POSITIVE
        if shaping is not None and positive:
            case.body = shaping(case.body)
        if positive:
            judged_by_the_rules(case, rules)
        return case

    return map_case


def served_document(url: str, document: dict[str, Any]) -> dict[str, Any] | None:
    """The dialect's document as the endpoint serves it (`<url>/openapi.json`, as chatgate does),
    when it serves this one; None otherwise (a real upstream serves none)."""
    import httpx

    try:
        response = httpx.get(url.rstrip("/") + "/openapi.json", timeout=10)
        served = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    same = isinstance(served, dict) and served.get("info", {}).get("title") == document["info"]["title"]
    return served if same else None


def with_served_security(document: dict[str, Any], served: dict[str, Any]) -> dict[str, Any]:
    """The document with the security the endpoint declares for itself: a gateway with no keys
    serves its document without `security`, and is tested as the open endpoint it is."""
    document = dict(document)
    document.pop("security", None)
    if "security" in served:
        document["security"] = served["security"]
    paths = {}
    for path, item in document.get("paths", {}).items():
        paths[path] = dict(item)
        for method, operation in item.items():
            if isinstance(operation, dict) and "security" in operation:
                served_operation = served.get("paths", {}).get(path, {}).get(method, {})
                operation = {k: v for k, v in operation.items() if k != "security"}
                if "security" in served_operation:
                    operation["security"] = served_operation["security"]
                paths[path][method] = operation
    document["paths"] = paths
    return document


def declares_security(document: dict[str, Any]) -> bool:
    operations = [
        op for item in document.get("paths", {}).values() for op in item.values() if isinstance(op, dict)
    ]
    return bool(document.get("security")) or any(op.get("security") for op in operations)


def load_schema(
    dialect: str,
    url: str,
    refspecs: Path | None,
    headers: dict[str, str],
    max_examples: int,
    extra_fields: str = "strip",
    seed: int | None = None,
    document: dict[str, Any] | None = None,
) -> Any:
    import schemathesis
    from schemathesis.config import SchemathesisConfig

    document = for_schemathesis(document or load_document(SPEC_FILES[dialect]), "")
    vendor = VENDOR_DOCUMENTS.get(dialect)
    document[RUN_EXTENSION] = {
        "dialect": dialect,
        "refspecs": str(refspecs) if refspecs is not None and vendor is not None else None,
        "vendor_file": vendor.file if vendor is not None else None,
    }
    config = SchemathesisConfig()
    # Keys stay hidden in the report, but `max_tokens` and friends are not secrets.
    sanitization = config.output.sanitization
    sanitization.sensitive_markers = tuple(m for m in sanitization.sensitive_markers if m != "token")
    schema = schemathesis.openapi.from_dict(document, config=config)
    schema.config.update(base_url=url.rstrip("/"), headers=headers or None)
    schema.config.checks.update(included_check_names=["all"])
    # A valid request may ask for what the model cannot do (audio output, a custom tool): its
    # answer is the document's 422 "not supported by this model", not a refusal of the request.
    acceptance = schema.config.checks.positive_data_acceptance
    acceptance.expected_statuses = [*acceptance.expected_statuses, "422"]
    if seed is None:
        schema.config.generation.update(max_examples=max_examples, deterministic=True)
    else:
        schema.config.generation.update(max_examples=max_examples)
        schema.config.seed = seed
    schema.hook("map_case")(shape_cases(dialect, document, extra_fields))
    return schema


def run(
    url: str,
    dialect: str = "openai",
    max_examples: int = 20,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    refspecs: Path | None = None,
    progress: Callable[[str], None] | None = None,
    extra_fields: str = "strip",
    seed: int | None = None,
) -> Report:
    """Run every schemathesis check and the vendor check against `url`, the base of the dialect's
    API (where its paths begin: chatgate's /v1, /azure, /aleph-alpha, /lmi or /v3)."""
    try:
        from schemathesis.engine import Status, events, from_schema
    except ImportError as error:
        raise ConformanceUnavailable(MISSING) from error
    if dialect not in SPEC_FILES:
        raise ConformanceUnavailable(f"unknown dialect {dialect!r}; one of: {', '.join(SPEC_FILES)}")
    if extra_fields not in EXTRA_FIELDS:
        raise ConformanceUnavailable(f"--extra-fields {extra_fields!r}: one of {', '.join(EXTRA_FIELDS)}")
    reachable(url)
    register_checks()
    vendors = None
    if dialect in VENDOR_DOCUMENTS:
        try:
            vendors = VendorSpecs.find(refspecs)
        except RefspecsError as error:
            raise ConformanceUnavailable(f"vendor documents: {error}") from None
        missing = vendors.missing(dialect) if vendors is not None else None
        if vendors is not None and missing is not None:
            raise ConformanceUnavailable(
                f"vendor documents: {vendors.refspecs_dir} has no {missing} "
                "(scripts/fetch-refspecs --dest DIR writes every one)"
            )
    request_headers = dict(headers or {})
    if key:
        request_headers["Authorization"] = f"Bearer {key}"
    document = load_document(SPEC_FILES[dialect])
    served = served_document(url, document)
    if served is not None:
        document = with_served_security(document, served)
    schema = load_schema(
        dialect,
        url,
        vendors.refspecs_dir if vendors else None,
        request_headers,
        max_examples,
        extra_fields,
        seed,
        document,
    )
    report = Report(
        dialect=dialect,
        url=url,
        spec_file=f"openapi/{SPEC_FILES[dialect]}",
        vendor_file=VENDOR_DOCUMENTS[dialect].file if vendors else None,
        max_examples=max_examples,
        auth=auth_line(served, document, key_sent=bool(key)),
        key_sent=bool(key),
    )
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            result = report.operation(recorder.label)
            result.cases += len(recorder.cases)
            for interaction in recorder.interactions.values():
                if interaction.response is not None:
                    result.answers += 1
                    result.unauthorized += interaction.response.status_code == 401
            for checks in recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failure = check.failure_info.failure
                        result.findings.setdefault(
                            (check.name, failure.title),
                            Finding(check.name, failure.title, str(failure.message or ""),
                                    check.failure_info.code_sample),
                        )  # fmt: skip
            if progress is not None:
                progress(f"  {event.phase.value:<9} {recorder.label}: {event.status.value}")
        elif isinstance(event, events.NonFatalError):
            target = report.operation(event.label).errors if event.related_to_operation else report.errors
            message = f"{event.label}: {type(event.value).__name__}: {event.value}"
            if message not in target:
                target.append(message)
        elif isinstance(event, events.FatalError):
            report.errors.append(f"{type(event.exception).__name__}: {event.exception}")
    return report


def auth_line(served: dict[str, Any] | None, document: dict[str, Any], key_sent: bool) -> str:
    if served is not None and not declares_security(document):
        return "none declared by the endpoint's own document (keys are not enforced there): not checked"
    sent = "a key is sent (--key)" if key_sent else "no key is sent (give one with --key)"
    where = "the endpoint's own document" if served is not None else "the document"
    return f"{where} declares keys; {sent}"


def reachable(url: str) -> None:
    import httpx

    try:
        httpx.get(url, timeout=5)
    except httpx.HTTPError as error:
        raise ConformanceUnavailable(f"cannot reach {url}: {error}") from None


# ----- the report -----------------------------------------------------------------------------


def render(report: Report) -> str:
    if report.vendor_file:
        vendor = report.vendor_file
    elif report.dialect in VENDOR_DOCUMENTS:
        vendor = f"not found, so not checked: {REFSPECS_HOW}, or pass --refspecs DIR"
    else:
        vendor = "none (no machine-readable vendor document for this dialect)"
    lines = [
        f"chatgate conformance: {report.dialect} dialect at {report.url}",
        f"  document: {report.spec_file}   vendor document: {vendor}",
        f"  checks: every schemathesis check + {VENDOR_CHECK}   max examples: {report.max_examples}",
        *([f"  auth: {report.auth}"] if report.auth else []),
        "",
    ]
    width = max((len(label) for label in report.operations), default=10)
    for result in report.operations.values():
        problems = len(result.findings) + len(result.errors)
        verdict = "ok" if not problems else f"{problems} problem{'s' * (problems > 1)}"
        lines.append(f"  {result.label:<{width}}  {result.cases:>5} cases  {verdict}")
        for finding in result.findings.values():
            lines.append(f"    FAILED {finding.check}: {finding.title}")
            message = textwrap.shorten(" ".join(finding.message.split()), 300) if finding.message else ""
            if message:
                lines.append(f"      {message}")
            for curl in finding.curl.strip().splitlines():
                lines.append(f"      {curl.strip()}")
        for error in result.errors:
            lines.append(f"    ERROR {textwrap.shorten(error, 300)}")
    for error in report.errors:
        lines.append(f"  ERROR {textwrap.shorten(error, 300)}")
    lines.append("")
    if report.locked_out:
        why = "the key was refused" if report.key_sent else "the endpoint needs a key: pass --key KEY"
        lines.append(
            f"result: NOT conformant — not tested: {report.unauthorized} of {report.answers} answers "
            f"were 401 Unauthorized ({why}); the document's checks ran on almost nothing but the key check"
        )
    elif report.clean:
        lines.append("result: conformant — no failures")
    else:
        named = sorted({f"{f.check} on {label}" for label, f in report.findings})
        errors = len(report.errors) + sum(len(op.errors) for op in report.operations.values())
        summary = f"{len(report.findings)} failure(s)"
        if errors:
            summary += f", {errors} error(s)"
        lines.append(f"result: NOT conformant — {summary}: {'; '.join(named) or 'see errors above'}")
    return "\n".join(lines)
