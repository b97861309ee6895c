"""Real OpenAI-compatible servers that nobody on this project wrote, on loopback, for tests.

Three of them, each from a virtual environment of its own under ~/.cache/chatgate-tests/ (none
of them may move chatgate's own torch or transformers):

- Hugging Face `transformers serve` on the tiny model of tests/support/tiny_model.py;
- llama.cpp's server (llama-cpp-python) on the same model converted to GGUF by the converter
  the llama-cpp-python sdist ships;
- LiteLLM's proxy 1.80.0 with mock models, in the venv the benchmark makes (bench/litellm_proxy).

`python -m tests.support.real_servers` makes the venvs (scripts/run-tests runs it): idempotent, seconds
when they are there. The first llama-cpp-python build compiles llama.cpp (about 8 minutes on 2
cores; pip keeps the wheel, so a machine pays once). A venv counts as made once pip has finished
installing exactly what is asked (a stamp file naming it), so an interrupted install is redone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import venv
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import litellm_proxy
from tests.support.servers import free_port

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chatgate-tests"
STAMP = "chatgate-tests-installed"  # in a venv, written once pip has finished: what it installed
INSTALL_HINT = "./scripts/run-tests makes it (or: python -m tests.support.real_servers)"
START_TIMEOUT = 180.0  # seconds for a server to answer its health check (imports are slow on a busy core)
TORCH = "torch==2.13.0"  # chatgate's own; its CPU build is what pip finds on this project's machines
LLAMA_CPP_VERSION = "0.3.36"
# What the converter needs from the llama-cpp-python sdist (vendor/llama.cpp/ in it).
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
CONVERT_SCRIPT = Path(__file__).with_name("convert_tiny_gguf.py")
LITELLM_KEY = "sk-litellm-test-master-key"
LITELLM_MOCK_TEXT = "Hello from the LiteLLM mock."


@dataclass(frozen=True)
class ServerVenv:
    """A virtual environment of one real server's own, made once and kept."""

    name: str  # its folder under CACHE: <package>-<version>
    requirements: tuple[str, ...]
    with_torch: bool = False  # torch installed first, on its own (from $CHATGATE_TORCH_INDEX if set)
    then: Callable[[Path, Callable[[str], None]], None] | None = None  # a last step (the venv, say)

    @property
    def directory(self) -> Path:
        return CACHE / self.name

    def stamp_text(self) -> str:
        return "\n".join(((TORCH,) if self.with_torch else ()) + self.requirements) + "\n"

    def ready(self) -> bool:
        stamp = self.directory / STAMP
        return stamp.exists() and stamp.read_text() == self.stamp_text()

    def program(self, name: str) -> Path:
        """A program of the venv (`python`, a console script); fails the test, naming the command
        that makes the venv, when it is not made."""
        assert self.ready(), f"{self.directory} is not installed: {INSTALL_HINT}"
        return self.directory / "bin" / name

    def install(self, say: Callable[[str], None]) -> None:
        if self.ready():
            return
        say(f"real servers: making {self.directory}: {' '.join(self.stamp_text().split())}")
        venv.create(self.directory, with_pip=True, clear=True)
        if self.with_torch:
            index = os.environ.get("CHATGATE_TORCH_INDEX")
            self.pip("install", TORCH, *(("--index-url", index) if index else ()))
        self.pip("install", *self.requirements)
        if self.then is not None:
            self.then(self.directory, say)
        (self.directory / STAMP).write_text(self.stamp_text())

    def pip(self, *arguments: str) -> None:
        python = str(self.directory / "bin" / "python")
        quiet = ("-q", "--disable-pip-version-check", "--progress-bar", "off")
        subprocess.run([python, "-m", "pip", arguments[0], *quiet, *arguments[1:]], check=True)


# transformers serve; the converter of tests/support/convert_tiny_gguf.py runs here too (it needs torch,
# transformers, gguf and sentencepiece).
TRANSFORMERS = ServerVenv(
    "transformers-5.24.0",
    ("transformers[serving]==5.24.0", "gguf==0.19.0", "sentencepiece==0.2.2"),
    with_torch=True,
)


def unpack_converter(venv_dir: Path, say: Callable[[str], None]) -> None:
    """The GGUF converter from the llama-cpp-python sdist (pip has it cached from the build),
    into <venv>/converter."""
    destination = venv_dir / "converter"
    say(f"real servers: unpacking the GGUF converter into {destination}")
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--no-binary", ":all:", "-d", download, f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
            check=True,
        )  # fmt: skip
        (sdist,) = Path(download).glob("*.tar.gz")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        shutil.rmtree(destination, ignore_errors=True)
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                inside = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and inside.startswith(CONVERTER_PARTS):
                    member.name = inside
                    members.append(member)
            archive.extractall(destination, members=members, filter="data")


# No wheel on the index: pip builds it from the sdist (compiling llama.cpp is the 8 minutes).
LLAMA_CPP = ServerVenv(
    f"llama-cpp-python-{LLAMA_CPP_VERSION}",
    (f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}",),
    then=unpack_converter,
)


def install_all(say: Callable[[str], None] = print) -> None:
    """Make every real server's venv that is not made yet."""
    TRANSFORMERS.install(say)
    if not LLAMA_CPP.ready():
        say("real servers: llama-cpp-python compiles llama.cpp on its first install (minutes)")
    LLAMA_CPP.install(say)
    litellm_proxy.ensure_installed(say)


