"""Idempotency keys across savepoints, as pure conversions (``cluster/_key_savepoints.py``): a
stopped clustered job's key records into a single-process HTTP ingress's position, which the
single-process ingress itself loads, and a single-process savepoint's keys (position and key
log) into key records of their key groups."""

from __future__ import annotations

import asyncio
from typing import Any

from statefun._addresses import REPLY_TYPENAME
from statefun._keygroups import key_group_for
from statefun.cluster._key_savepoints import export_keys, seed_keys
from statefun.cluster._keys import (
    ACCEPTED,
    KEY_TYPENAME,
    RECORD_TYPENAME,
    REQUEST_TYPENAME,
    Record,
    Target,
    decode_record,
    encode_record,
    encode_request,
    key_id,
)
from statefun.ingress._idempotency import IdempotentRequests
from statefun.runtime._envelope import Envelope
from statefun.sdk._spec import address_of
from statefun.sdk._types import TypedValue
from statefun.state._expiring import ExpiringValue

INGRESS = "shop/http"
RETENTION = 60_000
NOW = 10_000_000
MAX_P = 8
STRING = "io.statefun.types/string"
FP = bytes(range(16))
REPLY = (STRING, True, b"hello")


def _state(kid: str, record: Record) -> tuple[int, tuple[str, str], dict[str, Any]]:
    typed = TypedValue(RECORD_TYPENAME, encode_record(record))
    values = {"record": ExpiringValue(typed, record.accepted_ms + RETENTION)}
    return (key_group_for(KEY_TYPENAME, kid, MAX_P), (KEY_TYPENAME, kid), values)


def _to(typename: str, id_: str, body: bytes, caller: tuple[str, str] | None) -> Envelope:
    sender = None if caller is None else address_of(caller)
    return Envelope(typename, id_, TypedValue(STRING, body), sender)


def _kid(key: str) -> str:
    return key_id(INGRESS, key)


def _clustered() -> tuple[list[Any], list[Envelope], list[Any]]:
    """A stopped clustered job's keys: done ones, one completed by a reply in flight, one in
    progress with its message in flight, an expired one, one of an ingress that is gone; a
    request in flight to a key and a delayed message to one."""
    target = Target("shop/greeter", "ada", STRING, True, b"hi")
    state = [
        _state(_kid("m1"), Record(FP, "messages", NOW - 5_000, result=ACCEPTED)),
        _state(_kid("c1"), Record(FP, "call", NOW - 4_000, result=REPLY)),
        _state(_kid("c2"), Record(FP, "call", NOW - 3_000, target=target, waiters=[("r", 1)])),
        _state(_kid("c3"), Record(FP, "call", NOW - 2_000, target=target)),
        _state(_kid("old"), Record(FP, "messages", NOW - RETENTION, result=ACCEPTED)),
        _state(key_id("gone/http", "x"), Record(FP, "messages", NOW, result=ACCEPTED)),
        (0, ("shop/greeter", "ada"), {"n": TypedValue(STRING, b"1")}),
    ]
    request = TypedValue(REQUEST_TYPENAME, encode_request(FP, "call", target, NOW + 10))
    messages = [
        _to(KEY_TYPENAME, _kid("c2"), b"hey", ("shop/greeter", "ada")),  # c2's reply
        _to("shop/greeter", "ada", b"hi", (KEY_TYPENAME, _kid("c3"))),  # c3's call
        _to("shop/greeter", "bob", b"hi", (KEY_TYPENAME, _kid("m1"))),  # m1's message
        Envelope(KEY_TYPENAME, _kid("new"), request, address_of((REPLY_TYPENAME, "w.x-1"))),
        _to("shop/greeter", "eve", b"plain", None),
    ]
    timers = [
        (NOW + 1, ("shop/greeter", "ada"), "t1", _to(KEY_TYPENAME, _kid("c3"), b"x", None)),
        (NOW + 2, ("shop/greeter", "ada"), "t2", _to("shop/greeter", "ada", b"x", None)),
    ]
    return state, messages, timers


def test_a_clustered_jobs_keys_become_the_ingress_position_of_one_process() -> None:
    state, messages, timers = _clustered()
    out = export_keys([INGRESS], state, messages, timers, RETENTION, NOW)
    assert [entry[1] for entry in out.state] == [("shop/greeter", "ada")]
    position = out.positions[INGRESS]
    assert position["seq"] == 0 and position["keys"]["cut"] == 0
    entries = {e[0]: e for e in position["keys"]["entries"]}
    assert sorted(entries) == ["c1", "c2", "c3", "m1"]  # "old" expired, "gone/http" dropped
    assert out.keys == 4 and out.dropped == 2
    assert entries["m1"] == ["m1", FP.hex(), "messages", NOW - 5_000, None, ACCEPTED]
    assert entries["c1"][5] == [STRING, True, "aGVsbG8="]  # base64 of the reply
    assert entries["c2"][5] == [STRING, True, "aGV5"]  # completed by its reply in flight
    request_id = entries["c3"][4]
    assert request_id is not None and entries["c3"][5] is None  # in progress
    # the messages: no key's, the call's caller is its request, the message's has none
    callers = {(m.typename, m.id): m.caller for m in out.messages}
    assert sorted(callers) == [
        ("shop/greeter", "ada"),
        ("shop/greeter", "bob"),
        ("shop/greeter", "eve"),
    ]
    assert callers[("shop/greeter", "ada")] == address_of((REPLY_TYPENAME, request_id))
    assert callers[("shop/greeter", "bob")] is None
    assert [t[2] for t in out.timers] == ["t2"]


