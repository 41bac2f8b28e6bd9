"""The HTTP ingress under attack and behind its guards, as a user runs it: `statefun run` in a
process of its own, clients on raw sockets in this one.

Slow clients (slowloris), thousands of connections at once, requests for other Host names
(DNS rebinding), a bearer token and TLS. Latency figures are printed (run with ``-s``), not
asserted: the time bounds here only catch a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._support import free_port
from tests._tls import make_pki

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
STATEFUN = [sys.executable, "-m", "statefun"]
HANG = 30.0  # seconds any one wait may take before the test fails

MODULE = """\
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: example/greeter
  module: examples.greeter.functions:functions
---
kind: io.pystatefun.http.v1/ingress
spec:
  id: example/http
  port: {port}
{extra}---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: example/greets
"""


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < needed:
        pytest.skip(f"needs {needed} open files, the limit is {soft}")


@contextlib.contextmanager
def runtime(
    tmp: Path, extra: str = "", env: dict[str, str] | None = None, scheme: str = "http"
) -> Iterator[int]:
    """`statefun run` with an HTTP ingress; yields its port once it answers."""
    port = free_port()
    module = tmp / "module.yaml"
    module.write_text(MODULE.format(port=port, extra=extra))
    log = (tmp / "runtime.log").open("w")
    process = subprocess.Popen(
        [*STATEFUN, "run", str(module)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + HANG
        while not port_answers(port):
            assert process.poll() is None, (tmp / "runtime.log").read_text()
            assert time.monotonic() < deadline, "the runtime did not start"
            time.sleep(0.05)
        yield port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def port_answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def message(name: str = "Ada", host: str = "localhost", headers: str = "") -> bytes:
    body = b"hi"
    return (
        f"POST /messages/example/greeter/{name} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: text/plain\r\n{headers}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def read_status(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """(status line, headers, body) of one response."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG)
    status, *lines = head[:-4].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), HANG)
    return status, headers, body


async def ask(
    port: int, request: bytes, context: ssl.SSLContext | None = None, source: str = "127.0.0.1"
) -> tuple[str, dict[str, str], bytes]:
    """One request on a new connection (from the loopback address ``source``)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            "127.0.0.1",
            port,
            ssl=context,
            server_hostname="localhost" if context else None,
            local_addr=(source, 0),
        ),
        HANG,
    )
    try:
        writer.write(request)
        return await read_status(reader)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


async def legitimate_requests(
    port: int, seconds: float, gap: float
) -> tuple[int, int, list[float]]:
    """(sent, answered 202, latencies) of requests on new connections every ``gap`` seconds,
    from a client address of their own (127.0.0.100: Linux routes all of 127/8 to lo)."""
    sent = accepted = 0
    latencies: list[float] = []
    failures: dict[str, int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sent += 1
        start = time.monotonic()
        try:
            status, _, _ = await ask(port, message(f"legit{sent}"), source="127.0.0.100")
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            status = repr(exc)
        if status == "HTTP/1.1 202 Accepted":
            accepted += 1
            latencies.append(time.monotonic() - start)
        else:
            failures[status] = failures.get(status, 0) + 1
        await asyncio.sleep(gap)
    if failures:
        print(f"\nrequests not answered 202: {failures}")
    return sent, accepted, latencies


# -- status lines -------------------------------------------------------------------------------


async def test_an_accepted_message_reads_202_accepted(tmp_path: Path) -> None:
    with runtime(tmp_path) as port:
        status, _, body = await ask(port, message())
    assert status == "HTTP/1.1 202 Accepted"
    assert body == b"accepted\n"


# -- slow clients and many connections ----------------------------------------------------------


async def slowloris(port: int, stop: asyncio.Event, period: float, source: str) -> None:
    """One slow connection: a request head, one header line per ``period``; reconnects when
    closed, as a determined attacker does."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0)
            )
        except OSError:
            await asyncio.sleep(period)
            continue
        try:
            writer.write(b"POST /messages/example/greeter/x HTTP/1.1\r\nHost: localhost\r\n")
            n = 0
            while not stop.is_set() and not reader.at_eof():
                await asyncio.sleep(period)
                n += 1
                writer.write(f"X-Slow-{n}: a\r\n".encode())
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await asyncio.sleep(0.2)


async def test_slow_clients_do_not_lock_out_requests(tmp_path: Path) -> None:
    """1,100 connections from three addresses trickle one header line per second each and
    reconnect when closed; requests from another address meanwhile are all answered.
    (Before: the 1,024 connection slots stayed taken, every byte reset the idle timer, and
    new connections were reset.)"""
    raise_fd_limit(4096)
    env = {"PYSTATEFUN_HTTP_HEAD_TIMEOUT_MS": "3000"}
    with runtime(tmp_path, env=env) as port:
        stop = asyncio.Event()
        attackers = [
            asyncio.create_task(slowloris(port, stop, 1.0, f"127.0.0.{1 + n % 3}"))
            for n in range(1100)
        ]
        try:
            await asyncio.sleep(2.0)  # the slots are taken
            sent, accepted, latencies = await legitimate_requests(port, 8.0, 0.1)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*attackers, return_exceptions=True), HANG)
    print(
        f"\nslowloris (1,100 slow connections): {accepted}/{sent} requests answered 202, "
        f"p99 {p99(latencies) if latencies else float('nan'):.1f} ms"
    )
    assert sent >= 10
    assert accepted == sent


