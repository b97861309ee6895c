"""`chatgate conformance URL`: schemathesis with every check, plus the vendors' own documents,
against any running endpoint of a dialect — chatgate or a real upstream — with a readable
report. schemathesis is a test dependency, so it is imported only here, when the command runs.

The document tested is the dialect's own, from openapi/. Parameters a document does not define
are governed by the gateway's extra-parameters policy (OpenAI and Azure themselves refuse them
by default), so by default generated bodies carry only the parameters the document defines.
`--extra-fields pass-through` (or `drop`) keeps the undefined properties schemathesis generates
and sends them with that policy, to see how the endpoint treats what it does not define (any
type, any depth).

`--seed N` makes a run repeatable: the same cases in the same order (no example database
replaying an earlier run's failures), and every positive chat request that names no `seed` asks
for N, so a server that honours `seed` answers the same twice (the probes ask for greedy output).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.dialects.registry import DIALECTS
from gateway.dialects.rules import Rule, first_breach
from gateway.http.documents import DialectSpec, load_document, resolve
from gateway.tools.conformance_examples import KEY_HEADERS, record_failure
from gateway.tools.conformance_report import Report
from gateway.tools.conformance_report import render as render_lines
from gateway.tools.conformance_schema import for_schemathesis, register_json_lines
from gateway.tools.conformance_target import (
    ProbeFailed,
    asks_for_key,
    chat_path,
    declares_security,
    dialect_of,
    features_of,
    model_of,
    served_document,
    with_served_security,
    without_chatgate_headers,
    without_unserved,
)
from gateway.tools.vendor_specs import REFSPECS_HOW, VENDOR_DOCUMENTS, RefspecsError, VendorSpecs

VENDOR_CHECK = "vendor_spec_conformance"
RUN_EXTENSION = "x-chatgate-conformance"  # how the check learns the run's dialect: read off the document
SPEC_FILES = {name: dialect.document for name, dialect in DIALECTS.items()}
MISSING = "chatgate conformance needs schemathesis: pip install 'chatgate[conformance]'"


class ConformanceUnavailable(RuntimeError):
    """The run cannot start (schemathesis missing, the endpoint unreachable)."""


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


def positive(case: Any) -> bool:
    from schemathesis.generation import GenerationMode

    return case.meta is None or case.meta.generation.mode == GenerationMode.POSITIVE


def name_the_model(case: Any, model: str) -> None:
    """A positive case names `model` (in its body, or its path), the model the server serves."""
    if not positive(case):
        return
    if "model" in (case.path_parameters or {}):
        case.path_parameters = {**case.path_parameters, "model": model}
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = model


SEED_RANGE = 2**32  # every dialect's `seed` takes 0 … 2**32 - 1 (OVMS's is the narrowest)


def ask_for_the_seed(case: Any, seed: int) -> None:
    """A positive chat request that names no `seed` asks for the run's: a server that honours it
    then answers a repeated run the same (a sampled answer differs from run to run otherwise)."""
    if positive(case) and isinstance(case.body, dict) and "messages" in case.body:
        case.body.setdefault("seed", seed % SEED_RANGE)


def the_runs_model(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """A `before_call` hook: every phase's cases (examples and coverage too, which `map_case`
    does not see) name the run's --model and ask for its --seed, read off the document as the
    vendor check reads it."""
    settings = case.operation.schema.raw_schema.get(RUN_EXTENSION) or {}
    if settings.get("model"):
        name_the_model(case, settings["model"])
    if settings.get("seed") is not None and (case.operation.method.upper(), case.operation.path) in {
        tuple(operation) for operation in settings.get("seeded", [])
    }:
        ask_for_the_seed(case, settings["seed"])


_registered: list[bool] = []


def register_checks() -> None:
    """Register the vendor check and the model hook with schemathesis, once per process."""
    import schemathesis
    from schemathesis.checks import CHECKS

    if VENDOR_CHECK not in CHECKS.get_all_names():
        schemathesis.check(vendor_spec_conformance)
    if not _registered:
        schemathesis.hook("before_call")(the_runs_model)
        _registered.append(True)
    register_json_lines()


# ----- running --------------------------------------------------------------------------------


def defined_body_fields(document: dict[str, Any]) -> dict[tuple[str, str], frozenset[str]]:
    """(METHOD, path) → the top-level properties its JSON request body defines."""
    return {operation: frozenset(fields) for operation, fields in body_properties(document).items()}


def body_properties(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(METHOD, path) → the top-level properties of its JSON request body, with their schemas."""
    spec = DialectSpec(document, frozenset())
    fields = {}
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            if isinstance(operation, dict) and "requestBody" in operation:
                schema = spec.request_schema(operation["operationId"])
                fields[(method.upper(), path)] = dict(spec.properties(schema))
    return fields


