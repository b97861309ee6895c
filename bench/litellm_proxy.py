"""LiteLLM's proxy as a contender (`--with-litellm`): its own venv, its config, its command.

The venv is made on first use under ~/.cache/chatgate-bench/ and kept: installing
`litellm[proxy]` takes minutes, and none of it belongs in chatgate's own environment. A venv
counts as ready once pip has finished installing exactly what is asked (a stamp file naming
it), so an interrupted install is started again rather than used half-made.

The proxy gets the settings that make it fastest while the comparison stays fair: one model on
the same nginx upstream, no database (so no spend logs and no key checks), no telemetry, its
logging at ERROR and uvicorn's access log off, one worker, uvloop (its own choice) and
httptools (installed beside it: chatgate's uvicorn parses HTTP with it too, and uvicorn falls
back to the slower h11 without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

VERSION = "1.80.0"
REQUIREMENTS = (f"litellm[proxy]=={VERSION}", "httptools")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chatgate-bench"
VENV = CACHE / f"litellm-{VERSION}"
STAMP = "bench-installed"  # in the venv, written once pip has finished: what it installed
START_TIMEOUT = 180.0  # it imports for seconds on an idle core, longer on a shared one
ENVIRONMENT = {
    "LITELLM_LOG": "ERROR",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the cost map shipped in the package, not fetched
    "LITELLM_MODE": "PRODUCTION",  # no .env file read
}
LOGGING = {  # uvicorn's loggers at WARNING: no access log line per request
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
    "loggers": {
        "uvicorn": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
    },
}


class InstallError(RuntimeError):
    """pip could not install LiteLLM; the message ends with pip's own last lines."""


def stamp_text() -> str:
    return "\n".join(REQUIREMENTS) + "\n"


def ensure_installed(say: Callable[[str], None], venv_dir: Path = VENV) -> Path:
    """The `litellm` command of a ready venv, made first if need be (minutes, with progress)."""
    command = venv_dir / "bin" / "litellm"
    stamp = venv_dir / STAMP
    if command.exists() and stamp.exists() and stamp.read_text() == stamp_text():
        return command
    say(f"LiteLLM: making {venv_dir} and installing {' '.join(REQUIREMENTS)} (takes minutes)")
    venv.create(venv_dir, with_pip=True, clear=True)
    log = venv_dir / "pip.log"
    pip = [str(venv_dir / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off"]
    with log.open("w") as sink:
        process = subprocess.Popen(
            [*pip, *REQUIREMENTS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:  # pip's progress, a line at a time
            sink.write(line)
            if line.startswith(("Collecting", "Installing", "Successfully", "ERROR")):
                say(f"LiteLLM: pip: {line.strip()[:100]}")
        code = process.wait()
    if code != 0 or not command.exists():
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise InstallError(f"pip install exited {code} (log: {log}): {tail}")
    stamp.write_text(stamp_text())
    return command


def config(model: str, upstream_v1: str) -> dict[str, Any]:
    """One model on the upstream as an OpenAI-compatible endpoint, and nothing else switched on."""
    return {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {"model": f"openai/{model}", "api_base": upstream_v1, "api_key": "dummy"},
            }
        ],
        "litellm_settings": {"set_verbose": False, "json_logs": False},
        "general_settings": {"disable_spend_logs": True, "disable_error_logs": True},
    }


def command(executable: Path, config_path: Path, logging_path: Path, port: int) -> list[str]:
    return [
        str(executable), "--config", str(config_path), "--log_config", str(logging_path),
        "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1", "--telemetry", "False",
    ]  # fmt: skip


if __name__ == "__main__":  # python -m bench.litellm_proxy: make the venv ahead of a run
    print(ensure_installed(lambda message: print(message, flush=True)))
    sys.exit(0)