async def test_two_thousand_connections_at_once(tmp_path: Path) -> None:
    """2,000 connections at once from eight addresses, each sending a request and staying
    open: every one gets an HTTP answer (202, or 503 over the caps) and none is reset;
    requests from another address afterwards are all answered while the crowd stays
    connected. (Before: 976 of 2,000 were reset without an answer.)"""
    raise_fd_limit(6000)
    with runtime(tmp_path) as port:

        async def one(index: int) -> tuple[str, asyncio.StreamWriter | None]:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        "127.0.0.1", port, local_addr=(f"127.0.0.{1 + index % 8}", 0)
                    ),
                    HANG,
                )
            except (OSError, TimeoutError) as exc:
                return f"connect failed: {exc!r}", None
            try:
                writer.write(message(f"crowd{index}"))
                status, headers, _ = await read_status(reader)
            except (OSError, asyncio.IncompleteReadError) as exc:
                writer.close()
                return f"no answer: {exc!r}", None
            if status.startswith("HTTP/1.1 503"):
                assert headers.get("retry-after") and headers.get("connection") == "close"
            return status, writer

        crowd = await asyncio.gather(*(one(i) for i in range(2000)))
        try:
            outcomes: dict[str, int] = {}
            for status, _ in crowd:
                outcomes[status] = outcomes.get(status, 0) + 1
            unanswered = {k: v for k, v in outcomes.items() if not k.startswith("HTTP/1.1 ")}
            assert not unanswered, outcomes
            assert outcomes.get("HTTP/1.1 202 Accepted", 0) >= 500, outcomes
            await asyncio.sleep(1.2)  # the crowd's kept-alive connections are now idle
            sent, accepted, latencies = await legitimate_requests(port, 5.0, 0.02)
        finally:
            for _, writer in crowd:
                if writer is not None:
                    writer.close()
    print(
        f"\n2,000 connections at once: {outcomes}; then {accepted}/{sent} requests on new "
        f"connections answered 202, p99 {p99(latencies) if latencies else float('nan'):.1f} ms"
    )
    assert sent >= 20
    assert accepted == sent


# -- Host names ----------------------------------------------------------------------------------


async def test_other_host_names_are_refused_on_loopback(tmp_path: Path) -> None:
    with runtime(tmp_path) as port:
        for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", "[::1]:80"):
            status, _, _ = await ask(port, message(host=host))
            assert status == "HTTP/1.1 202 Accepted", host
        status, _, body = await ask(port, message(host=f"evil.example:{port}"))
    assert status == "HTTP/1.1 421 Misdirected Request"
    assert body.count(b"\n") == 1 and b"evil.example" in body


async def test_allowed_hosts_of_the_ingress(tmp_path: Path) -> None:
    extra = "  allowedHosts: [ingress.example.com]\n"
    with runtime(tmp_path, extra) as port:
        good, _, _ = await ask(port, message(host="ingress.example.com:8090"))
        bad, _, _ = await ask(port, message(host="localhost"))
    assert good == "HTTP/1.1 202 Accepted"
    assert bad == "HTTP/1.1 421 Misdirected Request"


# -- a bearer token and TLS ----------------------------------------------------------------------


async def test_bearer_token_from_the_environment(tmp_path: Path) -> None:
    extra = "  auth:\n    tokenEnv: INGRESS_TOKEN\n"
    token = "s3cret-Token_42"
    with runtime(tmp_path, extra, env={"INGRESS_TOKEN": token}) as port:
        missing, headers, body = await ask(port, message())
        wrong, _, _ = await ask(port, message(headers="Authorization: Bearer nope\r\n"))
        right, _, _ = await ask(port, message(headers=f"Authorization: Bearer {token}\r\n"))
        health, _, _ = await ask(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert missing == "HTTP/1.1 401 Unauthorized"
    assert headers["www-authenticate"].startswith("Bearer")
    assert body.count(b"\n") == 1
    assert wrong == "HTTP/1.1 401 Unauthorized"
    assert right == "HTTP/1.1 202 Accepted"
    assert health == "HTTP/1.1 200 OK"
    assert token not in (tmp_path / "runtime.log").read_text()


async def test_tls_with_client_certificates(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    extra = (
        f"  tls:\n    certFile: {pki['server_cert']}\n    keyFile: {pki['server_key']}\n"
        f"    clientCaFile: {pki['ca_cert']}\n"
    )
    with runtime(tmp_path, extra) as port:
        trusted = ssl.create_default_context(cafile=str(pki["ca_cert"]))
        trusted.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
        status, _, _ = await ask(port, message(), trusted)
        assert status == "HTTP/1.1 202 Accepted"
        anonymous = ssl.create_default_context(cafile=str(pki["ca_cert"]))
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await ask(port, message(), anonymous)
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await ask(port, message())  # plain HTTP to a TLS port