def seeded_operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    """The operations whose body takes an integer `seed` (not one a dialect accepts and ignores)."""
    return [
        operation
        for operation, properties in body_properties(document).items()
        if isinstance(properties.get("seed"), dict)
        and resolve(document, properties["seed"]).get("type") == "integer"
    ]


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
    dialect: str,
    document: dict[str, Any],
    extra_fields: str = "strip",
    model: str | None = None,
    seed: int | None = None,
) -> Callable[[Any, Any], Any]:
    """A schemathesis `map_case` hook: bodies carry only the parameters the document defines (the
    rest is the extra-parameters policy's business) unless `extra_fields` keeps them; positive
    bodies follow the message order the document states in prose, and those that break one of
    its `x-chatgate-rules` are judged as the negative cases they are. With `model`, every
    positive case names that model (a server that serves only its own answers nothing else);
    with `seed`, every positive chat request that names no seed asks for it."""
    fields = defined_body_fields(document)
    seeded = frozenset(seeded_operations(document))
    shaping = DOCUMENTED_RULES.get(dialect)
    # each operation's bodies are judged by the rules its own body schema states
    rules = {
        (method.upper(), path): DialectSpec(document, frozenset({operation["operationId"]})).rules
        for path, item in document.get("paths", {}).items()
        for method, operation in item.items()
        if isinstance(operation, dict) and "requestBody" in operation and "operationId" in operation
    }

    def map_case(context: Any, case: Any) -> Any:
        is_positive = positive(case)
        defined = fields.get((case.operation.method.upper(), case.operation.path))
        if not defined or not isinstance(case.body, dict):
            return case
        if extra_fields == "strip":
            case.body = {k: v for k, v in case.body.items() if k in defined}
        else:
            case.headers = {**(case.headers or {}), "extra-parameters": extra_fields}
        if model is not None and "model" in defined:
            name_the_model(case, model)
        if shaping is not None and is_positive:
            case.body = shaping(case.body)
        if is_positive:
            judged_by_the_rules(case, rules.get((case.operation.method.upper(), case.operation.path), ()))
        if seed is not None and (case.operation.method.upper(), case.operation.path) in seeded:
            ask_for_the_seed(case, seed)
        return case

    return map_case


def load_schema(
    dialect: str,
    url: str,
    refspecs: Path | None,
    headers: dict[str, str],
    max_examples: int,
    extra_fields: str = "strip",
    seed: int | None = None,
    document: dict[str, Any] | None = None,
    budget: Budget | None = None,
    excluded_checks: tuple[str, ...] = (),
    model: str | None = None,
) -> Any:
    import schemathesis
    from schemathesis.config import SchemathesisConfig

    from gateway.tools.bounded_http import bound_schemathesis_reads

    bound_schemathesis_reads()
    document = for_schemathesis(document or load_document(SPEC_FILES[dialect]), "")
    vendor = VENDOR_DOCUMENTS.get(dialect)
    document[RUN_EXTENSION] = {
        "dialect": dialect,
        "refspecs": str(refspecs) if refspecs is not None and vendor is not None else None,
        "vendor_file": vendor.file if vendor is not None else None,
        "model": model,
        "seed": seed,
        "seeded": seeded_operations(document),
    }
    config = SchemathesisConfig()
    # Keys stay hidden in the report, but `max_tokens` and friends are not secrets.
    sanitization = config.output.sanitization
    sanitization.sensitive_markers = tuple(m for m in sanitization.sensitive_markers if m != "token")
    schema = schemathesis.openapi.from_dict(document, config=config)
    schema.config.update(base_url=url.rstrip("/"), headers=headers or None)
    budget = budget or Budget()
    # past the first failure of an operation: every case of the budget is tried
    schema.config.update(continue_on_failure=True, request_timeout=budget.timeout)
    if budget.max_time is not None:
        schema.config.max_time = max(1, round(budget.max_time))
    schema.config.phases.update(phases=list(budget.phases))
    schema.config.checks.update(
        included_check_names=["all"], excluded_check_names=list(excluded_checks) or None
    )
    # A valid request may ask for what the model cannot do (audio output, a custom tool): its
    # answer is the document's 422 "not supported by this model", not a refusal of the request.
    acceptance = schema.config.checks.positive_data_acceptance
    acceptance.expected_statuses = [*acceptance.expected_statuses, "422"]
    if seed is None:
        schema.config.generation.update(max_examples=max_examples, deterministic=True)
    else:  # no example database: a run replays none of an earlier run's failures
        schema.config.generation.update(max_examples=max_examples, database="none")
        schema.config.seed = seed
    schema.hook("map_case")(shape_cases(dialect, document, extra_fields, model, seed))
    return schema


