"""The dead-letter file (numbering, rotation, old lines) and `statefun dead-letters`."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path

import pytest

from statefun._cli import main
from statefun._settings import Settings
from statefun.module._specs import ModuleSpec
from statefun.runtime import Job
from statefun.runtime._deadletters import DeadLetterFile, LogLimiter, read_dead_letters
from statefun.sdk import TypedValue
from tests.integration.test_runtime import ListSink, embedded, string

pytestmark = pytest.mark.timeout(60)

OLD_LINE = {"target": "test/counter", "id": "old", "caller": None, "reason": "from before"}


def test_records_are_numbered_on_from_the_last_and_rotated(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    record = {"target": "test/counter", "id": "a", "reason": "r"}
    assert DeadLetterFile(path).append([(record, string("x"))] * 2) == [1, 2]
    # a new process goes on from the file
    letters = DeadLetterFile(path, max_bytes=600)
    assert letters.append([(record, string("y"))]) == [3]
    assert not letters.rotated.exists()
    assert letters.append([(record, string("z" * 300))]) == [4]  # past 600 bytes: rotated
    assert letters.rotated.exists() and not path.exists()
    assert DeadLetterFile(path, max_bytes=600).append([(record, string("w"))]) == [5]
    assert [name for name, _ in read_dead_letters(path)] == ["1", "2", "3", "4", "5"]


def test_numbering_goes_on_after_records_larger_than_the_tail_read(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    record = {"target": "test/counter", "id": "a", "reason": "r"}
    big = TypedValue("my/T", b"x" * 200_000)
    assert DeadLetterFile(path).append([(record, string("x")), (record, big)]) == [1, 2]
    assert DeadLetterFile(path).append([(record, string("y"))]) == [3]
    assert DeadLetterFile(path).append([(record, big)]) == [4]
    assert DeadLetterFile(path).append([(record, string("y"))]) == [5]


def test_old_lines_without_a_number_and_broken_lines_still_read(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    path.write_text(json.dumps(OLD_LINE) + "\n{not json\n")
    assert DeadLetterFile(path).append([({"target": "t/t", "id": "a"}, string("x"))]) == [1]
    got = list(read_dead_letters(path))
    assert [name for name, _ in got] == ["L1", "L2", "1"]
    assert "not a JSON record" in got[1][1]["reason"]


def test_the_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    limiter = LogLimiter(burst=3, window_s=10)
    assert [limiter.allow(now=1.0) for _ in range(5)] == [True, True, True, False, False]
    assert limiter.suppressed == 2
    assert limiter.allow(now=12.0) and limiter.suppressed == 0
    assert "2 more dead letter(s) within 10 s" in caplog.text


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["dead-letters", *argv])
    return code, out.getvalue(), err.getvalue()


def write_letters(path: Path) -> None:
    path.write_text(json.dumps({**OLD_LINE, "type": string("x").typename, "value_base64": ""}))
    path.write_text(path.read_text() + "\n")
    letters = DeadLetterFile(path)
    letters.append(
        [
            (
                {"target": "test/counter", "id": "a", "caller": None, "reason": "HTTP 404\nx"},
                string("hello"),
            ),
            (
                {"target": "test/counter", "id": "a", "state": "count", "reason": "moved"},
                string("s"),
            ),
            (
                {"target": "test/counter", "id": "b", "reason": "custom"},
                TypedValue("my/T", b"\x00"),
            ),
        ]
    )


def test_list_and_show(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    write_letters(path)
    code, out, _ = cli("list", "--file", str(path))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4
    assert lines[1].split()[0] == "1" and "test/counter/a" in lines[1]
    assert lines[1].endswith("io.statefun.types/string  HTTP 404 x")  # one line per record
    assert "state 'count'" in lines[2]
    code, out, _ = cli("show", "1", "--file", str(path))
    shown = json.loads(out)
    assert code == 0 and shown["value"] == "hello" and "value_base64" not in shown
    code, out, _ = cli("show", "3", "--file", str(path))
    assert json.loads(out)["value_base64"] == "AA=="  # not a built-in type: base64
    code, _, err = cli("show", "99", "--file", str(path))
    assert code == 1 and err.count("\n") == 1 and "no dead letter '99'" in err


async def test_replay_sends_messages_back_through_the_http_ingress(tmp_path: Path) -> None:
    from statefun.ingress.http import HttpSource

    path = tmp_path / "dead.jsonl"
    write_letters(path)
    sink = ListSink()
    job = Job(ModuleSpec(endpoints=(embedded(),)), Settings(), sinks=[sink])
    source = HttpSource("test/http", port=0, replies=job.replies, reply_timeout_s=5)
    job.sources = [source]
    running = asyncio.create_task(job.run())
    try:
        for _ in range(100):
            if source.port:
                break
            await asyncio.sleep(0.02)
        code, out, _ = await asyncio.to_thread(
            cli, "replay", "--all", "--url", source.url, "--file", str(path)
        )
        assert code == 0 and out.endswith("replayed 3, skipped 1\n") and "2: skipped" in out
        for _ in range(250):
            if len(sink.values) == 3:
                break
            await asyncio.sleep(0.02)
        assert sorted(sink.values) == ["a=1", "b=1", "old=1"]
        code, out, err = await asyncio.to_thread(
            cli, "replay", "1", "--url", source.url, "--file", str(path)
        )
        assert (code, out, err) == (0, "replayed 1, skipped 0\n", "")
        # (an ingress that honours Idempotency-Key takes record 1 once; one that does not
        # takes it again)
        for _ in range(50):
            if len(sink.values) == 4:
                break
            await asyncio.sleep(0.02)
        assert sorted(sink.values) in (
            ["a=1", "b=1", "old=1"],
            ["a=1", "a=2", "b=1", "old=1"],
        )
    finally:
        job.stop()
        await running
    code, _, err = await asyncio.to_thread(cli, "replay", "--file", str(path))
    assert code == 1 and "record ids or --all" in err


async def test_replay_sends_an_idempotency_key_of_the_record(tmp_path: Path) -> None:
    from aiohttp import web

    seen: list[tuple[str, str, str, bytes]] = []

    async def ingress(request: web.Request) -> web.Response:
        headers = request.headers
        seen.append(
            (
                request.path,
                headers["X-Statefun-Typename"],
                headers["Idempotency-Key"],
                await request.read(),
            )
        )
        return web.Response(status=202, text="accepted")

    app = web.Application()
    app.router.add_post("/messages/{namespace}/{type}/{id}", ingress)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    path = tmp_path / "dead.jsonl"
    write_letters(path)
    try:
        for _ in range(2):
            code, _, _ = await asyncio.to_thread(
                cli, "replay", "1", "3", "--url", url, "--file", str(path)
            )
            assert code == 0
    finally:
        await runner.cleanup()
    first, third, again, _ = seen
    assert first[:2] == ("/messages/test/counter/a", "io.statefun.types/string")
    assert third[:2] == ("/messages/test/counter/b", "my/T") and third[3] == b"\x00"
    assert first[2] == again[2] != third[2]  # the same record: the same key
