"""The compiled hot loops (statefun/_hotloops.c) against the Python loops they stand in for.

Each loop runs the same inputs both ways, ordinary and odd ones (Hypothesis), and must give the
same results: the same values, the same stopping point, the same exception. The compiled side
is the extension as built into this install; a machine with a C compiler must have built it.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import sysconfig
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statefun._compiled import NO_EXTENSIONS_VARIABLE, hot_loops, load_hot_loops
from statefun._exceptions import MalformedResponseError
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.egress import _kafka_librdkafka
from statefun.egress import kafka as kafka_egress
from statefun.egress.kafka import KAFKA_PRODUCER_RECORD, KafkaSink
from statefun.ingress import _kafka_runs
from statefun.ingress._kafka_runs import Fields, python_messages
from statefun.module._specs import FunctionTarget, HttpEndpointSpec, ModuleSpec
from statefun.runtime import Job, _dispatcher, _remote
from statefun.runtime._dispatcher import group_egress
from statefun.runtime._envelope import Envelope
from statefun.runtime._remote import encode_to_function, invocation
from statefun.sdk import TypedValue
from statefun.sdk._proto import request_reply_pb2 as pb

COMPILED = load_hot_loops({})  # (whatever the environment says: the tests compare both)

needs_compiled = pytest.mark.skipif(
    COMPILED is None, reason="the compiled hot loops are not built in this install"
)


def test_an_install_with_a_c_compiler_has_the_compiled_loops() -> None:
    """The build compiles them wherever it can (setup.py): a C compiler and Python's headers
    here mean they must be there, so that the tests below compare both sides."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) and headers.exists():
        assert COMPILED is not None, "statefun/_hotloops.c was not built: see the install log"


def test_the_environment_turns_them_off() -> None:
    for on in ("1", "true", "yes", " ON "):
        assert load_hot_loops({NO_EXTENSIONS_VARIABLE: on}) is None
    assert load_hot_loops({NO_EXTENSIONS_VARIABLE: "0"}) is COMPILED
    assert load_hot_loops({}) is COMPILED
    if NO_EXTENSIONS_VARIABLE not in os.environ:
        assert hot_loops is COMPILED  # (what the runtime chose at import)


# -- the Kafka ingress's run reader ------------------------------------------------------------


@dataclass
class _Record:
    key: Any
    value: Any
    partition: int
    topic: str


@pytest.fixture(autouse=True)
def _compiled_run_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ingress's compiled run reader, even where the environment turned it off."""
    if COMPILED is not None:
        monkeypatch.setattr(_kafka_runs, "_kafka_run", COMPILED.kafka_run, raising=False)


_FIELDS = Fields(
    attrgetter("key"), attrgetter("value"), attrgetter("partition"), attrgetter("topic")
)


def _validate(value: bytes) -> None:
    if value == b"bad":
        raise ValueError("not valid")
    if value == b"undecodable":
        raise DecodeError("not protobuf")
    if value == b"boom":
        raise RuntimeError("a bug in a validator")  # not a record's fault: it propagates


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except Exception as exc:  # the comparison includes the exception
        return ("raised", type(exc))
    if isinstance(result, list) and result and isinstance(result[0], tuple):
        return [
            (id_, type(typed), typed.typename, typed.has_value, typed.value)
            for id_, typed in result
        ]
    return result


_records = st.builds(
    _Record,
    key=st.sampled_from([b"k0", b"k0", b"k1", b"", b"\xff\xfe", None, bytearray(b"k0"), 7]),
    value=st.sampled_from([b"v", b"v", b"", b"bad", b"undecodable", b"boom", None]),
    partition=st.sampled_from([0, 0, 0, 1]),
    topic=st.sampled_from(["a", "a", "a", "b"]),
)


