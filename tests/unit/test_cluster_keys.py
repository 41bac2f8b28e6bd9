"""The idempotency key function of a clustered HTTP ingress, as a pure core
(``cluster/_keys.decide``: a record and an event in, a decision out) and its values' codecs."""

from __future__ import annotations

import pytest

from statefun.cluster._changelog import TrackedMemoryState
from statefun.cluster._key_retention import KeyRetention, KeySweep
from statefun.cluster._keys import (
    ACCEPTED,
    BUSY,
    CONFLICT,
    DEAD,
    KEY_TYPENAME,
    MAX_WAITERS,
    RECORD_TYPENAME,
    REPLY,
    DeadLetter,
    Decision,
    KeyMessageError,
    Outcome,
    Record,
    Reply,
    Request,
    Target,
    decide,
    decode_dead_letter,
    decode_outcome,
    decode_record,
    decode_request,
    encode_dead_letter,
    encode_outcome,
    encode_record,
    encode_request,
    key_id,
)
from statefun.sdk._types import TypedValue

RETENTION = 60_000
T0 = 1_000_000
FP = b"f" * 16
OTHER_FP = b"o" * 16
TARGET = Target("ex/greeter", "dave", "io.statefun.types/string", True, b"hi")
SENDER = ("ex/greeter", "dave")


def _request(request_id: str, route: str = "call", fp: bytes = FP, until: int = T0 + 30_000):
    return Request(fp, route, TARGET, request_id, until)


def _reply(body: bytes = b"hello", sender: tuple[str, str] = SENDER) -> Reply:
    return Reply(sender, "io.statefun.types/string", True, body)


def _run(record: Record | None, event: object, now: int = T0) -> Decision:
    return decide(record, event, now, RETENTION)  # type: ignore[arg-type]


def test_a_message_is_accepted_and_forwarded_in_one_step_then_replayed() -> None:
    first = _run(None, _request("r1", "messages"))
    assert first.write and first.record is not None and first.record.result == ACCEPTED
    assert first.answers == [("r1", Outcome(ACCEPTED))]
    assert first.forward == TARGET
    again = _run(first.record, _request("r2", "messages"), T0 + 10)
    assert again.answers == [("r2", Outcome(ACCEPTED, replayed=True))]
    assert again.forward is None and not again.write


def test_another_fingerprint_is_a_conflict_and_changes_nothing() -> None:
    record = _run(None, _request("r1", "messages")).record
    conflict = _run(record, _request("r2", "messages", OTHER_FP))
    assert conflict.answers == [("r2", Outcome(CONFLICT))]
    assert conflict.forward is None and not conflict.write and conflict.record is record
    in_progress = _run(None, _request("r1")).record
    assert _run(in_progress, _request("r3", fp=OTHER_FP)).answers == [("r3", Outcome(CONFLICT))]


def test_a_call_waits_for_its_reply_which_every_waiter_gets_once() -> None:
    first = _run(None, _request("r1"))
    assert first.write and first.forward == TARGET and first.answers == []
    assert first.record is not None and first.record.in_progress
    waiting = _run(first.record, _request("r2"))
    assert waiting.write and waiting.forward is None and waiting.answers == []
    assert waiting.record is not None
    assert [w for w, _ in waiting.record.waiters] == ["r1", "r2"]
    done = _run(waiting.record, _reply())
    result = ("io.statefun.types/string", True, b"hello")
    assert done.answers == [
        ("r1", Outcome(REPLY, False, result)),
        ("r2", Outcome(REPLY, True, result)),
    ]
    assert done.write and done.record is not None and done.record.result == result
    assert done.record.waiters == [] and done.record.target is None
    later = _run(done.record, _request("r3"), T0 + 20)
    assert later.answers == [("r3", Outcome(REPLY, True, result))] and later.forward is None
    # a second message to the caller is not a new outcome
    assert _run(done.record, _reply(b"again")).answers == []


