"""Where settings come from: the config file and the keys file it names, read once.

What is validated is exactly what was read: a `Source` holds the bytes of both files, the
watcher compares the files' current bytes with them, and a reload validates those bytes, never a
second read. (Comparing modification times around a reload missed a file that was written while
it was being read: the empty half-written file was loaded, the full one's time recorded.)

A file that is not a whole config is refused rather than read as the defaults: an empty file, a
section left empty (`deployments:` with nothing after it — a file cut short), a keys file with
no content at all (an empty list of keys is written `[]`), a mapping key given twice.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from gateway.config.environment import CONFIG, Environment
from gateway.config.settings import Settings, check_backends, expand_references
from gateway.core.options import ConfigError, describe

log = logging.getLogger("chatgate")

if TYPE_CHECKING:
    SafeLoader = yaml.SafeLoader
else:  # libyaml's parser where PyYAML has it (its wheels do), else the pure one
    SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class UniqueKeyLoader(SafeLoader):
    """YAML's safe loader (libyaml's parser, which PyYAML's wheels carry: a keys file of 20,000
    keys reads four times as fast), refusing a mapping that gives one key twice (PyYAML keeps
    the last in silence: a second, empty `keys:` would drop every key above it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (lines {seen[key]} and {line})", key_node.start_mark
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(data: bytes, path: Path, what: str) -> Any:
    try:
        return yaml.load(data.decode("utf-8"), Loader=UniqueKeyLoader)
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not UTF-8 text") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{what} {path} is not valid YAML{at}: {problem}") from None


def read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None


def current_bytes(path: Path) -> bytes | None:
    """The file's bytes now, None when it cannot be read (the watcher's view: a file that is
    gone or unreadable differs from any content)."""
    try:
        return path.read_bytes()
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class Source:
    """The config file and its keys file as they were read."""

    config_path: Path
    config: bytes | None  # None: it could not be read
    keys_path: Path | None = None
    keys: bytes | None = None

    @classmethod
    def read(cls, config_path: Path, keys_path: Path | None = None) -> Source:
        """Both files now. `keys_path`: the keys file to read when the config names none that can
        be found (it is unreadable or invalid), so that a change to the keys alone is still seen."""
        config = current_bytes(config_path)
        named = keys_file_named(config, config_path)
        keys_path = named or keys_path
        return cls(config_path, config, keys_path, current_bytes(keys_path) if keys_path else None)

    def changed(self) -> bool:
        """Whether either file's bytes differ from these now."""
        if current_bytes(self.config_path) != self.config:
            return True
        return self.keys_path is not None and current_bytes(self.keys_path) != self.keys

    def with_keys_of(self, other: Source) -> Source:
        """This config with the other's keys file (the keys reload on their own)."""
        return replace(self, keys=other.keys) if self.keys_path == other.keys_path else self

    def settings(self, environ: Mapping[str, str] | None = None) -> Settings:
        """These bytes as settings, fully validated (ConfigError says what is wrong)."""
        path = self.config_path
        if self.config is None:
            read_bytes(path, "config")  # raises with the reason
        raw = parse_yaml(self.config or b"", path, "config")
        if raw is None:
            raise ConfigError(f"config {path} is empty (a file being written?); it was not used")
        if not isinstance(raw, dict):
            raise ConfigError(f"config {path}: the top level must be a mapping")
        empty = [name for name, value in raw.items() if value is None]
        if empty:
            raise ConfigError(
                f"config {path}: {', '.join(map(str, empty))} has no value (a file cut short?); "
                "leave a section out for its default"
            )
        try:
            environ = os.environ if environ is None else environ
            raw = expand_references(raw, environ)
            if raw.get("keys_file"):
                raw = {**raw, "keys": [*(raw.get("keys") or []), *self.keys_of_file(Path(raw["keys_file"]))]}
            settings = Settings.model_validate(raw).in_environment(Environment.from_environ(environ))
            check_backends(settings)
        except ValidationError as error:
            raise ConfigError(f"invalid config {path}: {describe(error)}") from None
        except ConfigError as error:
            raise ConfigError(f"invalid config {path}: {error}") from None
        return settings

    def keys_of_file(self, named: Path) -> list[Any]:
        if (why := loose(named)) is not None:
            log.warning("%s", why)
        data = self.keys if named == self.keys_path else current_bytes(named)
        if data is None:
            read_bytes(named, "keys file")  # raises with the reason
        entries = parse_yaml(data or b"", named, "keys file")
        if entries is None:
            raise ConfigError(f"keys file {named} is empty (a file being written?); no keys is written []")
        if not isinstance(entries, list):
            raise ConfigError(f"keys file {named}: must be a list of keys")
        return entries


def loose(path: Path) -> str | None:
    """What is wrong with a keys file every user may write (anyone could add a key), if it is."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if not mode & stat.S_IWOTH:
        return None
    return f"keys file {path} is writable by every user (mode {mode:04o}): anyone can add a key (chmod o-w)"


def keys_file_named(config: bytes | None, config_path: Path) -> Path | None:
    """The keys file a config's bytes name, None when they name none or cannot be read."""
    if config is None:
        return None
    try:
        raw = parse_yaml(config, config_path, "config")
        if not isinstance(raw, dict) or not raw.get("keys_file"):
            return None
        return Path(expand_references(raw["keys_file"], os.environ))
    except ConfigError:
        return None


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The config file (none: every dialect on echo), references expanded, the keys file's keys
    added, fully validated."""
    if path is None:
        return Settings()
    return Source.read(Path(path)).settings(environ)


def load_from_environment() -> Settings:
    """The settings of the config file `CHATGATE_CONFIG` names (the ASGI factory's way)."""
    return load_settings(os.environ.get(CONFIG) or None)


def load_source(path: Path) -> tuple[Source, Settings]:
    """The files as read and the settings they give (ConfigError when they give none)."""
    source = Source.read(path)
    return source, source.settings()


def refuse_opening(running: Settings, new: Settings) -> None:
    """A gateway that requires keys never becomes open by a change of files: a config that names
    no keys at all (nor a keys file) must say `auth: none` to mean it."""
    if running.keyed and not new.keyed and new.auth is None:
        raise ConfigError(
            "it names no keys, so it would open the gateway to anyone while the running one "
            "requires keys; to mean that, say `auth: none`"
        )
