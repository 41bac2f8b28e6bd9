"""Fuzzing the HTTP ingress of a running job: any request line, headers, body and typename.

A real job (embedded functions, checkpoints and the write-ahead log on) runs in a thread and
serves its HTTP ingress on 127.0.0.1; each example is sent over a new TCP connection. Whatever
is sent, the answer is never a 5xx other than 503 (admission), a complete request is always
answered, and the job keeps running: afterwards a legitimate call still gets its reply.
Bounded by the ``ci`` profile (tests/_fuzz.py); docs/fuzzing.md has the longer run.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from statefun._settings import Settings
from statefun.ingress.http import HttpSource
from statefun.module import load_module_text
from statefun.runtime._plan import build_job

pytestmark = pytest.mark.timeout(600)

MODULE = """
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: fuzz/*
  module: tests.integration.fns.fuzz_fns:functions
---
kind: io.pystatefun.http.v1/ingress
spec:
  id: fuzz/http
  port: 0
  maxBodySize: 4096
  replyTimeout: 5s
"""
ANSWER_WITHIN = 10.0  # seconds: longer means the ingress hangs


class RunningJob:
    """A job run by ``asyncio.run`` in a thread of its own."""

    def __init__(self, tmp: Path) -> None:
        settings = Settings(
            checkpoint_dir=str(tmp / "checkpoints"),
            checkpoint_interval_ms=200,
            dead_letter_path=str(tmp / "dead.jsonl"),
        )
        self.job = build_job(load_module_text(MODULE, "fuzz.yaml"), settings)
        (self.source,) = (s for s in self.job.sources if isinstance(s, HttpSource))
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="fuzzed-job", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            await self.job.run()

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by alive()
            self.error = exc

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.source.port == 0 or self.source._context is None:
            assert self.thread.is_alive(), f"the job did not start: {self.error!r}"
            assert time.monotonic() < deadline, "the job did not start within 30 s"
            time.sleep(0.02)

    def alive(self) -> None:
        assert self.thread.is_alive() and not self.job.failed, f"the job stopped: {self.error!r}"

    def stop(self) -> None:
        if self.loop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.job.stop)
        self.thread.join(30)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningJob]:
    job = RunningJob(tmp_path_factory.mktemp("fuzz-http"))
    job.start()
    yield job
    job.stop()
    assert job.error is None, repr(job.error)


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, close the sending side, read until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before reading everything
            pass
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"no answer within {ANSWER_WITHIN} s (a hang)") from None
            if not chunk:
                break
            received += chunk
    return received


def statuses(answer: bytes) -> list[int]:
    """The status codes of the responses in ``answer`` (pipelined ones too)."""
    found = []
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1.") and len(line) >= 12 and line[9:12].isdigit():
            found.append(int(line[9:12]))
    return found


def check(running: RunningJob, data: bytes, complete: bool) -> None:
    answer = exchange(running.source.port, data)
    codes = statuses(answer)
    if complete:
        assert codes, f"a complete request got no answer: {answer[:200]!r}"
    bad = [code for code in codes if code >= 500 and code != 503]
    assert not bad, f"server error {bad}: {answer[:300]!r}"
    running.alive()


# -- what requests are made of -------------------------------------------------------------

text_part = st.one_of(
    st.sampled_from(["fuzz", "echo", "count", "x", "", "%2F", "%00", "..", "%", "%zz", "*"]),
    st.text(max_size=12),
)
typenames = st.one_of(
    st.sampled_from(
        [
            "io.statefun.types/int",
            "io.statefun.types/long",
            "io.statefun.types/bool",
            "io.statefun.types/float",
            "io.statefun.types/double",
            "io.statefun.types/string",
            "fuzz/json",
            "a/b/c",
            "/",
            "",
        ]
    ),
    st.text(max_size=20),
)
content_types = st.one_of(
    st.sampled_from(
        [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/octet-stream",
            "application/json",
            "TEXT/PLAIN",
            "",
        ]
    ),
    st.text(max_size=20),
)
bodies = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=50).map(lambda t: t.encode("utf-8")),
    st.sampled_from([b"42", b"-1", b"true", b"1e999", b"nan", b"99999999999999999999", b"\xff"]),
)


def _header_text(value: str) -> str:
    return value.replace("\r", " ").replace("\n", " ")


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A complete HTTP/1.1 request; each part valid, near-valid or arbitrary."""
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "HEAD", "PUT", "OPTIONS"]))
    route = draw(st.sampled_from(["messages", "messages", "call", "call", "health", "other"]))
    if draw(st.integers(0, 3)):  # mostly an address of the module, any id
        ids = st.one_of(st.from_regex(r"[A-Za-z0-9._~-]{1,10}", fullmatch=True), text_part)
        parts = ["fuzz", draw(st.sampled_from(["echo", "count"])), draw(ids)]
    else:
        parts = [draw(text_part) for _ in range(draw(st.integers(0, 4)))]
    path = "/" + "/".join([route, *parts]) if route != "health" else "/health"
    if draw(st.booleans()):
        path += "?" + draw(
            st.sampled_from(["typename=", "typename=%s", "x=1&typename=%s"])
        ).replace("%s", draw(typenames))
    body = draw(bodies)
    headers = ["Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    if draw(st.integers(0, 3)):
        headers.append(f"Content-Type: {_header_text(draw(content_types))}")
    if draw(st.booleans()):
        headers.append(f"X-Statefun-Typename: {_header_text(draw(typenames))}")
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1))
        headers.append(f"{name.replace(':', '')}: {_header_text(draw(st.text(max_size=20)))}")
    line = f"{method} {path.replace(' ', '%20')} HTTP/1.1"
    head = "\r\n".join([line, *headers, "Connection: close"]) + "\r\n\r\n"
    return head.encode("utf-8", errors="surrogatepass") + body


@given(requests())
@example(
    b"POST /call/fuzz/echo/x?typename=io.statefun.types/int HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/octet-stream\r\nContent-Length: 1\r\nConnection: close"
    b"\r\n\r\n\xff"
)
def test_complete_requests(running: RunningJob, request: bytes) -> None:
    check(running, request, complete=True)


@given(st.binary(max_size=400))
@example(b"POST /messages/fuzz/count/x HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n")
@example(b"POST /messages/fuzz/count/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
@example(b"GET /health HTTP/9.9\r\n\r\n")
def test_arbitrary_bytes(running: RunningJob, data: bytes) -> None:
    check(running, data, complete=False)


@given(requests(), st.data())
def test_requests_with_bytes_changed(running: RunningJob, request: bytes, data: Any) -> None:
    buffer = bytearray(request)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(0, len(buffer) - 1))
        buffer[where] = data.draw(st.integers(0, 255))
    check(running, bytes(buffer), complete=False)


def test_a_reply_that_is_not_a_value_of_its_type_is_sent_as_bytes(running: RunningJob) -> None:
    """Found by test_complete_requests: the reply of a built-in type (here an int) whose bytes
    do not decode made the request's task fail; the connection was never answered."""
    answer = exchange(
        running.source.port,
        b"POST /call/fuzz/echo/x?typename=io.statefun.types/int HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: 1\r\nConnection: close"
        b"\r\n\r\n\xff",
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"X-Statefun-Typename: io.statefun.types/int" in head
    assert b"Content-Type: application/octet-stream" in head and body == b"\xff"
    running.alive()


def test_a_legitimate_call_is_still_answered(running: RunningJob) -> None:
    """Runs after the fuzz tests of this module: the job is alive and answers."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{running.source.port}/call/fuzz/count/after",
        data=b"hello",
        headers={"Content-Type": "text/plain"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=ANSWER_WITHIN) as response:
        assert response.status == 200 and response.read() == b"1"
    running.alive()