@needs_compiled
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=st.lists(_records, min_size=1, max_size=12), data=st.data(), checks=st.booleans())
def test_the_run_reader_reads_what_the_python_one_reads(
    batch: list[_Record], data: st.DataObject, checks: bool
) -> None:
    start = data.draw(st.integers(0, len(batch) - 1))
    validate = _validate if checks else None
    python = _outcome(lambda: python_messages(batch, start, _FIELDS, "t/v", validate))
    compiled = _outcome(
        lambda: _kafka_runs._compiled_messages(batch, start, _FIELDS, "t/v", validate)
    )
    assert compiled == python


@needs_compiled
def test_the_run_reader_reads_librdkafka_messages() -> None:
    import confluent_kafka

    message = confluent_kafka.Message
    fields = Fields(message.key, message.value, message.partition, message.topic)
    batch = [
        confluent_kafka.Message(topic="in", partition=p, offset=i, key=k, value=b"x%d" % i)
        for i, (p, k) in enumerate([(0, b"a"), (0, b"a"), (0, b"b"), (1, b"b"), (1, b"c")])
    ]
    for start in range(len(batch)):
        python = _outcome(lambda s=start: python_messages(batch, s, fields, "t/v", None))
        compiled = _outcome(
            lambda s=start: _kafka_runs._compiled_messages(batch, s, fields, "t/v", None)
        )
        assert compiled == python
    assert _outcome(lambda: _kafka_runs._compiled_messages(batch, 0, fields, "t/v", None)) == [
        ("a", TypedValue, "t/v", True, b"x0"),
        ("a", TypedValue, "t/v", True, b"x1"),
        ("b", TypedValue, "t/v", True, b"x2"),
    ]


# -- a run into a busy mailbox -----------------------------------------------------------------

_FUNCTION = "t/fn"


def _busy_dispatcher(limit: int, waiting: int) -> tuple[Job, _dispatcher.Dispatcher, deque[Any]]:
    endpoint = HttpEndpointSpec(FunctionTarget("t", None), "http://127.0.0.1:1/statefun")
    job = Job(ModuleSpec(endpoints=(endpoint,)), Settings(max_in_flight_remote_messages=10**9))
    key = (_FUNCTION, "k")
    dispatcher = job._subtask_of[key_group_for(*key, job.settings.max_parallelism)]
    mailbox: deque[Any] = deque(
        Envelope(_FUNCTION, "k", TypedValue("t/v", b"old"), None) for _ in range(waiting)
    )
    dispatcher.busy[key] = mailbox
    dispatcher._encode_ahead[key] = limit
    return job, dispatcher, mailbox


@pytest.fixture
def compiled_or_python(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], None]]:
    def choose(compiled: bool) -> None:
        assert COMPILED is not None
        monkeypatch.setattr(_dispatcher, "_mailbox_run", COMPILED.mailbox_run if compiled else None)

    yield choose


class _PlainTyped:
    """A typed value with its attributes in a __dict__ (the loops read it by name)."""

    def __init__(self, typename: str, value: Any) -> None:
        self.typename, self.has_value, self.value = typename, value is not None, value or b""


class _SubTyped(TypedValue):
    """A subclass: the loops read it by name too (only TypedValue's own slots in place)."""

    __slots__ = ("extra",)


_typed_values = st.one_of(
    st.builds(_PlainTyped, st.sampled_from(["t/v", "t/other"]), st.binary(max_size=4)),
    st.builds(_SubTyped, st.just("t/v"), st.binary(max_size=4)),
    st.builds(TypedValue, st.just("t/v"), st.binary(min_size=0, max_size=130)),
    st.builds(TypedValue, st.sampled_from(["t/v", "t/other"]), st.none() | st.binary(max_size=3)),
    st.builds(lambda v: TypedValue("t/v", memoryview(v)), st.binary(min_size=1, max_size=4)),  # type: ignore[arg-type]
)
_pairs = st.one_of(
    st.tuples(st.sampled_from(["k", "k", "k", "j"]), _typed_values),
    st.builds(lambda v: ["k", v], _typed_values),  # an (id, value) that is not a tuple
)


