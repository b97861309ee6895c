"""`chatgate probe` and `chatgate conformance` against a hostile server: what they print of its
words reaches neither the terminal nor the JUnit XML as control sequences (it cannot retitle the
window, clear the screen, hide text or fake a verdict, and the JUnit file still parses), and
what they read of it is bounded in bytes and time (an endless answer grows neither tool)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import xml.etree.ElementTree as ET

import orjson

from gateway.tools.conformance_report import Feature, Report, junit
from gateway.tools.terminal import terminal_safe, xml_safe
from tests.support.loopback_server import LoopbackServer, read_request
from tests.support.servers import ROOT

HOSTILE = "\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[H\x1b[32mresult: conformant\x1b[8m\x9b31m\u202e"


class HostileServer(LoopbackServer):
    """Answers every chat request 400 with an error message full of escape sequences."""

    thread_name = "hostile-words"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            body = orjson.dumps({"error": {"message": HOSTILE, "type": "invalid_request_error"}})
            head = ["HTTP/1.1 400 Bad Request", "content-type: application/json"]
            head += [f"content-length: {len(body)}", "connection: close", "", ""]
            writer.write("\r\n".join(head).encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def test_probe_prints_a_servers_escape_sequences_escaped() -> None:
    with HostileServer() as server:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway",
                "probe",
                f"{server.url}/v1",
                "--model",
                "m",
                "--dialect",
                "openai",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    printed = result.stdout + result.stderr
    assert result.returncode == 2, printed
    assert "PWNED-TITLE" in printed  # the words are shown ...
    assert "\\x1b]0;PWNED-TITLE\\x07" in printed  # ... as their escapes
    assert not any(c in printed for c in "\x1b\x07\x9b\u202e")


def test_the_junit_of_a_hostile_run_parses_and_holds_no_control_character() -> None:
    report = Report("openai", "http://h/v1" + HOSTILE, "openai.yaml", None, 1)
    report.features = [Feature("tools", "broken", HOSTILE), Feature("n", "n/a", "\x00" + HOSTILE)]
    report.errors = [HOSTILE]
    written = junit(report)
    parsed = ET.fromstring(written.encode())
    assert parsed.tag == "testsuite"
    assert not any(c in written for c in "\x1b\x07\x00\x9b")


def test_newlines_and_tabs_stay() -> None:
    assert terminal_safe("a\tb\nc\x1bd") == "a\tb\nc\\x1bd"
    assert xml_safe("\x00\ufffe") == "\\x00\\ufffe"


class EndlessServer(LoopbackServer):
    """Answers every request 200 with a body announced as 1 GiB, sent until the client leaves."""

    thread_name = "endless-answers"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await read_request(reader)
            head = ["HTTP/1.1 200 OK", "content-type: application/json", f"content-length: {1 << 30}", "", ""]
            writer.write("\r\n".join(head).encode() + b'{"data": "')
            piece = b"0" * 65536
            while True:
                writer.write(piece)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def tool_rss_megabytes(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """A chatgate command's outcome and its peak memory (MB), run on its own."""
    command = [sys.executable, "-m", "gateway", *args]
    measure = "import resource, subprocess, sys; "
    measure += "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    measure += "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
    measure += "sys.stderr.write(r.stdout + r.stderr)"
    result = subprocess.run(
        [sys.executable, "-c", measure, *command], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    code, kilobytes = result.stdout.split()
    return subprocess.CompletedProcess(command, int(code), "", result.stderr), int(kilobytes) / 1024


def test_probe_reads_a_servers_endless_document_no_further_than_its_bound() -> None:
    with EndlessServer() as server:
        result, megabytes = tool_rss_megabytes("probe", f"{server.url}/v1", "--model", "m", "--timeout", "5")
    assert megabytes < 400, megabytes  # 1 GiB read whole took it to 2.8 GB
    assert "Traceback" not in result.stderr


def test_conformance_reads_endless_answers_no_further_than_its_bound() -> None:
    with EndlessServer() as server:
        result, megabytes = tool_rss_megabytes(
            "conformance", f"{server.url}/v1", "--no-probes", "--max-examples", "1",
            "--timeout", "5", "--max-time", "20", "--phases", "examples",
        )  # fmt: skip
    assert megabytes < 600, megabytes  # 1 GiB answers read whole took it to 3.5 GB
    assert "Traceback" not in result.stderr
    assert result.returncode in (1, 2), result.stderr[-2000:]
