"""Replies between workers: request ids naming the connection's instance, reply records and
their decoding, and the reader's handling of records that are not replies (skipped with one
rate-limited line, never an exception)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from statefun._exceptions import UndeliverableError
from statefun._settings import Settings
from statefun.cluster import cluster_config
from statefun.cluster._config import ClusterConfig
from statefun.cluster._replies import (
    RepliesReader,
    ReplyRecordError,
    decode_reply,
    instance_of,
    new_instance,
    replies_partition,
    reply_row,
    request_prefix,
)
from statefun.sdk._types import TypedValue


def _config(partitions: int = 8) -> ClusterConfig:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:9092",
            "cluster.job_id": "shop",
            "cluster.worker_id": "w0",
            "cluster.partitions": str(partitions),
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    return config


def test_a_request_id_names_its_instance() -> None:
    instance = new_instance()
    assert len(instance) == 16 and instance != new_instance()
    request_id = f"{request_prefix(instance, 2)}-17"
    assert instance_of(request_id) == instance
    for other in ("", "abc-1", f"{instance}-1", f"{instance}.0", f"{instance}.0-x", "1a2b3c4d-5"):
        assert instance_of(other) is None, other
    assert instance_of(f"{instance.upper()}.0-1") is None


def test_a_reply_record_round_trips_to_its_instances_partition() -> None:
    config = _config()
    instance = new_instance()
    request_id = f"{request_prefix(instance, 0)}-3"
    topic, key, value, headers = reply_row(config, request_id, TypedValue("ex/T", b"\x00\x01"))
    assert topic == "pystatefun.shop.replies" and headers is None
    assert key == f"{replies_partition(config, instance)}:{instance}"
    assert 0 <= replies_partition(config, instance) < 8
    got_instance, got_id, reply = decode_reply(key.encode(), value)
    assert (got_instance, got_id) == (instance, request_id)
    assert (reply.typename, reply.has_value, reply.value) == ("ex/T", True, b"\x00\x01")
    value = reply_row(config, request_id, TypedValue("ex/T", None))[2]
    empty = decode_reply(None, value)[2]
    assert (empty.has_value, empty.value) == (False, b"")


def test_a_dead_lettered_call_travels_as_its_reason() -> None:
    config = _config()
    instance = new_instance()
    request_id = f"{request_prefix(instance, 1)}-4"
    reason = "dead letter 7: function failed"
    _, key, value, _ = reply_row(config, request_id, UndeliverableError(reason))
    got_instance, got_id, reply = decode_reply(key.encode(), value)
    assert (got_instance, got_id) == (instance, request_id)
    assert isinstance(reply, UndeliverableError) and str(reply) == reason


def test_a_reply_to_an_id_of_no_instance_is_refused() -> None:
    with pytest.raises(ReplyRecordError, match="not a clustered request id"):
        reply_row(_config(), "1a2b3c4d-5", TypedValue("ex/T", b""))


def _packed(fields: Any) -> bytes:
    return bytes(msgpack.packb(fields, use_bin_type=True))


INSTANCE = "0123456789abcdef"
GOOD_ID = f"{INSTANCE}.0-1"
BAD_RECORDS = [
    (None, None, "a record without a value"),
    (None, b"\xc1", "not msgpack"),
    (None, _packed({"a": 1}), "not a reply record"),
    (None, _packed([2, GOOD_ID, "ex/T", True, b""]), "not a reply record"),
    (None, _packed([1, 7, "ex/T", True, b""]), "its request id is not text"),
    (None, _packed([1, GOOD_ID, "", True, b""]), "its typename is not text"),
    (None, _packed([2, GOOD_ID, 5]), "its dead letter's reason is not text"),
    (None, _packed([2, None, "why"]), "its request id is not text"),
    (None, _packed([1, GOOD_ID, "ex/T", 1, b""]), "its value is not bytes"),
    (None, _packed([1, GOOD_ID, "ex/T", True, "text"]), "its value is not bytes"),
    (None, _packed([1, "x" * 500, "ex/T", True, b""]), "is not a clustered request id"),
    (b"3:fedcba9876543210", _packed([1, GOOD_ID, "ex/T", True, b""]), "key does not name"),
]


@pytest.mark.parametrize(("key", "value", "reason"), BAD_RECORDS)
def test_a_record_that_is_not_a_reply_says_why_in_one_line(
    key: bytes | None, value: bytes | None, reason: str
) -> None:
    with pytest.raises(ReplyRecordError) as caught:
        decode_reply(key, value)
    assert reason in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_the_reader_delivers_its_own_replies_and_logs_bad_records_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config()
    delivered: list[tuple[str, Any]] = []
    reader = RepliesReader(config, INSTANCE, lambda rid, v: delivered.append((rid, v)))
    mine = reply_row(config, GOOD_ID, TypedValue("ex/T", b"ok"))
    theirs = reply_row(config, "fedcba9876543210.0-1", TypedValue("ex/T", b"no"))
    with caplog.at_level(logging.WARNING, logger="statefun.cluster._replies"):
        for key, value, _ in BAD_RECORDS:
            reader.handle(key, value)  # never raises
        reader.handle(theirs[1].encode(), theirs[2])
        reader.handle(mine[1].encode(), mine[2])
    assert [(rid, v.value) for rid, v in delivered] == [(GOOD_ID, b"ok")]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines  # rate-limited: one line for the burst
    assert "not a reply; skipped: a record without a value" in lines[0]


def test_a_repeating_warning_is_one_line_per_interval_counting_the_rest(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statefun._kafka import _throttle
    from statefun.cluster._replies import RateLimitedLog

    now = [1000.0]
    monkeypatch.setattr(_throttle, "time", SimpleNamespace(monotonic=lambda: now[0]))
    limited = RateLimitedLog("idempotency key")
    with caplog.at_level(logging.WARNING, logger="statefun.cluster._replies"):
        limited.warn("first")
        for _ in range(3):
            now[0] += 1
            limited.warn("held back")
        now[0] += 10
        limited.warn("again")
    assert [r.getMessage() for r in caplog.records] == [
        "cluster: idempotency key: first",
        "cluster: idempotency key: again (and 3 more since the last line)",
    ]
