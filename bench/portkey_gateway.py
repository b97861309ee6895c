"""Portkey's open-source gateway as a peer: its pinned install, its command, its headers.

`@portkey-ai/gateway` 1.15.2 (Node, from npm) with every package under it pinned by
bench/portkey/package-lock.json is installed by `npm ci` on first use into
~/.cache/chatgate-bench/portkey-<version>/ and kept; none of it belongs in chatgate's own
environment. A folder counts as installed once npm has finished with exactly the committed lock
file (a stamp file holding it), so an interrupted install is started again rather than used
half-made. npm's install scripts are not run (`--ignore-scripts`): the one it would run, the
gateway's `patch-package`, has no patches in the published package.

It runs as `node build/start-server.js --port=N --headless` with NODE_ENV=production (no console
page, no log stream kept for it). It forwards each request to the upstream its headers name:
provider `openai`, custom host the nginx upstream's /v1, and an Authorization header (the
upstream reads none). Its code calls out to no address of its own unless a request asks it to (a
Portkey API key, a guardrail plugin, a provider's own URL); the bench sends none of that and sets
no key: under strace, starting it and answering a request made one connection, to the upstream.
With Node 20 its streamed answers fail (`TypeError: immutable`, appending its headers to the
upstream's response), so only its plain chat completions are measured.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.litellm_proxy import CACHE

VERSION = "1.15.2"
PACKAGE = "@portkey-ai/gateway"
PINS = Path(__file__).resolve().parent / "portkey"  # package.json and package-lock.json
FOLDER = CACHE / f"portkey-{VERSION}"
STAMP = "bench-installed"  # in the folder, written once npm has finished: the lock file's sha256
START_TIMEOUT = 60.0
ENVIRONMENT = {"NODE_ENV": "production", "NO_UPDATE_NOTIFIER": "1"}


class InstallError(RuntimeError):
    """npm could not install the gateway; the message ends with npm's own last lines."""


def stamp_text() -> str:
    return hashlib.sha256((PINS / "package-lock.json").read_bytes()).hexdigest() + "\n"


def script(folder: Path = FOLDER) -> Path:
    return folder / "node_modules" / PACKAGE / "build" / "start-server.js"


def ensure_installed(say: Callable[[str], None], folder: Path = FOLDER) -> Path:
    """The gateway's start-server.js in a ready folder, installed first if need be (seconds)."""
    stamp = folder / STAMP
    if script(folder).exists() and stamp.exists() and stamp.read_text() == stamp_text():
        return script(folder)
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise InstallError(f"{tool} is not installed (apt-get install nodejs npm)")
    say(f"Portkey: installing {PACKAGE}@{VERSION} into {folder} (npm ci, pinned by bench/portkey/)")
    folder.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(PINS / name, folder / name)
    log = folder / "npm.log"
    command = ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--omit=dev"]
    with log.open("w") as sink:
        code = subprocess.call(command, cwd=folder, stdout=sink, stderr=subprocess.STDOUT)
    if code != 0 or not script(folder).exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise InstallError(f"npm ci exited {code} (log: {log}): {tail}")
    stamp.write_text(stamp_text())
    return script(folder)


def command(start_server: Path, port: int) -> list[str]:
    return ["node", str(start_server), f"--port={port}", "--headless"]


def headers(upstream_v1: str) -> dict[str, str]:
    """What routes a request to the upstream: sent by wrk with every request."""
    return {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": upstream_v1,
        "Authorization": "Bearer bench",
    }


if __name__ == "__main__":  # python -m bench.portkey_gateway: install it ahead of a run
    print(ensure_installed(lambda message: print(message, flush=True)))
    sys.exit(0)