async def test_the_single_process_ingress_loads_the_exported_keys() -> None:
    state, messages, timers = _clustered()
    out = export_keys([INGRESS], state, messages, timers, RETENTION, NOW)
    replies: dict[str, asyncio.Future[Any]] = {}
    keys = IdempotentRequests(INGRESS, 3600, 100, 1 << 20, None, replies, clock=lambda: NOW / 1000)
    keys.log = _NoLog()  # type: ignore[assignment]  # (as with checkpoints on, no files)
    keys.restore(out.positions[INGRESS]["keys"])
    keys.load([], [], 0)
    store = keys.store
    assert store.peek("m1").result == ACCEPTED  # type: ignore[union-attr]
    assert store.peek("c1").result == REPLY  # type: ignore[union-attr]
    in_progress = store.peek("c3")
    assert in_progress is not None and in_progress.result is None
    future = replies[str(in_progress.request_id)]
    future.set_result(TypedValue(STRING, b"done"))  # the restored call's reply
    await asyncio.sleep(0)
    assert in_progress.result == (STRING, True, b"done")


class _NoLog:
    def load(self, max_tag: int) -> list[Any]:
        return []


def _seeded(records: dict[str, Any]) -> dict[str, Record]:
    return {key[1]: decode_record(values["record"].value) for _, key, values in records}


def test_a_single_process_savepoints_keys_seed_key_records() -> None:
    b64 = "aGVsbG8="
    position = {
        "seq": 9,
        "keys": {
            "cut": 4,
            "entries": [
                ["c1", FP.hex(), "call", NOW - 100, None, [STRING, True, b64]],
                ["m2", FP.hex(), "messages", NOW - 90, None, ACCEPTED],
                ["c2", FP.hex(), "call", NOW - 80, "p-7", None],  # its message is in flight
                ["c3", FP.hex(), "call", NOW - 70, "p-8", None],  # its message is not
            ],
        },
    }
    logged = [
        [1, "c1", FP, "call", NOW - 5_000, None, [STRING, True, b"old"]],  # the later wins
        [2, "m1", FP, "messages", NOW - 4_000, None, ACCEPTED],
        [3, "old", FP, "messages", NOW - RETENTION, None, ACCEPTED],
    ]
    messages = [
        _to("shop/greeter", "ada", b"hi", (REPLY_TYPENAME, "p-7")),
        _to("shop/greeter", "bob", b"hi", (REPLY_TYPENAME, "p-99")),  # a call without a key
    ]
    seeded = seed_keys({INGRESS: position}, {INGRESS: logged}, messages, MAX_P, RETENTION, NOW)
    records = _seeded(seeded.state)  # type: ignore[arg-type]
    assert sorted(records) == [_kid("c1"), _kid("c2"), _kid("m1"), _kid("m2")]
    assert seeded.dropped == 2  # "old" expired, c3 without its message
    assert records[_kid("c1")].result == REPLY and records[_kid("c1")].accepted_ms == NOW - 100
    assert records[_kid("m1")].result == ACCEPTED
    c2 = records[_kid("c2")]
    assert c2.in_progress and c2.target == Target("shop/greeter", "ada", STRING, True, b"hi")
    assert [m.caller for m in seeded.messages] == [
        address_of((KEY_TYPENAME, _kid("c2"))),
        address_of((REPLY_TYPENAME, "p-99")),
    ]
    for key_group, key, values in seeded.state:
        assert key_group == key_group_for(KEY_TYPENAME, key[1], MAX_P)
        stored = values["record"]
        assert (
            stored.deadline_ms
            == _seeded([(key_group, key, values)])[key[1]].accepted_ms + RETENTION
        )


def test_keys_go_from_a_clustered_job_to_one_process_and_back_unchanged() -> None:
    state, messages, timers = _clustered()
    out = export_keys([INGRESS], state, messages, timers, RETENTION, NOW)
    back = seed_keys(out.positions, {}, out.messages, MAX_P, RETENTION, NOW)
    before = {
        kid: r
        for kid, r in _seeded(export_state_of(state)).items()
        if kid in (_kid("m1"), _kid("c1"))
    }
    after = _seeded(back.state)  # type: ignore[arg-type]
    for kid, record in before.items():
        assert (after[kid].fingerprint, after[kid].route, after[kid].result) == (
            record.fingerprint,
            record.route,
            record.result,
        )
    assert after[_kid("c2")].result == (STRING, True, b"hey")
    c3 = after[_kid("c3")]  # in progress again, its call's caller the key once more
    assert c3.in_progress and c3.target is not None and c3.target.id == "ada"
    ada = next(m for m in back.messages if m.id == "ada")
    assert ada.caller == address_of((KEY_TYPENAME, _kid("c3")))


def export_state_of(state: list[Any]) -> list[Any]:
    return [entry for entry in state if entry[1][0] == KEY_TYPENAME]