AGAINST = ("seed", "vendor")


PHASES = ("examples", "coverage", "fuzzing", "stateful")  # schemathesis', in the order they run


@dataclass(frozen=True)
class Budget:
    """How much a run may try: seconds per request and for the fuzzing as a whole, and which of
    schemathesis' phases run."""

    timeout: float = 30.0
    max_time: float | None = None
    phases: tuple[str, ...] = PHASES


def run(
    url: str,
    dialect: str | None = None,
    max_examples: int = 20,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    refspecs: Path | None = None,
    progress: Callable[[str], None] | None = None,
    extra_fields: str = "strip",
    seed: int | None = None,
    model: str | None = None,
    budget: Budget | None = None,
    against: str = "seed",
    probe_features: bool = True,
) -> Report:
    """The feature probes, then every schemathesis check and the vendor check against `url`, the
    base of the dialect's API (where its paths begin: chatgate's /v1, /azure, /aleph-alpha,
    /lmi or /v3). `against`: the seed's contract (and the vendor's document where found), or
    the vendor's document alone judging the answers. `dialect`: the one whose document the
    endpoint serves when not given (chatgate serves each mount's), else OpenAI's."""
    try:
        from schemathesis.engine import Status, events, from_schema
    except ImportError as error:
        raise ConformanceUnavailable(MISSING) from error
    started = time.monotonic()
    budget = budget or Budget()
    if dialect is None:
        reachable(url)
        dialect = dialect_of(url)
    if dialect not in SPEC_FILES:
        raise ConformanceUnavailable(f"unknown dialect {dialect!r}; one of: {', '.join(SPEC_FILES)}")
    if extra_fields not in EXTRA_FIELDS:
        raise ConformanceUnavailable(f"--extra-fields {extra_fields!r}: one of {', '.join(EXTRA_FIELDS)}")
    if against not in AGAINST:
        raise ConformanceUnavailable(f"--against {against!r}: one of {', '.join(AGAINST)}")
    if not budget.phases or not set(budget.phases) <= set(PHASES):
        raise ConformanceUnavailable(f"--phases {','.join(budget.phases)!r}: some of {','.join(PHASES)}")
    reachable(url)
    register_checks()
    vendors = None
    vendor = VENDOR_DOCUMENTS.get(dialect)  # a dialect without one is held to its own document only
    if vendor is not None:
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
    if against == "vendor" and vendors is None:
        why = "this dialect has none" if vendor is None else REFSPECS_HOW
        raise ConformanceUnavailable(f"--against vendor needs the vendor's document: {why}")
    request_headers = dict(headers or {})
    if key:
        request_headers["Authorization"] = f"Bearer {key}"
    secrets = frozenset(v for k, v in request_headers.items() if k.lower() in KEY_HEADERS)
    document = load_document(SPEC_FILES[dialect])
    served = served_document(url, document)
    excluded = []
    not_served: list[str] = []
    if served is not None:
        document = with_served_security(document, served)
    else:
        document = without_chatgate_headers(document)
        document, not_served = without_unserved(url, document, request_headers, budget.timeout)
        if not key and not asks_for_key(url, chat_path(dialect, document), request_headers, budget.timeout):
            excluded.append("ignored_auth")  # an open server: nothing to hold it to
            document = with_served_security(document, {})  # and no made-up keys sent
    if against == "vendor":
        excluded += ["response_schema_conformance", "response_headers_conformance"]
    report = Report(
        dialect=dialect,
        url=url,
        spec_file=f"openapi/{SPEC_FILES[dialect]}",
        vendor_file=vendor.file if vendors and vendor else None,
        max_examples=max_examples,
        auth=auth_line(served, document, key_sent=bool(key), open_server="ignored_auth" in excluded),
        key_sent=bool(key),
        against=against,
        model=model,
        model_said="--model" if model else "",
        not_served=not_served,
        vendor_note=vendor_note(dialect, vendor.file if vendors and vendor else None),
        budget=budget_line(max_examples, budget),
    )
    said: set[str] = set()

    def say(line: str) -> None:  # each progress line once (the stateful phase repeats its own)
        if progress is not None and line not in said:
            said.add(line)
            progress(line)

    report.features_note = "not probed (--no-probes)"
    report.not_tested = "--no-probes was given"
    if probe_features:
        found = model_of(url, dialect, request_headers, budget.timeout, model)
        report.model, report.model_said = found.name, found.said
        if found.usable:
            named = f"model {found.name}" if found.name else "no model named"
            say(f"  probing the features ({named}: {found.said})")
        else:
            say(f"  not probing the features: {found.said}")
        try:
            report.features, report.features_note = features_of(
                url, dialect, found, request_headers, budget.timeout
            )
            report.not_tested = report.features_note.removeprefix("not probed: ")
        except ProbeFailed as error:
            report.features_note = f"not probed: {error}"
            report.errors.append(f"feature probes: {error}")
            report.not_tested = str(error)
    schema = load_schema(
        dialect,
        url,
        vendors.refspecs_dir if vendors else None,
        request_headers,
        max_examples,
        extra_fields,
        seed,
        document,
        budget,
        tuple(excluded),
        model or report.model,
    )
    say("  fuzzing (schemathesis, every check, past the first failure)")
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            result = report.operation(recorder.label)
            result.cases += len(recorder.cases)
            for interaction in recorder.interactions.values():
                if interaction.response is not None:
                    result.answers += 1
                    result.unauthorized += interaction.response.status_code == 401 and carried(
                        interaction.request, secrets
                    )
            for case_id, checks in recorder.checks.items():
                failed = {
                    check.name: check.failure_info
                    for check in checks
                    if check.status == Status.FAILURE and check.failure_info is not None
                }
                for name, info in failed.items():
                    record_failure(result, name, info, recorder.interactions.get(case_id), secrets)
            say(f"  {event.phase.value:<9} {recorder.label}: {event.status.value}")
        elif isinstance(event, events.NonFatalError):
            target = report.operation(event.label).errors if event.related_to_operation else report.errors
            message = f"{event.label}: {type(event.value).__name__}: {event.value}"
            if message not in target:
                target.append(message)
        elif isinstance(event, events.EngineFinished) and event.stop_reason == "max_time":
            report.stopped = (
                f"the fuzzing stopped at --max-time ({budget.max_time:g} s): not every case was tried"
            )
        elif isinstance(event, events.FatalError):
            report.errors.append(f"{type(event.exception).__name__}: {event.exception}")
    report.seconds = time.monotonic() - started
    return report


