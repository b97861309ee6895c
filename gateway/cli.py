"""The `chatgate` command."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, NoReturn

import orjson
import typer
from pydantic import ValidationError

from gateway.config.settings import ConfigError, Key, Settings
from gateway.config.source import load_settings, load_source
from gateway.core.options import describe
from gateway.tools.terminal import terminal_safe

CONFIG_ENV = "CHATGATE_CONFIG"
cli = typer.Typer(help="chatgate: a spec-driven chat-completions gateway.", no_args_is_help=True)


@cli.callback()
def main_callback() -> None:
    """chatgate: a spec-driven chat-completions gateway."""


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
LOG_FORMATS = ("text", "json")
ConfigOption = Annotated[
    Path | None,
    typer.Option(envvar=CONFIG_ENV, help="YAML config file (default: every dialect on echo)."),
]


def fail(message: str) -> NoReturn:
    """One line on stderr and exit 2: how every start-up mistake ends."""
    typer.echo(f"chatgate: {message}", err=True)
    raise typer.Exit(2)


def settings_or_fail(config: Path | None) -> Settings:
    try:
        return load_settings(config)
    except ConfigError as error:
        fail(str(error))


@cli.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (overrides config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind (overrides config).")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes (share limits through Redis).")] = 1,
    log_level: Annotated[str, typer.Option(help=f"Log level: {', '.join(LOG_LEVELS)}.")] = "info",
    access_log: Annotated[bool, typer.Option(help="One JSON line per chat request on stdout.")] = True,
    log_format: Annotated[str, typer.Option(help="text, or json: one JSON object a log line.")] = "text",
) -> None:
    """Serve every configured dialect."""
    from gateway.server.serving import ServeOptions, StartupError
    from gateway.server.serving import serve as run

    if log_level.lower() not in LOG_LEVELS:
        fail(f"--log-level: {log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    if log_format not in LOG_FORMATS:
        fail(f"--log-format: {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    if workers < 1:
        fail(f"--workers: {workers} is not a number of processes (1 or more)")
    if port is not None and not 0 <= port <= 65535:
        fail(f"--port: {port} is not a port (0-65535)")
    source = None
    if config is None:
        settings = settings_or_fail(None)
    else:
        try:
            source, settings = load_source(config.resolve())
        except ConfigError as error:
            fail(str(error))
    options = ServeOptions(
        settings=settings,
        host=host or settings.server.host,
        port=settings.server.port if port is None else port,
        workers=workers,
        log_level=log_level.lower(),
        access_log=access_log,
        log_config=logging_config(log_level.lower(), log_format),
        config_path=config.resolve() if config is not None else None,
        source=source,
    )
    try:
        code = run(options)
    except StartupError as error:
        fail(str(error))
    raise typer.Exit(code)


def logging_config(level: str, log_format: str = "text") -> dict:
    """uvicorn's logging, plus the root logger at `level`; with `json`, every record a JSON line."""
    import uvicorn

    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"][""] = {"handlers": ["default"], "level": level.upper()}
    config["loggers"]["uvicorn"]["level"] = level.upper()
    if log_format == "json":
        for formatter in config["formatters"].values():
            formatter.clear()
            formatter["()"] = "gateway.telemetry.log_format.JSONFormatter"
    return config


config_cli = typer.Typer(help="Check a config file, or print the config's JSON Schema.", no_args_is_help=True)
cli.add_typer(config_cli, name="config")


@config_cli.command("check")
def config_check(file: Annotated[Path, typer.Argument(help="The YAML config file to check.")]) -> None:
    """Validate a config file as `chatgate serve` would, without serving: exit 0 when it is usable."""
    settings = settings_or_fail(file)
    from gateway.app import mounted_dialects, refuse_clashing_mounts

    try:
        refuse_clashing_mounts(mounted_dialects(settings))
    except ConfigError as error:
        fail(str(error))
    names = ", ".join(d.name for d in settings.deployments)
    typer.echo(
        f"{file}: ok ({len(settings.deployments)} deployment(s): {names}; {len(settings.keys)} key(s))"
    )


