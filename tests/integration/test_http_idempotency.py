"""Idempotency-Key on the HTTP ingress: a repeated request is answered, not processed again,
also across crashes."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from statefun._exceptions import JobFailedError
from statefun._settings import Settings
from statefun.checkpoint import SimulatedCrash
from statefun.egress.file import FileSink
from statefun.ingress._keystore import fingerprint
from statefun.ingress._wal import frame
from statefun.ingress.http import HttpSource
from statefun.module._specs import EmbeddedEndpointSpec, FunctionTarget, ModuleSpec
from statefun.runtime import Job
from statefun.sdk._types import TypedValue
from tests.integration.test_checkpoints import embedded, output

pytestmark = pytest.mark.timeout(120)

TEXT = {"Content-Type": "text/plain"}
REPLAYED = "Idempotent-Replayed"


def slow() -> EmbeddedEndpointSpec:
    return EmbeddedEndpointSpec(
        FunctionTarget("slow", None), "tests.integration.fns.slow:functions"
    )


def idempotent_job(
    tmp: Path, checkpoints: bool = False, source_options: Any = None, **settings: Any
) -> tuple[Job, HttpSource]:
    options: dict[str, Any] = {"dead_letter_path": str(tmp / "dead.jsonl"), **settings}
    if checkpoints:
        options.setdefault("checkpoint_dir", str(tmp / "checkpoints"))
        options.setdefault("checkpoint_interval_ms", 60_000)
    job = Job(
        ModuleSpec(endpoints=(embedded(), slow())),
        Settings(**options),
        sinks=[FileSink("test/out", tmp / "out.jsonl")],
    )
    source = HttpSource(
        "test/http",
        port=0,
        replies=job.replies,
        wal_dir=tmp / "wal" if checkpoints else None,
        log_calls=job.settings.reply_release != "on-checkpoint",
        held_replies=job.held_replies,
        unanswered=job.unanswered_calls.describe,
        **(source_options or {}),
    )
    job.sources = [source]
    return job, source


async def started(job: Job, source: HttpSource) -> tuple[asyncio.Task[None], str]:
    running = asyncio.create_task(job.run())
    for _ in range(500):
        if source.port and source._context is not None:
            return running, source.url
        await asyncio.sleep(0.01)
    raise AssertionError("the HTTP ingress did not start")


async def post(
    http: aiohttp.ClientSession, url: str, body: str = "x", key: str | None = None
) -> tuple[int, str, bool]:
    headers = dict(TEXT)
    if key is not None:
        headers["Idempotency-Key"] = key
    async with http.post(url, data=body, headers=headers) as r:
        return r.status, (await r.text()).strip(), r.headers.get(REPLAYED) == "true"


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20))


# -- in memory (no checkpoints) -----------------------------------------------------------


async def test_a_repeated_message_is_processed_once(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path)
    running, url = await started(job, source)
    async with session() as http:
        answers = [await post(http, f"{url}/messages/test/counter/a", key="k-1") for _ in range(3)]
        assert answers == [
            (202, "accepted", False),
            (202, "accepted", True),
            (202, "accepted", True),
        ]
        # the function's state saw one message: the next call counts 2
        assert await post(http, f"{url}/call/test/counter/a") == (200, "2", False)
    job.stop()
    await running
    assert output(tmp_path / "out.jsonl") == Counter({"a=1": 1, "a=2": 1})
    assert source.keys.replayed == 2


async def test_a_repeated_call_gets_the_original_reply(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path)
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/b", key="c-1") == (200, "1", False)
        assert await post(http, f"{url}/call/test/counter/b", key="c-1") == (200, "1", True)
        assert await post(http, f"{url}/call/test/counter/b", key="c-2") == (200, "2", False)
        assert await post(http, f"{url}/call/test/counter/b") == (200, "3", False)
    job.stop()
    await running


async def test_concurrent_repeats_of_a_call_share_one_execution(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path)
    running, url = await started(job, source)
    async with session() as http:
        answers = await asyncio.gather(
            *(post(http, f"{url}/call/slow/counter/x", "0.3", key="same") for _ in range(4))
        )
        assert sorted(answers) == [(200, "1", False)] + [(200, "1", True)] * 3
        assert await post(http, f"{url}/call/slow/counter/x", "0") == (200, "2", False)
    job.stop()
    await running


async def test_a_repeat_that_waits_too_long_hears_where_the_call_is(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path, source_options={"reply_timeout_s": 0.3})
    running, url = await started(job, source)
    async with session() as http:
        first = asyncio.create_task(post(http, f"{url}/call/slow/counter/w", "1.5", key="w-1"))
        while (entry := source.keys.store.peek("w-1")) is None or not entry.emitted:
            await asyncio.sleep(0.01)  # until its message is inside the runtime
        status, body, _ = await post(http, f"{url}/call/slow/counter/w", "1.5", key="w-1")
        assert status == 504
        assert "'w-1' is still in progress: " in body
        assert "the function is still running with it" in body
        assert (await first)[0] == 504  # its own caller stopped waiting too
        again = f"{url}/call/slow/counter/w"
        answer = await post(http, again, "1.5", key="w-1")
        while answer[0] == 504:  # until the function replies: then the key holds its reply
            answer = await post(http, again, "1.5", key="w-1")
        assert answer == (200, "1", True)
    job.stop()
    await running


async def test_a_key_reused_for_another_request_is_refused(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path)
    running, url = await started(job, source)
    async with session() as http:
        assert (await post(http, f"{url}/messages/test/counter/a", "x", key="k"))[0] == 202
        for other in (
            f"{url}/messages/test/counter/a?typename=io.statefun.types/string",  # same
        ):
            assert (await post(http, other, "x", key="k"))[:1] == (202,)
        for target, body in (
            (f"{url}/messages/test/counter/a", "y"),  # another body
            (f"{url}/messages/test/counter/z", "x"),  # another address
            (f"{url}/call/test/counter/a", "x"),  # another route
        ):
            status, reason, _ = await post(http, target, body, key="k")
            assert status == 422 and "Idempotency-Key 'k' was used for another request" in reason
        status, reason, _ = await post(http, f"{url}/messages/test/counter/a", key="x" * 256)
        assert status == 400 and "Idempotency-Key" in reason and "255" in reason
        # nothing of the refused requests was processed
        assert await post(http, f"{url}/call/test/counter/a") == (200, "2", False)
        assert await post(http, f"{url}/call/test/counter/z") == (200, "1", False)
    job.stop()
    await running


async def test_a_refused_request_leaves_no_key(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path)
    running, url = await started(job, source)
    async with session() as http:
        source.max_pending = 0  # every request is refused with 503
        status, _, _ = await post(http, f"{url}/messages/test/counter/a", key="r")
        assert status == 503
        source.max_pending = 100
        assert await post(http, f"{url}/messages/test/counter/a", key="r") == (
            202,
            "accepted",
            False,
        )
        assert await post(http, f"{url}/call/test/counter/a") == (200, "2", False)
    job.stop()
    await running


async def test_a_key_is_forgotten_after_its_retention(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path, source_options={"idempotency_retention_s": 0.3})
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/a", key="t") == (200, "1", False)
        assert await post(http, f"{url}/call/test/counter/a", key="t") == (200, "1", True)
        await asyncio.sleep(0.4)
        assert await post(http, f"{url}/call/test/counter/a", key="t") == (200, "2", False)
    job.stop()
    await running


# -- across crashes (checkpoints on) ------------------------------------------------------


async def test_keyed_messages_retried_after_a_crash_count_once(tmp_path: Path) -> None:
    """(a) acknowledged then a crash: the retry gets a 202 and the message counts once;
    (b) a crash before the acknowledgement: the retry is processed, once."""
    job, source = idempotent_job(tmp_path, checkpoints=True, checkpoint_interval_ms=20)
    crash_now = asyncio.Event()

    def hook(name: str, checkpoint_id: int) -> None:
        if name == "cut" and crash_now.is_set():
            raise SimulatedCrash("crash with acknowledged messages after the last checkpoint")

    job.checkpoint_hook = hook
    running, url = await started(job, source)
    acked = set()
    async with session() as http:
        for n in range(60):
            if n == 40:
                crash_now.set()
            try:
                status, _, _ = await post(http, f"{url}/messages/test/counter/a", key=f"m-{n}")
            except aiohttp.ClientError:
                break
            if status == 202:
                acked.add(n)
    with pytest.raises(JobFailedError):
        await running
    assert len(acked) >= 40
    # Restart on the same WAL and checkpoints; the client retries every request it sent.
    job, source = idempotent_job(tmp_path, checkpoints=True, checkpoint_interval_ms=20)
    running, url = await started(job, source)
    async with session() as http:
        for n in range(60):
            status, _, replayed = await post(http, f"{url}/messages/test/counter/a", key=f"m-{n}")
            assert status == 202
            if n in acked:
                assert replayed, f"message {n} was acknowledged before the crash"
        assert await post(http, f"{url}/call/test/counter/a") == (200, "61", False)
    job.stop()
    await running
    assert output(tmp_path / "out.jsonl") == Counter(f"a={n}" for n in range(1, 62))


async def test_a_held_reply_survives_a_crash_after_its_checkpoint(tmp_path: Path) -> None:
    """(c) reply_release=on-checkpoint: the checkpoint covering a call completes, then the
    process dies before the reply leaves. The retry gets the reply of that execution."""
    job, source = idempotent_job(tmp_path, checkpoints=True)
    crash_now = asyncio.Event()

    def hook(name: str, checkpoint_id: int) -> None:
        if name == "completed" and crash_now.is_set():
            raise SimulatedCrash("crash after the checkpoint, before the reply is released")

    job.checkpoint_hook = hook
    running, url = await started(job, source)
    async with session() as http:
        for n in range(1, 4):
            assert await post(http, f"{url}/call/test/counter/c", key=f"c-{n}") == (
                200,
                str(n),
                False,
            )
        crash_now.set()
        with pytest.raises(aiohttp.ClientError):
            await post(http, f"{url}/call/test/counter/c", key="c-4")
    with pytest.raises(JobFailedError):
        await running
    job, source = idempotent_job(tmp_path, checkpoints=True)
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/c", key="c-4") == (200, "4", True)
        assert await post(http, f"{url}/call/test/counter/c", key="c-2") == (200, "2", True)
        assert await post(http, f"{url}/call/test/counter/c") == (200, "5", False)
    job.stop()
    await running


async def test_a_reply_released_just_before_the_next_cut_survives_a_crash(
    tmp_path: Path,
) -> None:
    """A checkpoint releases a call's reply and the next checkpoint, already due, is cut in
    the same loop step, before the reply's callbacks run; the process dies once that next
    checkpoint is complete. The retry gets the recorded reply: the restored cut does not hold
    the call as in progress, waiting for a reply the restored job no longer owes."""
    job, source = idempotent_job(
        tmp_path, checkpoints=True, source_options={"reply_timeout_s": 2.0}
    )
    released: list[int] = []

    def hook(name: str, checkpoint_id: int) -> None:
        assert job.checkpoints is not None
        if name == "committed" and not released:
            released.append(checkpoint_id)
            job.checkpoints.request_soon(0)  # due now: cut as soon as this one returns
        elif name == "completed" and released and checkpoint_id == released[0] + 1:
            raise SimulatedCrash("crash once the checkpoint after the reply's is complete")

    job.checkpoint_hook = hook
    running, url = await started(job, source)
    async with session() as http:
        with contextlib.suppress(aiohttp.ClientError):
            await post(http, f"{url}/call/test/counter/d", key="d-1")
    with pytest.raises(JobFailedError):
        await running
    assert released, "no checkpoint released the reply"
    job, source = idempotent_job(
        tmp_path, checkpoints=True, source_options={"reply_timeout_s": 2.0}
    )
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/d", key="d-1") == (200, "1", True)
        assert await post(http, f"{url}/call/test/counter/d") == (200, "2", False)
    job.stop()
    await running


@pytest.mark.parametrize("step", ["cut", "written"])
async def test_a_call_lost_before_its_checkpoint_is_processed_on_retry(
    tmp_path: Path, step: str
) -> None:
    """(c) the process dies before the checkpoint covering a call completes (at its cut):
    that execution does not count, and the retry is processed (once). Dying after the
    checkpoint's round of fsyncs ("written") comes after it completed, before its reply was
    sent: the restart adopts it, and the retry gets that execution's reply as a repeat."""
    job, source = idempotent_job(tmp_path, checkpoints=True)
    crash_now = asyncio.Event()

    def hook(name: str, checkpoint_id: int) -> None:
        if name == step and crash_now.is_set():
            raise SimulatedCrash("crash before the checkpoint completes")

    job.checkpoint_hook = hook
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/d", key="d-1") == (200, "1", False)
        crash_now.set()
        with pytest.raises(aiohttp.ClientError):
            await post(http, f"{url}/call/test/counter/d", key="d-2")
    with pytest.raises(JobFailedError):
        await running
    job, source = idempotent_job(tmp_path, checkpoints=True)
    running, url = await started(job, source)
    completed = step == "written"
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/d", key="d-2") == (200, "2", completed)
        assert await post(http, f"{url}/call/test/counter/d", key="d-2") == (200, "2", True)
        assert await post(http, f"{url}/call/test/counter/d", key="d-1") == (200, "1", True)
    job.stop()
    await running


