"""`chatgate keys --file` edits the file a symlink names (the gateway reading the target sees the
revocation), keeps the file's mode and honours the umask for a new one, refuses a name that
would put control characters on a terminal, and a keys file anyone may write is warned of."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.servers import ROOT


def keys_cli(*args: str, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    def narrowed() -> None:
        if umask is not None:
            os.umask(umask)

    return subprocess.run(
        [sys.executable, "-m", "gateway", "keys", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        preexec_fn=narrowed,
    )


def names_in(path: Path) -> list[str]:
    return [entry["name"] for entry in yaml.safe_load(path.read_text())]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_symlinked_keys_file_is_edited_where_it_points(tmp_path: Path) -> None:
    target = tmp_path / "real" / "keys.yaml"
    target.parent.mkdir()
    target.write_text("[]\n")
    link = tmp_path / "keys.yaml"
    link.symlink_to(target)
    assert keys_cli("new", "carol", "--file", str(link)).returncode == 0
    assert link.is_symlink()
    assert names_in(target) == ["carol"]
    assert keys_cli("revoke", "carol", "--file", str(link)).returncode == 0
    assert link.is_symlink() and names_in(target) == []


def test_the_files_mode_is_kept_and_a_new_one_follows_the_umask(tmp_path: Path) -> None:
    private = tmp_path / "private.yaml"
    private.write_text("[]\n")
    private.chmod(0o600)
    assert keys_cli("new", "a", "--file", str(private)).returncode == 0
    assert mode_of(private) == 0o600
    fresh = tmp_path / "fresh.yaml"
    assert keys_cli("new", "b", "--file", str(fresh), umask=0o077).returncode == 0
    assert mode_of(fresh) == 0o600
    usual = tmp_path / "usual.yaml"
    assert keys_cli("new", "c", "--file", str(usual), umask=0o022).returncode == 0
    assert mode_of(usual) == 0o640


def test_a_name_with_control_characters_is_refused(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    refused = keys_cli("new", "evil\x1b]0;TITLE\x07", "--file", str(keys_file))
    assert refused.returncode != 0
    assert "\x1b" not in refused.stdout and not keys_file.exists()


def test_a_keys_file_anyone_may_write_is_warned_of(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("[]\n")
    keys_file.chmod(0o666)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"keys_file": str(keys_file)}))
    checked = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "check", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "writable by every user" in checked.stdout + checked.stderr