def _mailbox_view(mailbox: deque[Any]) -> list[Any]:
    return [(e.typename, e.id, e.value, e.caller, e.wire) for e in mailbox]


@needs_compiled
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    first=_typed_values,
    rest=st.lists(_pairs, max_size=12),
    limit=st.integers(0, 8),
    waiting=st.integers(0, 3),
    data=st.data(),
)
def test_a_run_enters_a_mailbox_as_the_python_loop_enters_it(
    compiled_or_python: Callable[[bool], None],
    first: TypedValue,
    rest: list[Any],
    limit: int,
    waiting: int,
    data: st.DataObject,
) -> None:
    messages: list[Any] = [("k", first), *rest]
    start = 0
    stop = data.draw(st.integers(0, len(messages)))
    outcomes = []
    for compiled in (False, True):
        compiled_or_python(compiled)
        job, dispatcher, mailbox = _busy_dispatcher(limit, waiting)
        noted: list[tuple[Any, int]] = []
        job.note_mailbox = lambda key, size, noted=noted: noted.append((key, size))  # type: ignore[method-assign]
        index = dispatcher.offer_run(messages, start, stop, (_FUNCTION, "k"))
        outcomes.append((index, _mailbox_view(mailbox), noted, dict(dispatcher.mailbox_max)))
    assert outcomes[1] == outcomes[0]


# -- the Kafka egress's rows -------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


#: a field of a KafkaProducerRecord as bytes: the three it has (key 1, value_bytes 2, topic 3),
#: others, other wire types, text that is not UTF-8, lengths past the end
_fields = st.one_of(
    st.builds(
        lambda f, v: _varint(f << 3 | 2) + _varint(len(v)) + v,
        st.sampled_from([1, 2, 3, 3]),
        st.sampled_from([b"", b"t", b"topic", "\u00e9".encode(), b"\xff", b"x" * 200]),
    ),
    st.builds(
        lambda f, n: _varint(f << 3) + _varint(n),
        st.sampled_from([1, 3, 4, 9]),
        st.integers(0, 300),
    ),
    st.builds(lambda f: _varint(f << 3 | 2) + b"\x05ab", st.sampled_from([1, 2, 3])),
    st.binary(max_size=3),
)
_egress_values = st.one_of(
    st.builds(
        lambda parts: TypedValue(KAFKA_PRODUCER_RECORD, b"".join(parts)),
        st.lists(_fields, max_size=5),
    ),
    st.builds(
        lambda t, k, v: TypedValue(
            KAFKA_PRODUCER_RECORD,
            b"\x1a"
            + _varint(len(t))
            + t
            + b"\x0a"
            + _varint(len(k))
            + k
            + b"\x12"
            + _varint(len(v))
            + v,
        ),
        st.sampled_from([b"out", b"out", b"other", b""]),
        st.sampled_from([b"", b"key"]),
        st.binary(max_size=40),
    ),
    st.just(TypedValue(KAFKA_PRODUCER_RECORD, None)),
    st.just(TypedValue("io.statefun.types/string", b"\n\x01x")),
    st.just(_PlainTyped(KAFKA_PRODUCER_RECORD, b"\x1a\x01t")),
    st.just(_SubTyped(KAFKA_PRODUCER_RECORD, b"\x1a\x01u")),
    st.builds(lambda v: TypedValue(KAFKA_PRODUCER_RECORD, memoryview(v)), st.just(b"\x1a\x01t")),  # type: ignore[arg-type]
)


@needs_compiled
@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(_egress_values, max_size=8))
def test_egress_rows_are_the_rows_the_python_parse_gives(
    monkeypatch: pytest.MonkeyPatch, values: list[TypedValue]
) -> None:
    assert COMPILED is not None
    outcomes = []
    for rows in (None, COMPILED.kafka_rows):
        monkeypatch.setattr(kafka_egress, "_kafka_rows", rows)
        sink = KafkaSink("e/out", "127.0.0.1:1", "at-least-once")
        sink.write_many(values)
        outcomes.append((sink._buffer, sink.rejected))
    assert outcomes[1] == outcomes[0]