async def test_a_call_in_flight_at_a_checkpoint_is_answered_after_a_crash(
    tmp_path: Path,
) -> None:
    """A call whose message a checkpoint holds, then a crash: after the restore the message
    runs again (its effects count once) and a retry gets that execution's reply."""
    job, source = idempotent_job(tmp_path, checkpoints=True, checkpoint_interval_ms=30)
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/slow/counter/s", "0") == (200, "1", False)
        call = asyncio.create_task(post(http, f"{url}/call/slow/counter/s", "0.6", key="s-1"))
        assert job.checkpoints is not None
        before = job.checkpoints.completed
        while job.checkpoints.completed < before + 2:  # a complete checkpoint holds the call
            await asyncio.sleep(0.01)
        job._crashed = True  # as if the process died now
        job.fail(SimulatedCrash("crash while the call is in flight"))
        with pytest.raises(aiohttp.ClientError):
            await call
    with pytest.raises(JobFailedError):
        await running
    job, source = idempotent_job(tmp_path, checkpoints=True, checkpoint_interval_ms=30)
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/slow/counter/s", "0.6", key="s-1") == (
            200,
            "2",
            True,
        )
        assert await post(http, f"{url}/call/slow/counter/s", "0") == (200, "3", False)
    job.stop()
    await running


