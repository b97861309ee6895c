"""The docs site builds strictly, the README stays short, and what the docs show works: every
config example is one `chatgate config check` accepts, and every `chatgate` command they name
exists.

A YAML block in docs/ is a whole chatgate config unless the line before its fence is the
comment NOT_A_CONFIG (docs/index.md, "Conventions in these pages")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest
import typer
import yaml
from typer.testing import CliRunner

from gateway.cli import cli
from gateway.config.schema import config_json_schema
from tests.support.choices_upstream import ChoicesUpstream, choice_text
from tests.support.servers import ROOT, running_gateway

DOCS = ROOT / "docs"
README = ROOT / "README.md"
NOT_A_CONFIG = "<!-- not a chatgate config -->"
# a fenced block: the line before it, its language, its text
FENCE = re.compile(r"(?:^|\n)([^\n]*)\n```(\w*)[^\n]*\n(.*?)\n```", re.S)
# what the examples reference with ${…}
EXAMPLE_ENVIRONMENT = {
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "LLAMA_API_KEY": "sk-example",
    "BACKUP_API_KEY": "sk-example",
    "OPENAI_API_KEY": "sk-example",
    "UPSTREAM_API_KEY": "sk-example",
}


def pages() -> list[Path]:
    return [README, ROOT / "deploy" / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """Each fenced block of a page: (the line before it, its language, its text)."""
    return FENCE.findall("\n" + page.read_text(encoding="utf-8"))


def config_examples() -> list[tuple[str, str]]:
    found = []
    for page in pages():
        for number, (before, language, text) in enumerate(blocks(page)):
            if language in ("yaml", "yml") and before.strip() != NOT_A_CONFIG:
                found.append((f"{page.relative_to(ROOT)}#{number}", text + "\n"))
    return found


def test_the_docs_site_builds_strictly(tmp_path: Path):
    """mkdocs.yml says `strict: true`: a broken link, a missing page or an anchor that is not
    there fails the build (the `docs` extra installs mkdocs)."""
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "getting-started" / "front-an-openai-server" / "index.html").is_file()
    # files the pages link that are not pages: copied beside them
    for kept in ("config.schema.json", "bench.png", "conformance-llama-cpp.html"):
        assert (tmp_path / "site" / kept).is_file(), kept


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move the detail into docs/"


def test_every_page_is_in_the_nav():
    """A page outside the nav is one a reader cannot find (mkdocs only says so at INFO level)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    named = [str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")]
    assert [name for name in named if name not in nav] == []


def test_the_docs_show_config_examples():
    names = {name.split("#")[0] for name, _ in config_examples()}
    assert "docs/getting-started/front-an-openai-server.md" in names
    assert len(config_examples()) >= 10


@pytest.mark.parametrize(
    ("name", "text"), [pytest.param(*example, id=example[0]) for example in config_examples()]
)
def test_every_config_example_is_accepted(tmp_path: Path, name: str, text: str):
    """By the schema (what an editor checks) and by `chatgate config check` (what the gateway
    checks). A fragment that is not a whole config says so with NOT_A_CONFIG before its fence."""
    validator = jsonschema.Draft202012Validator(config_json_schema())
    assert [e.message for e in validator.iter_errors(yaml.safe_load(text))] == [], name
    path = tmp_path / "chatgate.yaml"
    path.write_text(text, encoding="utf-8")
    checked = CliRunner().invoke(cli, ["config", "check", str(path)], env=EXAMPLE_ENVIRONMENT)
    assert checked.exit_code == 0, f"{name}: {checked.output}"
    assert ": ok (" in checked.output


SHELL = ("sh", "bash", "console", "shell")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
# `chatgate` as a command: not a path, an image, a namespace (`-n chatgate`) or a word of output
COMMAND = re.compile(r"(?<![\w/.:-])(?<!-n )chatgate((?: [a-z][a-z-]*\b(?![0-9]))+)")


def shown_code(page: Path) -> list[str]:
    """The shell blocks and inline code of a page: where a command is shown, not talked about."""
    text = page.read_text(encoding="utf-8")
    shown = [code for _, language, code in blocks(page) if language in SHELL]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return shown + INLINE_CODE.findall(prose)


def shown_commands() -> set[tuple[str, ...]]:
    """Every `chatgate …` command the pages show, as the words that name it (`config check`); a
    word that names no command ends the path, so that the test names it."""
    group = typer.main.get_command(cli)
    found: set[tuple[str, ...]] = set()
    for page in pages():
        for code in shown_code(page):
            for words in COMMAND.findall(code):
                commands = group.commands  # type: ignore[attr-defined]  # typer's own click
                path: list[str] = []
                for word in words.split():
                    path.append(word)
                    if word not in commands:
                        break
                    commands = getattr(commands[word], "commands", None)
                    if commands is None:  # a command, not a group: the rest are its arguments
                        break
                found.add(tuple(path))
    return found


def test_the_docs_show_the_commands():
    needed = {("serve",), ("config", "check"), ("keys", "new"), ("conformance",), ("probe",)}
    assert needed <= shown_commands()


@pytest.mark.parametrize("words", sorted(shown_commands()), ids=" ".join)
def test_every_command_the_docs_show_exists(words: tuple[str, ...]):
    shown = CliRunner().invoke(cli, [*words, "--help"])
    assert shown.exit_code == 0, f"chatgate {' '.join(words)} --help: {shown.output}"


def test_the_first_getting_started_page_works(tmp_path: Path, log_dir: Path):
    """Front an OpenAI-compatible server: its config, pointed at a stand-in upstream, answers the
    page's first request with the upstream's answer."""
    page = DOCS / "getting-started" / "front-an-openai-server.md"
    (config,) = [text for _, language, text in blocks(page) if language == "yaml"]
    with ChoicesUpstream() as upstream:
        path = tmp_path / "chatgate.yaml"
        path.write_text(
            config.replace("http://127.0.0.1:8082/v1", upstream.base_url("plain")), encoding="utf-8"
        )
        with running_gateway(log_dir, path) as url:
            body = {"model": "echo", "messages": [{"role": "user", "content": "Hello!"}]}
            answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == choice_text(1, 0)