@needs_compiled
def test_egress_rows_of_a_usual_reply() -> None:
    assert COMPILED is not None
    record = b"\x0a\x02k1\x12\x03abc\x1a\x03out"  # key, value_bytes, topic
    no_key = b"\x12\x01z\x1a\x03out"
    values = [TypedValue(KAFKA_PRODUCER_RECORD, record), TypedValue(KAFKA_PRODUCER_RECORD, no_key)]
    rows = COMPILED.kafka_rows(values, KAFKA_PRODUCER_RECORD)
    assert rows == [("out", "k1", b"abc", None), ("out", None, b"z", None)]
    assert rows is not None and rows[0][0] is rows[1][0]  # one topic str for a run of them
    assert COMPILED.kafka_rows([], KAFKA_PRODUCER_RECORD) == []
    # a string field twice: protobuf checks each (this key is not UTF-8), so the Python code
    # reads it and rejects the record
    twice = TypedValue(KAFKA_PRODUCER_RECORD, b"\x0a\x01\xff\x0a\x00\x1a\x01t")
    assert COMPILED.kafka_rows([twice], KAFKA_PRODUCER_RECORD) is None
    assert COMPILED.kafka_rows([*values, TypedValue("t/other", b"")], KAFKA_PRODUCER_RECORD) is None


# -- no reference left behind ------------------------------------------------------------------


@needs_compiled
def test_no_reference_is_leaked_on_any_path() -> None:
    """Each loop, many times over, on its usual path and its early ends and errors: the
    objects it is handed are referenced as often afterwards as before, and the objects it
    made are gone."""
    assert COMPILED is not None
    key, value, bad = b"k0", b"v", b"\xff"
    batch = [
        _Record(key, value, 0, "a"),
        _Record(key, b"boom", 0, "a"),
        _Record(bad, value, 0, "a"),
    ]
    mailbox: deque[Any] = deque()
    typed = TypedValue("t/v", b"abc")
    pairs: list[Any] = [("k", typed), ("k", TypedValue("t/v", b"")), ("j", typed)]
    encoding = _dispatcher.ingress_encoding("t/v")
    record = TypedValue(KAFKA_PRODUCER_RECORD, b"\x0a\x02k1\x12\x03abc\x1a\x03out")
    reply = _reply([_egress("e", "out", "t/v", True, b"1"), _egress("e", "x", "t/v", True, b"2")])
    envelopes = [Envelope(_FUNCTION, "k", typed, None), Envelope(_FUNCTION, "k", typed, None)]
    envelopes[0].wire = b"ahead"
    watched = [key, value, bad, typed, typed.value, record, record.value, reply, *batch]
    fake = _FakeProducer({2})
    rows: list[Any] = [("a", "k", b"v", None), ("a", None, b"w", None), ("b", "k", b"x", [])]
    watched += [*envelopes, envelopes[0].wire, *rows]

    def failing_append(_: Any) -> None:
        raise RuntimeError("full")

    def raises(call: Callable[[], Any]) -> None:
        try:
            call()
        except RuntimeError:
            return
        raise AssertionError("expected a RuntimeError")

    def every_path() -> None:
        COMPILED.kafka_run(batch, 0, *_FIELDS, "t/v", None, TypedValue, (ValueError,))
        COMPILED.kafka_run(batch, 2, *_FIELDS, "t/v", None, TypedValue, (ValueError,))
        raises(lambda: COMPILED.kafka_run(batch, 0, *_FIELDS, "t/v", _validate, TypedValue, ()))
        mailbox.clear()
        COMPILED.mailbox_run(mailbox.append, pairs, 0, 3, "k", _FUNCTION, Envelope, encoding, 0, 9)
        raises(
            lambda: COMPILED.mailbox_run(
                failing_append, pairs, 0, 3, "k", _FUNCTION, Envelope, encoding, 0, 9
            )
        )
        COMPILED.kafka_rows([record, record], KAFKA_PRODUCER_RECORD)
        COMPILED.kafka_rows([record, typed], KAFKA_PRODUCER_RECORD)
        COMPILED.egress_groups(reply, TypedValue)
        COMPILED.invocation_wires(envelopes, invocation)
        fake.calls = 1  # (its second call: the queue is full)
        COMPILED.produce_rows(fake.produce, rows, 0, (BufferError,))
        COMPILED.produce_rows(fake.produce, rows, 0, (BufferError,))
        fake.taken.clear()
        COMPILED.egress_groups(reply + b"\x5b", TypedValue)  # (None, after some records)

    every_path()
    mailbox.clear()
    gc.collect()
    before = [sys.getrefcount(o) for o in watched]
    blocks = sys.getallocatedblocks()
    for _ in range(2_000):
        every_path()
    mailbox.clear()
    gc.collect()
    assert [sys.getrefcount(o) for o in watched] == before
    # nor anything it made (a leak here is thousands of blocks)
    assert sys.getallocatedblocks() - blocks < 500