async def test_keys_outlive_the_wal_segments_that_held_them(tmp_path: Path) -> None:
    """Trimmed WAL segments take their records along; the keys stay in the key log."""
    job, source = idempotent_job(
        tmp_path, checkpoints=True, checkpoint_interval_ms=20, source_options={"wal_retained": 1}
    )
    assert source.wal is not None
    source.wal.segment_bytes = 1  # a segment per group: trimming deletes them all but one
    running, url = await started(job, source)
    async with session() as http:
        for n in range(5):
            assert (await post(http, f"{url}/messages/test/counter/k", key=f"k-{n}"))[0] == 202
        assert await post(http, f"{url}/call/test/counter/k") == (200, "6", False)
    job.stop()
    await running
    assert len(list((tmp_path / "wal").glob("wal-*.log"))) <= 2
    assert list((tmp_path / "wal").glob("keys-*.log"))
    job, source = idempotent_job(tmp_path, checkpoints=True, checkpoint_interval_ms=20)
    running, url = await started(job, source)
    async with session() as http:
        for n in range(5):
            assert await post(http, f"{url}/messages/test/counter/k", key=f"k-{n}") == (
                202,
                "accepted",
                True,
            )
        assert await post(http, f"{url}/call/test/counter/k") == (200, "7", False)
    job.stop()
    await running


