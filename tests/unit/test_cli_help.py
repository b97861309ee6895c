"""The CLI's help and its one-line refusals say what is so, once: found by a newcomer reading
them (the --config variable named twice, `keys list` said to edit the file, the conformance
extra missing from the README)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def help_of(*command: str) -> str:
    result = CliRunner().invoke(cli, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("command", [("serve",), ("keys", "list")])
def test_the_config_option_names_its_variable_once(command: tuple[str, ...]):
    assert help_of(*command).count("CHATGATE_CONFIG") == 1


def test_keys_list_reads_the_file_and_says_so():
    text = help_of("keys", "list")
    assert "The keys file to read" in text and "edit" not in text and "reloads" not in text
    assert "The keys file to edit" in help_of("keys", "new")  # new and revoke do edit it


def test_the_commands_are_listed_one_line_each():
    """The top-level help shows each command's short help, not its whole docstring wrapped."""
    result = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    lines = [line for line in result.output.splitlines() if "conformance" in line or " probe " in line]
    assert len(lines) == 2, result.output
    assert "Exits 0" not in result.output and "conformant, 1 when not" not in result.output


def test_conformance_names_each_dialects_listing_for_the_model():
    text = help_of("conformance")
    assert "/models_available" in text and "/info" in text


def test_without_schemathesis_the_command_names_the_extra_the_readme_names(monkeypatch: Any):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "schemathesis" else found(name, *a)
    )
    result = CliRunner().invoke(cli, ["conformance", "http://127.0.0.1:1/v1"])
    assert result.exit_code == 2
    assert "pip install 'chatgate[conformance]'" in result.output
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "'chatgate[conformance]'" in readme
    assert "'chatgate[conformance]'" in (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