# -- a reply's egress records, grouped ----------------------------------------------------------


def _egress(ns: str, kind: str, typename: str, has_value: bool, value: bytes) -> bytes:
    message = pb.FromFunction.EgressMessage(
        egress_namespace=ns,
        egress_type=kind,
        argument=pb.TypedValue(typename=typename, has_value=has_value, value=value),
    )
    return bytes(message.SerializeToString())


_egress_messages = st.builds(
    _egress,
    st.sampled_from(["e", "e", "", "\u00e9", "a/b", "a", "ab"]),
    st.sampled_from(["out", "out", "", "b/out", "x", "c", "/c"]),
    st.sampled_from([KAFKA_PRODUCER_RECORD, "t/v", ""]),
    st.booleans(),
    st.binary(max_size=20),
)
#: an egress record as sent: one EgressMessage, or two one after the other (protobuf merges
#: them: the second's fields win, its argument merged into the first's), or with an unknown
#: field
_egress_records = st.one_of(
    _egress_messages,
    st.builds(lambda a, b: a + b, _egress_messages, _egress_messages),
    st.builds(lambda a: a + b"\x1a\x04\x1a\x02zz", _egress_messages),  # a second argument
    st.builds(lambda a: a + b"\x38\x01", _egress_messages),  # field 7, varint
)
#: what an InvocationResponse may carry besides its egress records: other outputs, fields it
#: does not have (one that looks like an egress record)
_result_extras = st.sampled_from(
    [
        b"",
        b"\x0a\x06\x08\x01\x12\x02s0",  # a state mutation
        b"\x12\x04\x0a\x02\x1a\x00",  # an outgoing message
        b"\x2a\x08\x0a\x01e\x12\x03out",  # field 5, bytes
        b"\x30\x01",  # field 6, varint
    ]
)


def _reply(egresses: list[bytes], extras: Sequence[bytes] = ()) -> bytes:
    result = b"".join(b"\x22" + _varint(len(e)) + e for e in egresses) + b"".join(extras)
    return b"\xa2\x06" + _varint(len(result)) + result


#: raw pieces a reply may carry besides: an unknown field of each wire type, a second
#: argument for the last egress record (merged into the first), a known field of another
#: wire type, an incomplete-context reply, bytes cut off
_extras = st.sampled_from(
    [
        b"",
        b"\x38\x05",  # field 7, varint
        b"\x41" + b"\x00" * 8,  # field 8, 64-bit
        b"\x4d" + b"\x00" * 4,  # field 9, 32-bit
        b"\x52\x02ab",  # field 10, bytes
        b"\xa2\x06\x05\x22\x03\x0a\x01e",  # invocation_result again: a record with a namespace
        b"\xa2\x06\x02\x20\x01",  # invocation_result with egress field as a varint
        b"\xaa\x06\x00",  # incomplete_invocation_context
        b"\xa2\x06\x05\x22\x03",  # cut off
        b"\x5b",  # a group's start
    ]
)


