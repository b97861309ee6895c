"""Regenerate generated/ from openapi/ (or, with --check, fail when generated/ is stale).

generated/ holds one module of TypedDicts per dialect document: the translators' own bodies are
annotated with them (imported for the type checker only), so mypy holds the translators to
the documents at no cost at run time.

python -m gateway.tools.codegen          # write generated/<dialect>.py
python -m gateway.tools.codegen --check  # exit 1 and name the stale files
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC_DIR = ROOT / "openapi"
OUT_DIR = ROOT / "generated"
FLAGS = [
    "--input-file-type", "openapi",
    "--output-model-type", "typing.TypedDict",
    "--target-python-version", "3.11",
    "--use-union-operator",
    "--use-standard-collections",
    "--enum-field-as-literal", "all",
    "--disable-timestamp",
    "--use-double-quotes",
    "--use-schema-description",
    "--strict-nullable",
    "--formatters", "black", "isort",
]  # fmt: skip
PACKAGE_DOC = '"""TypedDicts generated from openapi/ by `python -m gateway.tools.codegen`. Do not edit."""\n'


def generate(out_dir: Path) -> list[Path]:
    """Generate one module per spec document into out_dir; return the files written."""
    written = []
    for spec in sorted(SPEC_DIR.glob("*.yaml")):
        target = out_dir / f"{spec.stem}.py"
        subprocess.run(
            [
                sys.executable, "-m", "datamodel_code_generator",
                "--input", str(spec.relative_to(ROOT)),
                "--output", str(target),
                *FLAGS,
            ],
            cwd=ROOT,
            check=True,
        )  # fmt: skip
        written.append(target)
    (out_dir / "__init__.py").write_text(PACKAGE_DOC, encoding="utf-8")
    written.append(out_dir / "__init__.py")
    return written


def stale_files() -> list[str]:
    """Names of files in generated/ that differ from a fresh generation (or are missing/extra)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text(encoding="utf-8") for p in generate(Path(tmp))}
    current = {p.name: p.read_text(encoding="utf-8") for p in OUT_DIR.glob("*.py")}
    stale = []
    for name in sorted(fresh.keys() | current.keys()):
        if fresh.get(name) != current.get(name):
            diff = difflib.unified_diff(
                (current.get(name) or "").splitlines(),
                (fresh.get(name) or "").splitlines(),
                f"generated/{name}",
                "fresh",
                lineterm="",
                n=1,
            )
            stale.append(f"generated/{name}\n" + "\n".join(list(diff)[:20]))
    return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated/ is stale")
    args = parser.parse_args()
    if args.check:
        stale = stale_files()
        for entry in stale:
            print(f"stale: {entry}", file=sys.stderr)
        return 1 if stale else 0
    OUT_DIR.mkdir(exist_ok=True)
    for path in generate(OUT_DIR):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
