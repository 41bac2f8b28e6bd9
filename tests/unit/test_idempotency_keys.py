"""The HTTP ingress's idempotency keys: the in-memory store and its durable log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from statefun.ingress._idempotency import IdempotentRequests
from statefun.ingress._keystore import (
    ACCEPTED,
    KeyLog,
    KeyStore,
    check_key,
    fingerprint,
)
from statefun.sdk._types import TypedValue

FP = b"f" * 16


def keys_in(directory: Path, max_tag: int) -> list[str]:
    log = KeyLog(directory)
    try:
        return [record[1] for record in log.load(max_tag)]
    finally:
        log.close()


def test_a_completed_key_is_found_until_its_retention_ends() -> None:
    store = KeyStore(retention_ms=1_000, max_keys=10, max_reply_bytes=1 << 20)
    entry = store.begin("k1", FP, "messages", now_ms=0)
    assert store.get("k1", now_ms=10) is entry and entry.result is None
    store.complete(entry, ACCEPTED)
    assert store.get("k1", now_ms=999) is entry and entry.result == ACCEPTED
    assert store.get("k1", now_ms=1_000) is None
    assert len(store) == 0


def test_the_oldest_keys_go_first_when_the_bound_is_reached() -> None:
    store = KeyStore(retention_ms=10_000, max_keys=3, max_reply_bytes=1 << 20)
    for n in range(5):
        store.complete(store.begin(f"k{n}", FP, "messages", now_ms=n), ACCEPTED)
    assert [store.get(f"k{n}", now_ms=5) is not None for n in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert store.evicted == 2


def test_stored_replies_are_bounded_in_bytes() -> None:
    store = KeyStore(retention_ms=10_000, max_keys=100, max_reply_bytes=250)
    for n in range(4):
        entry = store.begin(f"k{n}", FP, "call", now_ms=n)
        store.complete(entry, ("t/reply", True, bytes(100)))
    # 4 x 100 bytes > 250: the oldest two replies (and their keys) are gone
    assert store.get("k0", 5) is None and store.get("k1", 5) is None
    assert store.get("k2", 5) is not None and store.get("k3", 5) is not None
    assert store.reply_bytes == 200


def test_an_abandoned_key_is_forgotten_and_its_waiters_hear_it() -> None:
    async def scenario() -> None:
        store = KeyStore(retention_ms=1_000, max_keys=10, max_reply_bytes=1 << 20)
        entry = store.begin("k", FP, "messages", now_ms=0)
        waiter = asyncio.ensure_future(store.wait(entry))
        await asyncio.sleep(0)
        store.abandon(entry)
        assert await waiter is None
        assert store.get("k", 1) is None

    asyncio.run(scenario())


def test_waiters_get_the_result() -> None:
    async def scenario() -> None:
        store = KeyStore(retention_ms=1_000, max_keys=10, max_reply_bytes=1 << 20)
        entry = store.begin("k", FP, "call", now_ms=0)
        waiters = [asyncio.ensure_future(store.wait(entry)) for _ in range(3)]
        await asyncio.sleep(0)
        store.complete(entry, ("t/r", True, b"x"))
        assert await asyncio.gather(*waiters) == [("t/r", True, b"x")] * 3
        assert await store.wait(entry) == ("t/r", True, b"x")  # done already: at once

    asyncio.run(scenario())


def test_fingerprints_differ_by_route_target_type_and_body() -> None:
    base = fingerprint("messages", "a/b", "1", TypedValue("t/x", b"v"))
    assert base == fingerprint("messages", "a/b", "1", TypedValue("t/x", b"v"))
    for other in (
        fingerprint("call", "a/b", "1", TypedValue("t/x", b"v")),
        fingerprint("messages", "a/c", "1", TypedValue("t/x", b"v")),
        fingerprint("messages", "a/b", "2", TypedValue("t/x", b"v")),
        fingerprint("messages", "a/b", "1", TypedValue("t/y", b"v")),
        fingerprint("messages", "a/b", "1", TypedValue("t/x", b"w")),
        fingerprint("messages", "a/b", "1", TypedValue("t/x", None)),
        fingerprint("messages", "a/b", "1", TypedValue("t/x", b"")),
    ):
        assert other != base
    # an id holding the separator-like characters cannot pass for another address
    assert fingerprint("messages", "a/b", "1:x", TypedValue("t", b"")) != fingerprint(
        "messages", "a/b", "1", TypedValue(":xt", b"")
    )


@pytest.mark.parametrize(
    ("key", "problem"),
    [("", "empty"), ("x" * 256, "255"), ("a\x01b", "printable"), ("ключ", "printable")],
)
def test_malformed_keys_are_named(key: str, problem: str) -> None:
    message = check_key(key)
    assert message is not None and problem in message


def test_good_keys_pass() -> None:
    assert check_key("4c6f6e67-2d6b-6579-0000-000000000001") is None
    assert check_key("order 17/attempt") is None


def test_the_log_keeps_entries_across_reopening(tmp_path: Path) -> None:
    log = KeyLog(tmp_path)
    log.open()
    log.append(
        [
            [1, "k1", FP, "messages", 10, None, 1],
            [1, "k2", FP, "call", 11, "r-1", ["t/r", True, b"reply"]],
        ]
    )
    log.append([[2, "k3", FP, "messages", 12, None, 1]])
    log.close()
    assert keys_in(tmp_path, max_tag=2) == ["k1", "k2", "k3"]


def test_the_log_forgets_entries_of_cuts_after_the_restored_one(tmp_path: Path) -> None:
    """Restoring an older checkpoint drops the keys of later ones, for good (the cut numbers
    that follow are used again)."""
    log = KeyLog(tmp_path)
    log.open()
    log.append([[1, "k1", FP, "messages", 10, None, 1]])
    log.append([[2, "k2", FP, "messages", 11, None, 1]])
    log.close()
    again = KeyLog(tmp_path)
    assert [r[1] for r in again.load(max_tag=1)] == ["k1"]
    again.append([[2, "k3", FP, "messages", 12, None, 1]])
    again.close()
    assert keys_in(tmp_path, max_tag=2) == ["k1", "k3"]


def test_the_log_cuts_off_a_torn_tail(tmp_path: Path) -> None:
    log = KeyLog(tmp_path)
    log.open()
    log.append([[1, "k1", FP, "messages", 10, None, 1]])
    log.append([[1, "k2", FP, "messages", 11, None, 1]])
    log.close()
    (segment,) = tmp_path.glob("keys-*.log")
    segment.write_bytes(segment.read_bytes()[:-3])
    again = KeyLog(tmp_path)
    assert [r[1] for r in again.load(max_tag=1)] == ["k1"]
    again.append([[2, "k3", FP, "messages", 12, None, 1]])
    again.close()
    assert keys_in(tmp_path, max_tag=2) == ["k1", "k3"]


def test_the_log_drops_whole_files_past_retention_or_bound(tmp_path: Path) -> None:
    log = KeyLog(tmp_path, segment_bytes=1)  # every append starts a new file
    log.open()
    for n in range(5):
        log.append([[1, f"k{n}", FP, "messages", n * 100, None, 1]])
    assert len(list(tmp_path.glob("keys-*.log"))) == 5
    # retention: files whose newest entry is older than 1,000 ms at time 1,150 go
    assert log.prune(now_ms=1_150, retention_ms=1_000, max_keys=100) == 2
    # bound: files older than the newest 2 keys' files go
    assert log.prune(now_ms=1_150, retention_ms=1_000, max_keys=2) == 1
    log.close()
    assert keys_in(tmp_path, max_tag=1) == ["k3", "k4"]


def test_a_logged_message_whose_request_was_cancelled_keeps_its_key() -> None:
    """The job stopping may cancel a request while its WAL record is being written: the
    record still counts, and so does its key."""

    async def scenario() -> None:
        requests = IdempotentRequests("test/http", 60.0, 10, 1 << 20, None, {})
        value = TypedValue("t/x", b"v")
        fp = fingerprint("messages", "a/b", "1", value)
        entry = requests.store.begin("k", fp, "messages", requests.now_ms())
        fields = requests.wal_fields(entry)
        requests.store.abandon(entry)  # what a cancelled request leaves
        requests.emitted("k", None, fields)
        again = requests.store.get("k", requests.now_ms())
        assert again is not None and again.result == ACCEPTED and again.fingerprint == fp

    asyncio.run(scenario())


def test_a_call_whose_reply_was_released_is_cut_with_its_reply(tmp_path: Path) -> None:
    """A checkpoint releases its replies and the next one may be cut in the same loop step,
    before the futures' callbacks run: the cut records the call with its reply, not in
    progress (a restore would wait for a reply its restored job no longer owes)."""

    async def scenario() -> None:
        replies: dict[str, asyncio.Future[object]] = {}
        requests = IdempotentRequests("test/http", 60.0, 10, 1 << 20, tmp_path, replies)
        value = TypedValue("t/x", b"v")
        entry = requests.store.begin(
            "k", fingerprint("call", "a/b", "1", value), "call", requests.now_ms()
        )
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        requests.calling(entry, "r-1", future)
        requests.emitted("k", "r-1")
        future.set_result(TypedValue("t/reply", b"42"))  # released; its callback is pending
        cut = requests.snapshot()
        assert cut is not None
        [(key, _, route, _, request_id, result)] = cut["entries"]
        assert (key, route, request_id) == ("k", "call", "r-1")
        assert result == ["t/reply", True, "NDI="]  # base64 of b"42"
        await asyncio.sleep(0)  # the callback runs now: it records nothing twice
        assert requests.snapshot() == {"cut": 2, "entries": [cut["entries"][0]]}
        assert requests.store.reply_bytes == 2

    asyncio.run(scenario())