# ----- the model files ------------------------------------------------------------------------


def convert_to_gguf(model_dir: Path, gguf: Path) -> Path:
    """The tiny model as one GGUF file (float32), made by llama.cpp's own converter."""
    converter = LLAMA_CPP.directory / "converter"
    python = TRANSFORMERS.program("python")
    assert LLAMA_CPP.ready(), f"{LLAMA_CPP.directory} is not installed: {INSTALL_HINT}"
    result = subprocess.run(
        [str(python), str(CONVERT_SCRIPT), str(converter), str(model_dir), "--outfile", str(gguf),
         "--outtype", "f32"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and gguf.is_file(), f"GGUF conversion failed:\n{result.stderr[-3000:]}"
    return gguf


# ----- processes ------------------------------------------------------------------------------


@contextmanager
def running_server(
    command: list[str], health_url: str, log: Path, environment: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """A server process in a process group of its own, once `health_url` answers 200; stopped
    (the whole group) on exit."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(environment or {})},  # its log as it goes
            start_new_session=True,
        )
    try:
        wait_until_up(health_url, process, log)
        yield process
    finally:
        stop(process)


def wait_until_up(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}:\n{tail(log)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{process.args[0]} did not answer {url} in {START_TIMEOUT:.0f} s:\n{tail(log)}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def tail(log: Path, characters: int = 4000) -> str:
    return log.read_text(errors="replace")[-characters:]


@dataclass(frozen=True)
class RunningServer:
    """A real server: its OpenAI base URL (…/v1), the model name it serves, its log."""

    base_url: str
    model: str
    log: Path
    api_key: str | None = None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def transformers_serve(model_dir: Path, workdir: Path) -> Iterator[RunningServer]:
    port = free_port()
    command = [
        str(TRANSFORMERS.program("transformers")), "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--log-level", "info",
    ]  # fmt: skip
    log = workdir / "transformers-serve.log"
    # one torch thread: the model is tiny, and the machine is shared
    with running_server(command, f"http://127.0.0.1:{port}/health", log, {"OMP_NUM_THREADS": "1"}):
        yield RunningServer(f"http://127.0.0.1:{port}/v1", str(model_dir), log)


LLAMA_CPP_ALIAS = "tiny-gguf"


@contextmanager
def llama_cpp_server(gguf: Path, workdir: Path, context: int = 512) -> Iterator[RunningServer]:
    """llama.cpp's server for the GGUF; `context` its window in tokens (the tiny model's 512, or
    more for a client whose own turns outgrow it)."""
    port = free_port()
    command = [
        str(LLAMA_CPP.program("python")), "-m", "llama_cpp.server", "--model", str(gguf),
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(context), "--n_threads", "1",
        "--model_alias", LLAMA_CPP_ALIAS,
    ]  # fmt: skip
    log = workdir / "llama-cpp-server.log"
    with running_server(command, f"http://127.0.0.1:{port}/v1/models", log):
        yield RunningServer(f"http://127.0.0.1:{port}/v1", LLAMA_CPP_ALIAS, log)


def litellm_config(dead_port: int) -> dict[str, Any]:
    """A master key; `mock` answers LITELLM_MOCK_TEXT (and honours n), `dead` points at a port
    nothing listens on (LiteLLM answers 500), `limited` is a mock that answers 429."""

    def model(name: str, **params: Any) -> dict[str, Any]:
        return {
            "model_name": name,
            "litellm_params": {"model": f"openai/{name}", "api_key": "dummy", **params},
        }

    return {
        "model_list": [
            model("mock", mock_response=LITELLM_MOCK_TEXT),
            model("dead", api_base=f"http://127.0.0.1:{dead_port}/v1"),
            model("limited", mock_response="litellm.RateLimitError"),
        ],
        "litellm_settings": {"set_verbose": False, "json_logs": False, "num_retries": 0},
        "general_settings": {
            "master_key": LITELLM_KEY,
            "disable_spend_logs": True,
            "disable_error_logs": True,
        },
    }


@contextmanager
def litellm_proxy_server(workdir: Path) -> Iterator[RunningServer]:
    executable = litellm_proxy.VENV / "bin" / "litellm"
    stamp = litellm_proxy.VENV / litellm_proxy.STAMP
    made = executable.exists() and stamp.exists() and stamp.read_text() == litellm_proxy.stamp_text()
    assert made, f"{litellm_proxy.VENV} is not installed: {INSTALL_HINT}"
    port = free_port()
    config = workdir / "litellm.yaml"
    config.write_text(yaml.safe_dump(litellm_config(dead_port=free_port())))
    logging_config = workdir / "litellm-logging.yaml"
    logging_config.write_text(yaml.safe_dump(litellm_proxy.LOGGING))
    command = litellm_proxy.command(executable, config, logging_config, port)
    log = workdir / "litellm.log"
    with running_server(
        command, f"http://127.0.0.1:{port}/health/liveliness", log, litellm_proxy.ENVIRONMENT
    ):
        yield RunningServer(f"http://127.0.0.1:{port}/v1", "mock", log, api_key=LITELLM_KEY)


if __name__ == "__main__":  # python -m tests.support.real_servers: make every venv ahead of a test run
    from tests.support import client_libraries  # today's client libraries, beside the servers

    install_all(lambda message: print(message, flush=True))
    client_libraries.install_all(lambda message: print(message, flush=True))
