"""The settings in force and the files they came from: when the files change (or SIGHUP asks),
the settings they give now, or the reason they were refused.

Refused, the running settings stay, with two exceptions that keep a closed gateway closed: a
config that would open a gateway requiring keys is refused like a broken one, and a change to the
keys file is applied on its own while the config file is broken (a revocation takes effect
whatever state the config is in). A refused file is logged once per change, not at every look.

Both the worker processes and their supervisor keep one: a worker applies what it gives; the
supervisor hands its settings to a worker it starts in place of one that died, so a new worker
never serves the settings the gateway started with.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gateway.config.settings import Settings
from gateway.config.source import Source, refuse_opening
from gateway.core.options import ConfigError

SILENT = logging.getLogger("chatgate.config_watch.silent")
SILENT.addHandler(logging.NullHandler())
SILENT.propagate = False


class ConfigWatch:
    def __init__(
        self,
        settings: Settings,
        source: Source | None,
        log: logging.Logger | None,
        config_path: Path | None = None,
    ) -> None:
        """`log`: where refusals are said (None: nowhere, for a supervisor whose workers say it)."""
        self.settings = settings
        self.source = source  # the files the settings in force came from
        self.seen = source  # the files as last looked at (refused or not)
        self.config_path = config_path if config_path is not None or source is None else source.config_path
        self.log = log or SILENT

    def due(self) -> bool:
        """Whether the files differ from what was last looked at."""
        return self.seen is not None and self.seen.changed()

    def take(self, why: str) -> Settings | None:
        """Read the files now: the settings to apply, or None (refused, and said why)."""
        if self.config_path is None:
            self.log.warning("%s: no config file to reload (chatgate serve --config FILE)", why)
            return None
        running_keys = self.source.keys_path if self.source is not None else None
        source = Source.read(self.config_path, running_keys)
        self.seen = source
        try:
            settings = source.settings()
            refuse_opening(self.settings, settings)
        except ConfigError as error:
            return self.keys_alone(source, why, error)
        self.settings, self.source = settings, source
        return settings

    def keys_alone(self, source: Source, why: str, error: ConfigError) -> Settings | None:
        """The running config with the keys file as it is now, when only that can be used."""
        running = self.source
        if running is None or source.keys_path != running.keys_path or source.keys == running.keys:
            self.log.error("%s: reload refused, the running config stays: %s", why, error)
            return None
        combined = running.with_keys_of(source)
        try:
            settings = combined.settings()
            refuse_opening(self.settings, settings)
        except ConfigError as keys_error:
            self.log.error(
                "%s: reload refused, the running config and keys stay: %s; with the running config, "
                "the keys file is refused too: %s",
                why, error, keys_error,
            )  # fmt: skip
            return None
        self.log.error(
            "%s: the config is refused (%s); the keys file's change is applied with the running config",
            why, error,
        )  # fmt: skip
        self.settings, self.source = settings, combined
        return settings
