"""The `chatgate` command."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated

import typer

from gateway.config import ConfigError, load_settings

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
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
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
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["loggers"][""] = {"handlers": ["default"], "level": log_level.upper()}
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
    )


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


def main() -> None:
    cli()
