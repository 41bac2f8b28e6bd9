"""`statefun serve` behind a bearer token and TLS, called by the runtime with the headers
and TLS settings of its module.yaml endpoint: real processes on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from statefun._http.server import HttpServer, Reply, ServerOptions
from tests._support import free_port
from tests._tls import make_pki
from tests.integration.test_http_defences import HANG, ROOT, STATEFUN, port_answers

pytestmark = pytest.mark.timeout(120)

TOKEN = "fn-token-7f3a9c"


@contextlib.contextmanager
def process(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    with log.open("w") as out:
        running = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=out,
            env={**os.environ, **(env or {})},
        )
        try:
            yield
        finally:
            running.send_signal(signal.SIGTERM)
            try:
                running.wait(timeout=HANG)
            except subprocess.TimeoutExpired:
                running.kill()
                running.wait()


def wait_port(port: int, log: Path) -> None:
    deadline = time.monotonic() + HANG
    while not port_answers(port):
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def request(
    url: str, data: bytes | None = None, headers: dict[str, str] | None = None, **kw: object
) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=HANG, **kw) as response:  # type: ignore[arg-type]
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    return make_pki(tmp_path / "pki")


def test_runtime_calls_a_function_server_with_token_and_mutual_tls(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    fn_port, ingress_port = free_port(), free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    serve = [
        *STATEFUN,
        "serve",
        "examples.greeter.functions:functions",
        "--port",
        str(fn_port),
        "--token-file",
        str(token_file),
        "--tls-cert",
        str(pki["server_cert"]),
        "--tls-key",
        str(pki["server_key"]),
        "--tls-client-ca",
        str(pki["ca_cert"]),
    ]
    module = tmp_path / "module.yaml"
    module.write_text(
        f"""\
kind: io.statefun.endpoints.v2/http
spec:
  functions: example/*
  urlPathTemplate: https://localhost:{fn_port}/statefun
  headers:
    Authorization: "Bearer ${{GREETER_TOKEN}}"
  transport:
    call: 20s
    trust_cacerts: {pki["ca_cert"]}
    client_cert: {pki["client_cert"]}
    client_key: {pki["client_key"]}
---
kind: io.pystatefun.http.v1/ingress
spec:
  id: example/http
  port: {ingress_port}
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: example/greets
"""
    )
    serve_log, run_log = tmp_path / "serve.log", tmp_path / "run.log"
    with process(serve, serve_log):
        wait_port(fn_port, serve_log)
        # without the client certificate: no TLS session at all
        trusted = ssl.create_default_context(cafile=str(pki["ca_cert"]))
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            request(f"https://localhost:{fn_port}/health", context=trusted)
        mutual = ssl.create_default_context(cafile=str(pki["ca_cert"]))
        mutual.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
        # with it, but without the token: 401 (the health check needs none)
        kind = {"Content-Type": "application/octet-stream"}
        url = f"https://localhost:{fn_port}/statefun"
        status, headers, body = request(url, b"", kind, context=mutual)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), body
        assert request(f"https://localhost:{fn_port}/health", context=mutual)[0] == 200
        # the runtime sends the token and its client certificate
        with process([*STATEFUN, "run", str(module)], run_log, {"GREETER_TOKEN": TOKEN}):
            wait_port(ingress_port, run_log)
            status, _, reply = request(
                f"http://127.0.0.1:{ingress_port}/call/example/greeter/Ada",
                b"hi",
                {"Content-Type": "text/plain"},
            )
            assert (status, reply) == (200, "Hello Ada! Nice to meet you."), run_log.read_text()
    for log in (serve_log, run_log):
        assert TOKEN not in log.read_text()


def test_serve_token_from_the_environment(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    serve = [*STATEFUN, "serve", "examples.greeter.functions:functions", "--port", str(port)]
    with process(serve, log, {"STATEFUN_SERVE_TOKEN": TOKEN}):
        wait_port(port, log)
        url = f"http://127.0.0.1:{port}/statefun"
        kind = {"Content-Type": "application/octet-stream"}
        assert request(url, b"", kind)[0] == 401
        assert request(url, b"", {**kind, "Authorization": "Bearer wrong"})[0] == 401
        # with the token the request reaches the function endpoint (an empty body: 400)
        assert request(url, b"", {**kind, "Authorization": f"Bearer {TOKEN}"})[0] == 400
        # another Host name: 421
        assert request(url, b"", {**kind, "Host": "evil.example"})[0] == 421


def test_serve_flags_are_checked(tmp_path: Path) -> None:
    base = [*STATEFUN, "serve", "examples.greeter.functions:functions", "--port", "0"]
    for flags, message in (
        (["--tls-cert", "x.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "nope.pem", "--tls-key", "nope.key"], "nope.pem"),
        (["--token-file", str(tmp_path / "missing")], "cannot read token file"),
    ):
        done = subprocess.run(
            [*base, *flags], cwd=ROOT, capture_output=True, text=True, timeout=HANG
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


class _Fixed:
    max_body_bytes = 16

    def check(self, request: object) -> None:
        return None

    def handle(self, request: object, body: bytes) -> Reply:
        return Reply(200, "text/plain", b"ok")

    def too_large(self, length: int | None) -> Reply:
        return Reply(413, "text/plain", b"no")


@pytest.mark.parametrize(
    ("host", "token", "tls", "warned"),
    [
        ("0.0.0.0", None, False, True),
        ("0.0.0.0", TOKEN, False, True),
        ("0.0.0.0", TOKEN, True, False),
        ("127.0.0.1", None, False, False),
    ],
)
async def test_listening_beyond_loopback_without_tls_and_token_is_warned(
    caplog: pytest.LogCaptureFixture,
    pki: dict[str, Path],
    host: str,
    token: str | None,
    tls: bool,
    warned: bool,
) -> None:
    context = None
    if tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(pki["server_cert"]), str(pki["server_key"]))
    server = HttpServer(_Fixed(), options=ServerOptions(token=token, tls=context), name="test")
    with caplog.at_level(logging.WARNING):
        await server.start(host, 0)
    await server.close(1.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == (1 if warned else 0), warnings
    if warned:
        assert "beyond this machine" in warnings[0]
        assert TOKEN not in warnings[0]


async def test_tls_connections_count_and_are_timed_from_the_accept(pki: dict[str, Path]) -> None:
    """A connection that never starts its TLS handshake holds a slot only until the head
    deadline; it counts towards the caps meanwhile."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(pki["server_cert"]), str(pki["server_key"]))
    options = ServerOptions(tls=context, head_timeout=0.5, max_connections_per_client=2)
    server = HttpServer(_Fixed(), options=options, name="test")
    port = await server.start("127.0.0.1", 0)
    client = ssl.create_default_context(cafile=str(pki["ca_cert"]))
    try:
        opened = time.monotonic()
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.1)
        assert len(server.connections) == 2
        with pytest.raises((ssl.SSLError, ConnectionError)):  # no room, the others are new
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="localhost"
            )
        for reader, writer in silent:
            assert await asyncio.wait_for(reader.read(), HANG) == b""
            writer.close()
        assert 0.45 < time.monotonic() - opened < HANG
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="localhost"
        )
        writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()
    finally:
        await server.close(1.0)