def carried(request: Any, secrets: frozenset[str]) -> bool:
    """Whether a request carried the run's key (every request does when none was given): the
    keyless requests of the key check (ignored_auth) are answered 401 by design, and are not a
    sign that the key was refused."""
    if not secrets:
        return True
    headers = getattr(request, "headers", None) or {}
    sent = [
        v
        for k, vs in headers.items()
        if k.lower() in KEY_HEADERS
        for v in ([vs] if isinstance(vs, str) else vs)
    ]
    return any(value in secrets for value in sent)


def auth_line(
    served: dict[str, Any] | None, document: dict[str, Any], key_sent: bool, open_server: bool = False
) -> str:
    if open_server:
        return "the server answers without a key and none was given: keys not checked"
    if served is not None and not declares_security(document):
        return "none declared by the endpoint's own document (keys are not enforced there): not checked"
    sent = "a key is sent (--key)" if key_sent else "no key is sent (give one with --key)"
    where = "the endpoint's own document" if served is not None else "the document"
    return f"{where} declares keys; {sent}"


def reachable(url: str) -> None:
    import httpx

    from gateway.tools.bounded_http import Unread, bounded

    try:
        bounded("GET", url, seconds=5)
    except Unread:
        return  # it answers, at length
    except httpx.HTTPError as error:
        raise ConformanceUnavailable(f"cannot reach {url}: {error}") from None


# ----- the report -----------------------------------------------------------------------------


def vendor_note(dialect: str, vendor_file: str | None) -> str:
    """Which vendor document judged the answers, or why none did."""
    if vendor_file:
        return vendor_file
    if dialect in VENDOR_DOCUMENTS:
        return f"not found, so not checked: {REFSPECS_HOW}, or pass --refspecs DIR"
    return "none (no machine-readable vendor document for this dialect)"


def budget_line(max_examples: int, budget: Budget) -> str:
    limit = f"--max-time {budget.max_time:g} s" if budget.max_time is not None else "no --max-time"
    return (
        f"{max_examples} examples per operation and phase; {budget.timeout:g} s a request; {limit}; "
        f"phases {','.join(budget.phases)}"
    )


def render(report: Report) -> str:
    return render_lines(report, report.vendor_note or vendor_note(report.dialect, report.vendor_file))