async def test_statefun_send_with_an_idempotency_key(tmp_path: Path) -> None:
    job, source = idempotent_job(tmp_path)
    running, url = await started(job, source)
    outputs = []
    for _ in range(2):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "statefun",
            "send",
            "test/counter/cli",
            "hi",
            "--call",
            "--idempotency-key",
            "cli-1",
            "--url",
            url,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await process.communicate()
        assert process.returncode == 0
        outputs.append(out.decode().strip())
    assert outputs == ["1", "1"]
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/cli") == (200, "2", False)
    job.stop()
    await running


async def test_wal_segments_without_keys_are_still_replayed(tmp_path: Path) -> None:
    """Records written before keys were kept (seven fields) replay as before, next to keyed
    ones."""
    (tmp_path / "wal").mkdir()
    fp = fingerprint("messages", "test/counter", "old", TypedValue("t", b""))
    key = ["w-2", fp, int(time.time() * 1000)]
    (tmp_path / "wal" / "wal-000000000001.log").write_bytes(
        frame([1, "test/counter", "old", None, "io.statefun.types/string", True, b"x"])
        + frame([2, "test/counter", "old", None, "io.statefun.types/string", True, b"x", key])
    )
    job, source = idempotent_job(tmp_path, checkpoints=True)
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/old") == (200, "3", False)
        # the keyed record's key is known, with the fingerprint it was written with
        status, _, _ = await post(http, f"{url}/messages/test/counter/old", key="w-2")
        assert status == 422
    job.stop()
    await running