def _groups_view(groups: dict[str, list[Any]] | None) -> Any:
    if groups is None:
        return None
    return {
        id_: [(t.typename, bool(t.has_value), bytes(t.value)) for t in records]
        for id_, records in groups.items()
    }


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(
    egresses=st.lists(_egress_records, max_size=8),
    inside=st.lists(_result_extras, max_size=2),
    extras=st.lists(_extras, max_size=2),
    merged=st.lists(_egress_records, max_size=2),
)
def test_egress_groups_are_the_groups_protobuf_gives(
    egresses: list[bytes], inside: list[bytes], extras: list[bytes], merged: list[bytes]
) -> None:
    assert COMPILED is not None
    reply = _reply(egresses, inside) + b"".join(extras)
    if merged:  # a second FromFunction after the first: protobuf merges them
        reply += _reply(merged)
    try:
        response = pb.FromFunction.FromString(reply)
    except DecodeError:
        return  # (never handed on: the dispatcher refuses the reply first)
    compiled = COMPILED.egress_groups(reply, TypedValue)
    if response.HasField("incomplete_invocation_context"):
        assert compiled is None
        return
    try:
        python = group_egress(response.invocation_result, "t/fn")
    except MalformedResponseError:
        assert compiled is None  # the Python code says why
        return
    if compiled is not None:
        assert _groups_view(compiled) == _groups_view(python)
        assert all(type(t) is TypedValue for records in compiled.values() for t in records)
    else:  # only for what the compiled reader leaves to protobuf: a field of another wire
        # type, a group, an incomplete-context reply (one a later result replaces)
        assert {b"\xa2\x06\x02\x20\x01", b"\x5b", b"\xaa\x06\x00"} & set(extras)


@needs_compiled
def test_egress_groups_of_a_usual_reply() -> None:
    assert COMPILED is not None
    reply = _reply(
        [
            _egress("e", "out", KAFKA_PRODUCER_RECORD, True, b"r1"),
            _egress("e", "log", "t/v", False, b""),
            _egress("e", "out", KAFKA_PRODUCER_RECORD, True, b"r2"),
        ],
        [b"\x0a\x06\x08\x01\x12\x02s0"],
    )
    groups = COMPILED.egress_groups(reply, TypedValue)
    assert _groups_view(groups) == {
        "e/out": [(KAFKA_PRODUCER_RECORD, True, b"r1"), (KAFKA_PRODUCER_RECORD, True, b"r2")],
        "e/log": [("t/v", False, b"")],
    }
    assert list(groups or {}) == ["e/out", "e/log"]
    # ids of one length whose parts agree but for where the "/" falls are two ids
    tricky = _reply([_egress("ab", "c", "t/v", True, b"1"), _egress("a", "/c", "t/v", True, b"2")])
    assert list(COMPILED.egress_groups(tricky, TypedValue) or {}) == ["ab/c", "a//c"]
    assert COMPILED.egress_groups(b"", TypedValue) == {}
    assert COMPILED.egress_groups(memoryview(reply), TypedValue) == groups


@needs_compiled
def test_objects_of_any_class_are_made_and_read_by_name() -> None:
    """Attributes kept in place only for a class's own plain __slots__; any other class (a
    __dict__, a subclass, a property) goes through getattr and setattr, as Python does."""
    assert COMPILED is not None

    seen: list[str] = []

    class Watched:  # (made without its __init__, as TypedValue is)
        def __setattr__(self, name: str, value: Any) -> None:
            seen.append(name)
            object.__setattr__(self, name, value)

    batch = [_Record(b"k", b"v", 0, "a")]
    [(_, plain)] = COMPILED.kafka_run(batch, 0, *_FIELDS, "t/v", None, _PlainTyped, ())
    assert (plain.typename, plain.has_value, plain.value) == ("t/v", True, b"v")
    [(_, watched)] = COMPILED.kafka_run(batch, 0, *_FIELDS, "t/v", None, Watched, ())
    assert seen == ["typename", "has_value", "value"]
    assert watched.__dict__ == {"typename": "t/v", "has_value": True, "value": b"v"}
    record = b"\x1a\x03out\x12\x01v"
    values = [_SubTyped(KAFKA_PRODUCER_RECORD, record), _PlainTyped(KAFKA_PRODUCER_RECORD, record)]
    assert COMPILED.kafka_rows(values, KAFKA_PRODUCER_RECORD) == [("out", None, b"v", None)] * 2