def test_a_message_from_another_address_is_not_the_reply() -> None:
    record = _run(None, _request("r1")).record
    stray = _run(record, _reply(sender=("ex/other", "dave")))
    assert stray.answers == [] and not stray.write
    accepted = _run(None, _request("r1", "messages")).record
    assert _run(accepted, _reply()).answers == []  # a /messages target answering its caller


def test_waiters_past_their_deadline_are_not_answered_nor_counted() -> None:
    record = _run(None, _request("r1", until=T0 + 100)).record
    record = _run(record, _request("r2", until=T0 + 100_000), T0 + 50).record
    done = _run(record, _reply(), T0 + 200)
    assert [request_id for request_id, _ in done.answers] == ["r2"]
    assert done.answers[0][1].replayed  # r2 was not the request that ran the function


def test_waiters_are_bounded() -> None:
    record = _run(None, _request("r0")).record
    for n in range(1, MAX_WAITERS):
        record = _run(record, _request(f"r{n}")).record
    full = _run(record, _request("late"))
    [(request_id, outcome)] = full.answers
    assert request_id == "late" and outcome.kind == BUSY and not full.write
    gone = _run(record, _request("later"), T0 + 40_000)  # the others stopped waiting
    assert gone.answers == [] and gone.record is not None
    assert [w for w, _ in gone.record.waiters] == ["later"]


def test_a_dead_letter_answers_the_first_and_forwards_again_for_the_others() -> None:
    record = _run(None, _request("r1")).record
    record = _run(record, _request("r2")).record
    dead = _run(record, DeadLetter(SENDER, "dead letter 3: boom"))
    assert dead.answers == [("r1", Outcome(DEAD, detail="dead letter 3: boom"))]
    assert dead.forward == TARGET and dead.write and dead.record is not None
    assert [w for w, _ in dead.record.waiters] == ["r2"]
    last = _run(dead.record, DeadLetter(SENDER, "dead letter 4: boom"))
    assert last.answers == [("r2", Outcome(DEAD, detail="dead letter 4: boom"))]
    assert last.write and last.record is None and last.forward is None  # forgotten
    assert _run(None, _request("r3")).forward == TARGET  # so a retry is processed


def test_a_dead_letter_of_a_message_route_or_another_target_changes_nothing() -> None:
    accepted = _run(None, _request("r1", "messages")).record
    assert _run(accepted, DeadLetter(SENDER, "x")) == Decision(accepted)
    record = _run(None, _request("r1")).record
    assert _run(record, DeadLetter(("ex/other", "x"), "x")) == Decision(record)


def test_a_key_past_its_retention_is_unseen_and_deleted() -> None:
    record = _run(None, _request("r1", "messages")).record
    assert _run(record, _request("r2", "messages"), T0 + RETENTION - 1).answers == [
        ("r2", Outcome(ACCEPTED, True))
    ]
    fresh = _run(record, _request("r2", "messages", OTHER_FP), T0 + RETENTION)
    assert fresh.forward == TARGET and fresh.answers == [("r2", Outcome(ACCEPTED))]
    assert fresh.write and fresh.record is not None
    assert fresh.record.accepted_ms == T0 + RETENTION and fresh.record.fingerprint == OTHER_FP
    calling = _run(None, _request("r1")).record
    late = _run(calling, _reply(), T0 + RETENTION)  # the reply after the key expired
    assert late.write and late.record is None and late.answers == []


def test_values_round_trip() -> None:
    request = decode_request(encode_request(FP, "call", TARGET, T0), "r1")
    assert request == Request(FP, "call", TARGET, "r1", T0)
    record = Record(FP, "call", T0, TARGET, None, [("r1", T0 + 5), ("r2", T0 + 6)])
    assert decode_record(encode_record(record)) == record
    done = Record(FP, "call", T0, None, ("t/T", False, b""))
    assert decode_record(encode_record(done)) == done
    accepted = Record(FP, "messages", T0, result=ACCEPTED)
    assert decode_record(encode_record(accepted)) == accepted
    for outcome in (
        Outcome(ACCEPTED, True),
        Outcome(REPLY, False, ("t/T", True, b"x")),
        Outcome(CONFLICT),
        Outcome(DEAD, detail="dead letter 1: why"),
        Outcome(BUSY, detail="many"),
    ):
        assert decode_outcome(encode_outcome(outcome)) == outcome
    assert decode_dead_letter(encode_dead_letter(SENDER, "why")) == DeadLetter(SENDER, "why")
    assert key_id("shop/http", "k:1") == "shop/http:k:1"


