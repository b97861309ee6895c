"""The README's recipe for a sixth dialect holds: in a copy of the tree, a throwaway dialect made
from a copy of an existing document — its document, its translator module, one line in the data
registry, and what the generators write; no test table edited — changes those files only, passes
the suite's table-driven tests and the type check, is served at its own mount and probed with the
probe set it names.

The copy is `vllm`: OVMS's document under another name, at `/vllm`, with OVMS's translator.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.servers import ROOT, free_port, wait_until_healthy
from tests.support.tree_copy import CACHES, copy_tree, run_in

TREE = ("backends", "gateway", "generated", "openapi", "tests", "docs", "pyproject.toml", "README.md")

REGISTRY = Path("gateway/dialects/__init__.py")
RECIPE_FILES = {  # all that the recipe touches (its tests: none, it behaves as OVMS does)
    "openapi/vllm.yaml",
    "gateway/dialects/vllm.py",
    REGISTRY.as_posix(),
    "generated/vllm.py",
    "docs/config.schema.json",
}

TRANSLATOR_MODULE = '''"""vLLM's chat completions: OVMS's shape at a mount of its own (throwaway)."""

from gateway.dialects.dialect import Dialect
from gateway.dialects.ovms import OVMSTranslator

DIALECT = Dialect(
    name="vllm",
    document="vllm.yaml",
    translator=OVMSTranslator,
    chat_operations=("createChatCompletion",),
    screens_media=True,
    probes="ovms",  # probed as OVMS is: it shares its shape
)
'''


@pytest.fixture(scope="module")
def copy_with_a_sixth_dialect(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = copy_tree(TREE, tmp_path_factory.mktemp("sixth") / "chatgate")
    # 1. its document: a copy of an existing one
    shutil.copy2(ROOT / "openapi" / "ovms.yaml", tree / "openapi" / "vllm.yaml")
    # 2. its translator module
    (tree / "gateway" / "dialects" / "vllm.py").write_text(TRANSLATOR_MODULE)
    # 3. one line in the registry (data: its name and default mount)
    registry = tree / REGISTRY
    text = registry.read_text()
    last = '    "ovms": "/v3",\n'
    assert text.count(last) == 1, "the registry's shape changed: update the recipe"
    registry.write_text(text.replace(last, last + '    "vllm": "/vllm",\n'))
    # 4. what the generators write: the types and the configuration's schema
    run_in(tree, [sys.executable, "-m", "gateway.tools.codegen"])
    schema = run_in(tree, [sys.executable, "-m", "gateway", "config", "schema"]).stdout
    (tree / "docs" / "config.schema.json").write_text(schema)
    assert (tree / "generated" / "vllm.py").is_file()
    return tree


def changed_files(tree: Path) -> set[str]:
    """The files of the copy that are new or differ from this tree's (caches aside)."""
    changed = set()
    for path in tree.rglob("*"):
        relative = path.relative_to(tree)
        if path.is_dir() or any(part in CACHES for part in relative.parts):
            continue
        original = ROOT / relative
        if not original.is_file() or original.read_bytes() != path.read_bytes():
            changed.add(relative.as_posix())
    return changed


def test_it_takes_five_files_and_one_registry_line(copy_with_a_sixth_dialect: Path):
    tree = copy_with_a_sixth_dialect
    assert changed_files(tree) == RECIPE_FILES
    diff = difflib.ndiff(
        (ROOT / REGISTRY).read_text().splitlines(), (tree / REGISTRY).read_text().splitlines()
    )
    assert [line for line in diff if line[:1] in "+-"] == ['+     "vllm": "/vllm",']


def test_the_suite_tables_cover_it_without_an_edit(copy_with_a_sixth_dialect: Path):
    tree = copy_with_a_sixth_dialect
    suites = [
        "tests/unit/dialects",
        "tests/unit/test_spec_documents.py",
        "tests/integration/test_parameter_tables.py",
        "tests/unit/test_config_schema.py",
        "tests/integration/test_layers.py",
    ]
    result = run_in(tree, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *suites])
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *suites],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    vllm_tests = [line for line in collected.splitlines() if "vllm" in line]
    assert len(vllm_tests) >= 50, collected[-2000:]  # the new dialect is in the tables, not skipped
    assert " passed" in result.stdout


def test_the_type_check_holds_it(copy_with_a_sixth_dialect: Path):
    run_in(copy_with_a_sixth_dialect, [sys.executable, "-m", "mypy"])


def test_it_is_served_at_its_mount(copy_with_a_sixth_dialect: Path, tmp_path: Path):
    tree = copy_with_a_sixth_dialect
    port = free_port()
    log = tmp_path / "gateway.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log)
        body = {"model": "echo", "messages": [{"role": "user", "content": "Hello, sixth"}]}
        answer = httpx.post(f"{url}/vllm/chat/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert "Hello, sixth" in answer.json()["choices"][0]["message"]["content"]
        refused = httpx.post(f"{url}/vllm/chat/completions", json={"model": "echo"}, timeout=30)
        assert refused.status_code == 400 and "messages" in refused.text  # its document validates
        served = httpx.get(f"{url}/vllm/openapi.json", timeout=30)
        assert served.status_code == 200 and "/chat/completions" in served.json()["paths"]
        # `chatgate conformance --model` probes its features (the probe set it names), no KeyError
        probe = (
            "import json; from gateway.tools.conformance_target import Model, features_of;"
            f"features, why = features_of('{url}/vllm', 'vllm', Model('echo', '--model'), {{}}, 30.0);"
            "print(json.dumps({f.name: f.verdict for f in features}))"
        )
        verdicts = json.loads(run_in(tree, [sys.executable, "-c", probe]).stdout)
        assert verdicts["stream_done"] == verdicts["tools"] == "honoured", verdicts
    finally:
        process.terminate()
        process.wait(20)