@given(waiting=st.integers(0, 12), room=st.integers(-1, 14), before=st.integers(0, 3))
def test_a_batch_takes_from_its_mailbox_as_one_popleft_at_a_time(
    waiting: int, room: int, before: int
) -> None:
    mailbox: deque[Any] = deque(range(waiting))
    batch: list[Any] = list(range(-before, 0))
    expected_mailbox, expected_batch = deque(mailbox), list(batch)
    left = room
    while expected_mailbox and left > 0:
        expected_batch.append(expected_mailbox.popleft())
        left -= 1
    same = mailbox
    _dispatcher._take(mailbox, room, batch)
    assert (mailbox, batch) == (expected_mailbox, expected_batch)
    assert mailbox is same


@needs_compiled
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(st.tuples(_typed_values, st.booleans()), max_size=8))
def test_a_request_has_the_bytes_the_python_loop_gives(
    monkeypatch: pytest.MonkeyPatch, values: list[tuple[Any, bool]]
) -> None:
    assert COMPILED is not None
    batch = []
    for typed, ahead in values:
        envelope = Envelope(_FUNCTION, "k", typed, None)
        if ahead:
            envelope.wire = invocation(envelope)
        batch.append(envelope)
    requests = []
    for wires in (None, COMPILED.invocation_wires):
        monkeypatch.setattr(_remote, "_invocation_wires", wires)
        requests.append(encode_to_function(_FUNCTION, "k", [("n", "t/v", None)], batch))
    assert requests[1] == requests[0]


# -- the Kafka egress's sends on the producer thread --------------------------------------------


class _FakeProducer:
    """librdkafka's producer as Sender.send calls it: the records it took, its polls, a full
    queue at given calls, a refusal for one topic."""

    def __init__(self, full_at: set[int]) -> None:
        self.calls = 0
        self.full_at = full_at
        self.taken: list[Any] = []
        self.polls = 0

    def produce(self, topic: str, value: Any, key: Any, headers: Any = None) -> None:
        self.calls += 1
        if self.calls in self.full_at:
            raise BufferError("queue full")
        if topic == "refused":
            raise confluent_kafka.KafkaException("MSG_SIZE_TOO_LARGE")
        self.taken.append((topic, key, value, headers))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "a", "b", "refused"]),
        st.sampled_from(["k", None]),
        st.sampled_from([b"v", None]),
        st.sampled_from([None, None, None, [("h", b"1")]]),
    ),
    max_size=10,
)


@needs_compiled
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=_rows, full_at=st.sets(st.integers(1, 12), max_size=4))
def test_rows_are_sent_as_the_python_loop_sends_them(
    monkeypatch: pytest.MonkeyPatch, rows: list[Any], full_at: set[int]
) -> None:
    assert COMPILED is not None
    outcomes = []
    for loop in (None, COMPILED.produce_rows):
        monkeypatch.setattr(_kafka_librdkafka, "_produce_rows", loop)
        sender = object.__new__(_kafka_librdkafka.Sender)
        sender.egress_id = "e/out"
        producer = _FakeProducer(full_at)
        sender._producer = producer  # type: ignore[assignment]
        try:
            sender.send(rows)
            error = None
        except ConnectionError as exc:
            error = str(exc)
        outcomes.append((producer.taken, producer.polls, producer.calls, error))
    assert outcomes[1] == outcomes[0]