@pytest.mark.parametrize(
    ("decode", "data", "says"),
    [
        (lambda d: decode_request(d, "r"), b"\xc1", "not msgpack"),
        (decode_record, encode_outcome(Outcome(ACCEPTED)), "not 7 fields"),
        (decode_outcome, encode_dead_letter(SENDER, "x"), "not 4 fields"),
        (lambda d: decode_request(d, "r"), encode_request(FP, "put", TARGET, 1), "route"),
    ],
)
def test_values_that_are_not_the_key_functions_are_one_line_errors(
    decode: object, data: bytes, says: str
) -> None:
    with pytest.raises(KeyMessageError, match=says) as caught:
        decode(data)  # type: ignore[operator]
    assert "\n" not in str(caught.value)


# -- retention and bounds per key group (``_key_retention.py``) on the worker's state backend --


def _state_with(keys: dict[str, Record]) -> TrackedMemoryState:
    state = TrackedMemoryState()
    for id_, record in keys.items():
        value = TypedValue(RECORD_TYPENAME, encode_record(record))
        state.restore_put(0, (KEY_TYPENAME, id_), {"record": value})
    state.restore_put(0, ("ex/greeter", "dave"), {"seen": TypedValue("t/T", b"1")})
    return state


def _keys_of(state: TrackedMemoryState) -> list[str]:
    return sorted(id_ for (typename, id_), _ in state.items(0) if typename == KEY_TYPENAME)


def _accepted(at: int, reply: bytes | None = None) -> Record:
    if reply is None:
        return Record(FP, "messages", at, result=ACCEPTED)
    return Record(FP, "call", at, result=("t/T", True, reply))


def test_expired_keys_of_the_key_group_are_deleted_when_one_of_it_is_seen() -> None:
    state = _state_with({"old": _accepted(T0), "new": _accepted(T0 + 500)})
    retention = KeyRetention(state, 1, 1_000, 100, 1 << 20)
    retention.seen("now", _accepted(T0 + 1_200), T0 + 1_200)
    assert _keys_of(state) == ["new"]  # ("now" is written by the dispatcher after the call)
    assert state.take_changed() == {(0, (KEY_TYPENAME, "old"))}  # a tombstone in the changelog
    assert (retention.expired, retention.evicted, len(retention)) == (1, 0, 2)
    assert state.get(0, ("ex/greeter", "dave")) is not None  # other functions' state stays


def test_the_oldest_keys_go_past_the_key_groups_share_of_the_bounds() -> None:
    # (max_parallelism 1: one key group, with the whole bound)
    state = _state_with({f"k{n}": _accepted(T0 + n) for n in range(3)})
    retention = KeyRetention(state, 1, RETENTION, 3, 1 << 20)
    retention.seen("k3", _accepted(T0 + 3), T0 + 3)
    assert _keys_of(state) == ["k1", "k2"] and retention.evicted == 1
    state.restore_put(0, (KEY_TYPENAME, "k3"), {"x": TypedValue("t/T", b"")})
    retention.seen("k1", _accepted(T0 + 1), T0 + 10)  # seen again: keeps its place
    retention.seen("k4", _accepted(T0 + 11), T0 + 11)
    assert _keys_of(state) == ["k2", "k3"]  # k1 was still the oldest
    # reply bytes: a 600-byte reply in a group allowed 1,000 pushes the older replies out
    state = _state_with({"a": _accepted(T0, b"x" * 300), "b": _accepted(T0 + 1, b"y" * 300)})
    retention = KeyRetention(state, 1, RETENTION, 100, 1_000)
    retention.seen("c", _accepted(T0 + 2, b"z" * 600), T0 + 2)
    assert _keys_of(state) == ["b"] and retention.evicted == 1
    assert KeyRetention(state, 128, RETENTION, 1_000_000, 256 << 20).max_keys == 7813