async def test_immediate_replies_a_retry_after_a_crash_gets_the_execution_that_counted(
    tmp_path: Path,
) -> None:
    """reply_release=immediate: calls go through the WAL; a call answered after the last
    checkpoint runs again after a crash (as documented for this mode) and its key's reply is
    that run's: the function's state counts it once."""
    options: dict[str, Any] = {"checkpoints": True, "reply_release": "immediate"}
    job, source = idempotent_job(tmp_path, **options)
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/i", key="i-1") == (200, "1", False)
        assert job.checkpoints is not None
        await job.checkpoints.checkpoint()
        assert await post(http, f"{url}/call/test/counter/i", key="i-2") == (200, "2", False)
    job._crashed = True  # as if the process died before a checkpoint covered i-2
    job.fail(SimulatedCrash("crash after an immediate reply"))
    with pytest.raises(JobFailedError):
        await running
    job, source = idempotent_job(tmp_path, **options)
    running, url = await started(job, source)
    async with session() as http:
        assert await post(http, f"{url}/call/test/counter/i", key="i-2") == (200, "2", True)
        assert await post(http, f"{url}/call/test/counter/i", key="i-1") == (200, "1", True)
        assert await post(http, f"{url}/call/test/counter/i") == (200, "3", False)
    job.stop()
    await running


async def test_restoring_an_older_checkpoint_forgets_the_keys_of_later_ones(
    tmp_path: Path,
) -> None:
    """A key is known after a restore exactly when the restored job holds its message or its
    effects: going back to an older checkpoint (a savepoint, a damaged newest one) forgets
    the keys only later checkpoints covered."""
    job, source = idempotent_job(tmp_path, checkpoints=True)
    assert source.wal is not None
    source.wal.segment_bytes = 1  # a segment per group: complete checkpoints trim them
    running, url = await started(job, source)
    assert job.checkpoints is not None
    async with session() as http:
        assert (await post(http, f"{url}/messages/test/counter/o", key="o-1"))[0] == 202
        older = await job.checkpoints.checkpoint(savepoint=True)
        assert (await post(http, f"{url}/messages/test/counter/o", key="o-2"))[0] == 202
        assert (await post(http, f"{url}/messages/test/counter/o"))[0] == 202
        await job.checkpoints.checkpoint()
        await job.checkpoints.checkpoint()
    job.stop()
    await running
    assert not (tmp_path / "wal" / "wal-000000000002.log").exists()  # o-2's record: trimmed
    job, source = idempotent_job(tmp_path, checkpoints=True)
    job.restore_from = older.path
    running, url = await started(job, source)
    async with session() as http:
        # o-1 is in the restored state; o-2 is neither there nor in the WAL any more
        assert await post(http, f"{url}/messages/test/counter/o", key="o-1") == (
            202,
            "accepted",
            True,
        )
        assert await post(http, f"{url}/messages/test/counter/o", key="o-2") == (
            202,
            "accepted",
            False,
        )
        # o-1, the unkeyed message (replayed from the WAL's last segment), o-2, this call
        assert await post(http, f"{url}/call/test/counter/o") == (200, "4", False)
    job.stop()
    await running
