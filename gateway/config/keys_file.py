"""The keys file (`keys_file:` in the config): a YAML list of key entries that `chatgate keys
new/revoke/list --file` edit and the gateway reloads when it changes. Written whole to a temporary
file and renamed over the old one, so a gateway reading it never sees half a file: over the file a
symlink names (the link stays, and points at the new content), with the old file's mode, or a new
one's 0640 as the umask narrows it."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gateway.config.settings import Key
from gateway.config.source import parse_yaml
from gateway.core.options import ConfigError


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = parse_yaml(path.read_bytes(), path, "keys file") or []
    if not isinstance(entries, list):
        raise ConfigError(f"keys file {path}: must be a list of keys")
    return entries


NEW_FILE_MODE = 0o640


def write(path: Path, entries: list[dict[str, Any]]) -> None:
    for entry in entries:
        Key.model_validate(entry)  # never write a file the gateway would refuse
    target = Path(os.path.realpath(path))  # a symlink's file, not the link replaced
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else NEW_FILE_MODE & ~current_umask()
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            yaml.safe_dump(entries, stream, sort_keys=False)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0o022)  # read by setting it: a command's one thread, put back at once
    os.umask(mask)
    return mask


def add(path: Path, entry: dict[str, Any]) -> None:
    entries = read(path)
    if any(e.get("name") == entry["name"] for e in entries):
        raise ConfigError(f"keys file {path}: there is a key named {entry['name']!r} already")
    write(path, [*entries, entry])


def revoke(path: Path, name: str) -> None:
    entries = read(path)
    kept = [e for e in entries if e.get("name") != name]
    if len(kept) == len(entries):
        raise ConfigError(f"keys file {path}: no key named {name!r}")
    write(path, kept)