@config_cli.command("schema")
def config_schema() -> None:
    """Print the config's JSON Schema (for editors: yaml-language-server, VS Code, IntelliJ)."""
    from gateway.config.schema import config_json_schema

    typer.echo(orjson.dumps(config_json_schema(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())


keys_cli = typer.Typer(help="Manage API keys.", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")


KeysFile = Annotated[
    Path | None,
    typer.Option("--file", help="The keys file to edit (the config's keys_file); the gateway reloads it."),
]
ReadKeysFile = Annotated[
    Path | None, typer.Option("--file", help="The keys file to read (the config's keys_file).")
]


@keys_cli.command("new")
def keys_new(
    name: Annotated[str, typer.Argument(help="A name for the key (shows in logs and metrics).")],
    deployment: Annotated[
        list[str] | None, typer.Option(help="A deployment the key may use (repeat; default all).")
    ] = None,
    expires: Annotated[
        str | None, typer.Option(help="When the key stops working: 2026-12-31 or 2026-12-31T18:00:00Z (UTC).")
    ] = None,
    file: KeysFile = None,
) -> None:
    """Print a fresh key once; add its entry to the keys file, or print the entry to paste under
    `keys:` in the config."""
    from gateway.config import keys_file
    from gateway.policy.auth import new_key

    key, sha256 = new_key()
    entry: dict[str, object] = {"name": name, "sha256": sha256, "deployments": deployment or ["*"]}
    if expires is not None:
        entry["expires"] = expires
    try:
        Key.model_validate(entry)
    except ValidationError as error:
        fail(f"keys new: {describe(error)}")
    if file is not None:
        try:
            keys_file.add(file, entry)
        except ConfigError as error:
            fail(str(error))
    typer.echo(f"key (shown once, store it now): {key}")
    if file is not None:
        typer.echo(f"added {name!r} to {file}")
        return
    typer.echo("config entry:")
    typer.echo("  - " + orjson.dumps(entry).decode())


@keys_cli.command("revoke")
def keys_revoke(
    name: Annotated[str, typer.Argument(help="The key's name.")],
    file: KeysFile = None,
) -> None:
    """Take a key out of the keys file (a gateway watching it refuses the key within seconds)."""
    from gateway.config import keys_file

    if file is None:
        fail("keys revoke: --file is needed (keys written in the config are removed by editing it)")
    try:
        keys_file.revoke(file, name)
        left = len(keys_file.read(file))
    except ConfigError as error:
        fail(str(error))
    typer.echo(f"revoked {name!r} in {file}")
    if not left:
        typer.echo("that was its last key: a gateway using this file now refuses every request")


@keys_cli.command("list")
def keys_list(file: ReadKeysFile = None, config: ConfigOption = None) -> None:
    """The keys of a keys file, or of a config (with its keys file): names, deployments, expiry."""
    from gateway.config import keys_file

    if file is not None:
        try:
            entries = keys_file.read(file)
        except ConfigError as error:
            fail(str(error))
    else:
        entries = [k.model_dump(mode="json") for k in settings_or_fail(config).keys]
    for entry in entries:
        deployments = ",".join(entry.get("deployments") or ["*"])
        expires = entry.get("expires") or "never"
        typer.echo(f"{entry['name']}\tdeployments: {deployments}\texpires: {expires}")


@cli.command(short_help="Test a running endpoint against a dialect's document, feature by feature.")
def conformance(
    url: Annotated[
        str,
        typer.Argument(
            help="Base URL of the dialect's API, where its paths begin "
            "(chatgate: http://HOST:PORT/v1, /azure, /aleph-alpha, /lmi or /v3; or a real upstream)."
        ),
    ],
    dialect: Annotated[
        str | None,
        typer.Option(
            help="The document to test against and the probes sent: openai | azure | aleph_alpha | "
            "lmi | ovms (default: the one the endpoint serves at /openapi.json, else openai)."
        ),
    ] = None,
    max_examples: Annotated[int, typer.Option(min=1, help="Generated cases per operation and phase.")] = 20,
    key: Annotated[
        str | None,
        typer.Option(
            envvar="CHATGATE_KEY", help="A key, sent as `Authorization: Bearer` (env CHATGATE_KEY)."
        ),
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option(help="Another header for every request, 'Name: value' (repeat).")
    ] = None,
    extra_fields: Annotated[
        str,
        typer.Option(
            help="What to do with generated parameters the document does not define: strip them, "
            "or keep them and send them with `extra-parameters: pass-through` or `drop`."
        ),
    ] = "strip",
    seed: Annotated[int | None, typer.Option(help="Seed for the generated cases (a repeatable run).")] = None,
    refspecs: Annotated[
        Path | None,
        typer.Option(
            help="Folder of vendor documents (default: $CHATGATE_REFSPECS, "
            "else refspecs/ from scripts/fetch-refspecs)."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="The model every chat request names (default: the first the dialect's own listing "
            "names: /models, Aleph Alpha's /models_available, Azure's /info, Anthropic's /v1/models)."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds for each request's answer.")] = 30.0,
    max_time: Annotated[
        float | None, typer.Option(min=1, help="Seconds for the fuzzing as a whole (default: no limit).")
    ] = None,
    against: Annotated[
        str,
        typer.Option(
            help="What judges the answers: seed (the dialect's document, and the vendor's where "
            "found) or vendor (the vendor's current document alone, from refspecs)."
        ),
    ] = "seed",
    probes: Annotated[bool, typer.Option(help="Run the feature probes.")] = True,
    phases: Annotated[
        str,
        typer.Option(
            help="schemathesis' phases to run, comma-separated: examples, coverage (boundary "
            "values: most of the cases), fuzzing (random cases: --seed repeats them), stateful."
        ),
    ] = "examples,coverage,fuzzing,stateful",
    report_file: Annotated[
        Path | None, typer.Option("--report", help="Write the report as JSON (features, findings).")
    ] = None,
    junit_file: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML, for CI.")] = None,
    html_file: Annotated[
        Path | None, typer.Option("--html", help="Write a page with the feature matrix and findings.")
    ] = None,
) -> None:
    """Test a running endpoint: the feature probes (what it honours of n, logprobs, tools,
    response_format, stop, seed, max_tokens, streams, its error shape, auth), then every
    schemathesis check, past the first failure, plus the vendor's own document. Exits 0 when
    conformant, 1 when not (a run that did not probe the features, or sent no case, is not),
    2 when the run cannot be made."""
    import importlib.util

    if importlib.util.find_spec("schemathesis") is None:
        fail("chatgate conformance needs schemathesis: pip install 'chatgate[conformance]'")
    from gateway.tools.conformance import Budget, ConformanceUnavailable, render, run
    from gateway.tools.conformance_report import html_page, junit

    if (problem := url_problem(url)) is not None:
        fail(f"conformance: {url!r} is not a URL to test: {problem}")
    headers = {}
    for item in header or []:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            fail(f"conformance: --header {item!r} is not 'Name: value'")
        headers[name.strip()] = value.strip()
    try:
        report = run(
            url,
            dialect,
            max_examples,
            key=key,
            headers=headers,
            refspecs=refspecs,
            extra_fields=extra_fields,
            seed=seed,
            model=model,
            budget=Budget(timeout, max_time, tuple(p.strip() for p in phases.split(",") if p.strip())),
            against=against,
            probe_features=probes,
            progress=lambda line: typer.echo(terminal_safe(line), err=True),  # shows it goes on
        )
    except ConformanceUnavailable as error:
        typer.echo(terminal_safe(f"chatgate conformance: {error}"), err=True)
        raise typer.Exit(2) from None
    typer.echo(terminal_safe(render(report)))
    written = {report_file: lambda: orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode()}
    written |= {junit_file: lambda: junit(report), html_file: lambda: html_page(report)}
    for path, text in written.items():
        if path is not None:
            try:
                path.write_text(text() + "\n", encoding="utf-8")
            except OSError as error:
                fail(f"conformance: cannot write {path}: {error.strerror}")
    raise typer.Exit(0 if report.clean else 1)


@cli.command(short_help="Find out which features a server honours.")
def probe(
    url: Annotated[
        str,
        typer.Argument(
            help="Base URL of the server's API, where its paths begin (vLLM, llama.cpp: "
            "http://HOST:PORT/v1; chatgate: http://HOST:PORT/v1)."
        ),
    ],
    model: Annotated[str, typer.Option(help="The model name sent in every request.")],
    key: Annotated[
        str | None,
        typer.Option(
            envvar="CHATGATE_KEY", help="A key, sent as `Authorization: Bearer` (env CHATGATE_KEY)."
        ),
    ] = None,
    dialect: Annotated[
        str | None,
        typer.Option(
            help="The dialect the server speaks: openai | azure | aleph_alpha | lmi | ovms (default: "
            "the one the endpoint serves at /openapi.json, else openai)."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds for each probe request's answer.")] = 30.0,
    header: Annotated[
        list[str] | None, typer.Option(help="Another header for every request, 'Name: value' (repeat).")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="The findings as one JSON object.")] = False,
) -> None:
    """Find out which features a server honours (n, logprobs, tools, response_format, stop, seed,
    max_tokens, stream [DONE] and usage, its error shape, auth), with a few cheap requests in its
    dialect's shape. Each ends honoured, deviates, ignored, refused or broken; a feature the dialect does
    not have is not probed. Exits 0 when the probes ran, 2 when they cannot."""
    import asyncio

    from gateway.probes.findings import ProbeUnavailable
    from gateway.probes.runner import Target
    from gateway.probes.runner import probe as run
    from gateway.probes.sets import probe_set_of, probed_dialects
    from gateway.tools.conformance_target import dialect_of

    if (problem := url_problem(url)) is not None:
        fail(f"probe: {url!r} is not a URL to probe: {problem}")
    probed = dialect or dialect_of(url)
    probes = probe_set_of(probed)
    if probes is None:
        fail(f"probe: --dialect {probed!r} has no probes: one of {', '.join(probed_dialects())}")
    headers = {}
    for item in header or []:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            fail(f"probe: --header {item!r} is not 'Name: value'")
        headers[name.strip()] = value.strip()
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    target = Target(url.rstrip("/"), model, headers, timeout)
    try:
        report = asyncio.run(run(target, probes))
    except ProbeUnavailable as error:
        hint = " (give a key with --key)" if error.status in (401, 403) and key is None else ""
        fail(terminal_safe(f"probe: {error}{hint}"))
    if json_output:
        typer.echo(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        typer.echo(terminal_safe(report.render()))


def url_problem(url: str) -> str | None:
    """Why `url` is not an http(s) URL with a host (None: it is one)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError as error:
        return str(error)
    if parts.scheme not in ("http", "https"):
        return "it must begin with http:// or https://"
    if not parts.hostname or any(c.isspace() for c in url):
        return "it has no host name, or spaces in it"
    return None


def main() -> None:
    cli()
