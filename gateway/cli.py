"""The `chatgate` command."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from gateway.access_log import ENV as ACCESS_LOG_ENV
from gateway.config import ConfigError, load_settings
from gateway.metrics import MULTIPROC_ENV

CONFIG_ENV = "CHATGATE_CONFIG"
cli = typer.Typer(help="chatgate: a spec-driven chat-completions gateway.", no_args_is_help=True)


@cli.callback()
def main_callback() -> None:
    """chatgate: a spec-driven chat-completions gateway."""


@cli.command()
def serve(
    config: Annotated[
        Path | None, typer.Option(help="YAML config file (default: every dialect on echo).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (overrides config).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind (overrides config).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes (share limits through Redis).")] = 1,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "info",
    access_log: Annotated[bool, typer.Option(help="One JSON line per chat request on stdout.")] = True,
) -> None:
    """Serve every configured dialect."""
    import uvicorn

    try:
        settings = load_settings(config)
    except ConfigError as error:
        typer.echo(f"chatgate: {error}", err=True)
        raise typer.Exit(2) from None
    if config is not None:
        os.environ[CONFIG_ENV] = str(config.resolve())
    if workers > 1 and not os.environ.get(MULTIPROC_ENV):
        # prometheus_client aggregates the workers' metrics through files in this folder
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="chatgate-metrics-")
    os.environ[ACCESS_LOG_ENV] = "1" if access_log else "0"  # read by each worker's app
    log_config = logging_config(log_level)
    uvicorn.run(
        "gateway.asgi:create",
        log_config=log_config,
        factory=True,
        host=host or settings.server.host,
        port=settings.server.port if port is None else port,
        log_level=log_level,
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        workers=workers,
    )


def logging_config(level: str) -> dict:
    """uvicorn's logging, plus the root logger at `level`."""
    import uvicorn

    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"][""] = {"handlers": ["default"], "level": level.upper()}
    return config


keys_cli = typer.Typer(help="Manage API keys.", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")


@keys_cli.command("new")
def keys_new(
    name: Annotated[str, typer.Argument(help="A name for the key (shows in logs and metrics).")],
    deployment: Annotated[
        list[str] | None, typer.Option(help="A deployment the key may use (repeat; default all).")
    ] = None,
) -> None:
    """Print a fresh key once, and the entry to paste under `keys:` in the config."""
    from gateway.policy.auth import new_key

    key, sha256 = new_key()
    deployments = ", ".join(f'"{d}"' for d in deployment) if deployment else '"*"'
    typer.echo(f"key (shown once, store it now): {key}")
    typer.echo("config entry:")
    typer.echo(f'  - {{name: "{name}", sha256: "{sha256}", deployments: [{deployments}]}}')


@cli.command()
def conformance(
    url: Annotated[
        str,
        typer.Argument(
            help="Base URL of the dialect's API, where its paths begin "
            "(chatgate: http://HOST:PORT/v1, /azure, /aleph-alpha, /lmi or /v3; or a real upstream)."
        ),
    ],
    dialect: Annotated[
        str, typer.Option(help="The document to test against: openai | azure | aleph_alpha | lmi | ovms.")
    ] = "openai",
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
    refspecs: Annotated[
        Path | None,
        typer.Option(help="Folder of vendor documents (default: $CHATGATE_REFSPECS, else shared/refspecs)."),
    ] = None,
) -> None:
    """Test a running endpoint against a dialect's document: every schemathesis check, plus the
    vendor's own document. Exits 0 when clean, 1 on any failure, 2 when it cannot run."""
    from gateway.conformance_run import ConformanceUnavailable, render, run

    headers = {}
    for item in header or []:
        name, _, value = item.partition(":")
        headers[name.strip()] = value.strip()
    try:
        report = run(url, dialect, max_examples, key=key, headers=headers, refspecs=refspecs)
    except ConformanceUnavailable as error:
        typer.echo(f"chatgate conformance: {error}", err=True)
        raise typer.Exit(2) from None
    typer.echo(render(report))
    raise typer.Exit(0 if report.clean else 1)


def main() -> None:
    cli()