# -- the sweep: expired keys deleted with no traffic -------------------------------------------


def _spread(state: TrackedMemoryState, key_group: int, keys: dict[str, Record]) -> None:
    for id_, record in keys.items():
        value = TypedValue(RECORD_TYPENAME, encode_record(record))
        state.restore_put(key_group, (KEY_TYPENAME, id_), {"record": value})


def test_the_sweep_deletes_expired_keys_of_every_owned_key_group_with_no_request() -> None:
    state = TrackedMemoryState()
    _spread(state, 0, {"a0": _accepted(T0), "b0": _accepted(T0 + 900)})
    _spread(state, 1, {"a1": _accepted(T0 + 100, b"reply")})
    _spread(state, 2, {"a2": _accepted(T0)})  # not this worker's key group
    state.restore_put(1, ("ex/greeter", "dave"), {"seen": TypedValue("t/T", b"1")})
    retention = KeyRetention(state, 4, 1_000, 100, 1 << 20, key_groups=[0, 1])
    assert retention.sweep(T0 + 999) == 0  # nothing expired yet
    assert state.take_changed() == set()
    assert retention.sweep(T0 + 1_100) == 2  # a0 and a1, with no key function run
    assert state.take_changed() == {(0, (KEY_TYPENAME, "a0")), (1, (KEY_TYPENAME, "a1"))}
    assert state.get(0, (KEY_TYPENAME, "b0")) is not None
    assert state.get(2, (KEY_TYPENAME, "a2")) is not None  # another worker's to delete
    assert state.get(1, ("ex/greeter", "dave")) is not None
    assert retention.expired == 2 and len(retention) == 1
    assert retention.sweep(T0 + 1_900) == 1 and state.get(0, (KEY_TYPENAME, "b0")) is None


def test_a_sweep_does_bounded_work_and_the_next_goes_on_where_it_stopped() -> None:
    state = TrackedMemoryState()
    _spread(state, 0, {f"k{n}": _accepted(T0 + n) for n in range(5)})
    _spread(state, 1, {f"j{n}": _accepted(T0 + n) for n in range(3)})
    retention = KeyRetention(state, 2, 1_000, 100, 1 << 20, key_groups=[0, 1])
    later = T0 + 2_000
    # budget 8: 5 addresses read to index key group 0, then 3 deletions; it stops there
    assert retention.sweep(later, budget=8) == 3
    assert sorted(id_ for (_, id_), _ in state.items(0)) == ["k3", "k4"]
    assert len(list(state.items(1))) == 3  # not reached
    # the next starts with key group 0 again (still expired keys), then indexes group 1 (3)
    assert retention.sweep(later, budget=6) == 3
    assert list(state.items(0)) == [] and len(list(state.items(1))) == 2
    assert retention.sweep(later, budget=6) == 2
    assert retention.expired == 8 and len(retention) == 0
    # an indexed key group with nothing expired costs one look: a sweep of many is cheap
    assert retention.sweep(later, budget=1) == 0


def test_the_sweep_runs_every_interval_of_the_jobs_clock() -> None:
    state = TrackedMemoryState()
    _spread(state, 0, {"a": _accepted(T0), "b": _accepted(T0 + 3_000)})
    now = [T0]
    sweep = KeySweep(KeyRetention(state, 1, 1_000, 100, 1 << 20, [0]), lambda: now[0], 500)
    assert sweep.tick() == 0  # not due
    now[0] = T0 + 1_000
    assert sweep.tick() == 1 and sweep.tick() == 0  # "a"; then not due again
    now[0] = T0 + 4_000
    assert sweep.tick() == 1 and sweep.deleted == 2
