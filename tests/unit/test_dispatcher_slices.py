"""The dispatcher's slice loop for synchronous embedded functions (``runtime/_batch.py``)
against its per-message path (``Dispatcher.batched = False``): randomized workloads, run by
the real job on a virtual clock (``JobHarness``), must give the same egress records in the
same order, the same state, the same dead letters in the same order and the same counters.

The workloads mix what the slice loop hands elsewhere or treats apart: runs of messages to one
address, a function that raises (the other messages of its slice go on), state deleted and
written, TTL, delayed messages and cancellations, messages to functions (feedback) and to a
function type nobody serves, records for an egress the module lacks, an ``async def`` function
(a batch in flight: messages wait in its mailbox), slices of a few messages, and a crash
restored from a checkpoint.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statefun import (
    Context,
    IntType,
    Message,
    StatefulFunctions,
    StringType,
    ValueSpec,
    egress_message_builder,
    message_builder,
)
from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.module._specs import EmbeddedEndpointSpec, FunctionTarget, ModuleSpec
from statefun.runtime import Job
from statefun.runtime._dispatcher import Dispatcher
from statefun.runtime._envelope import Envelope
from statefun.runtime._timeline import Timeline
from statefun.sdk._context import InvocationContext
from statefun.sdk._types import to_typed_value
from statefun.state.memory import read_memory_snapshot
from statefun.testing import JobHarness

functions = StatefulFunctions()
OUT, SIDE, MISSING = "t/out", "t/side", "t/missing"


@functions.bind(
    typename="t/count",
    specs=[ValueSpec(name="count", type=IntType), ValueSpec(name="last", type=StringType)],
)
def count(context: Context, message: Message) -> None:
    word = message.as_string() or ""
    storage = context.storage
    if word == "boom":
        storage.count = -1  # written, then the call fails: nothing of it may stay
        context.send_egress(egress_message_builder(OUT, "never", StringType))
        raise ValueError("boom")
    if word == "typo":
        _ = storage.cuont  # no such state: AttributeError (the failure names the registered)
    if word == "del":
        del storage.count
        del storage.last
    else:
        storage.count = (storage.count or 0) + 1
        storage.last = word
    seen = f"{context.address.id}:{storage.count}:{word}"
    context.send_egress(egress_message_builder(OUT, seen, StringType))
    if word == "side":
        context.send_egress(egress_message_builder(SIDE, seen, StringType))
        context.send_egress(egress_message_builder(OUT, seen + "+", StringType))
    if word == "lost":
        context.send_egress(egress_message_builder(MISSING, seen, StringType))


@functions.bind(typename="t/relay", specs=[ValueSpec(name="hops", type=IntType)])
def relay(context: Context, message: Message) -> None:
    word = message.as_string() or ""
    hops = (context.storage.hops or 0) + 1
    context.storage.hops = hops
    context.send(message_builder("t/count", context.address.id, str_value=word))
    context.send(message_builder("t/nobody", context.address.id, str_value=word))
    if word == "later":
        context.send_after(
            timedelta(milliseconds=5),
            message_builder("t/count", context.address.id, str_value="late"),
            "token",
        )
    if word == "cancel":
        context.cancel_delayed_message("token")
    context.send_egress(
        egress_message_builder(OUT, f"relay {context.address.id}:{hops}", StringType)
    )


@functions.bind(
    typename="t/ttl",
    specs=[ValueSpec(name="seen", type=StringType, expire_after_write=timedelta(milliseconds=3))],
)
def ttl(context: Context, message: Message) -> None:
    before = context.storage.seen
    word = message.as_string() or ""
    if word != "read":
        context.storage.seen = word
    context.send_egress(egress_message_builder(OUT, f"ttl {before}>{word}", StringType))


@functions.bind(typename="t/slow", specs=[])
def slow_sync(context: Context, message: Message) -> None:
    time.sleep(0.0005)
    context.send_egress(egress_message_builder(OUT, context.address.id, StringType))


@functions.bind(typename="t/async", specs=[ValueSpec(name="n", type=IntType)])
async def slow(context: Context, message: Message) -> None:
    context.storage.n = (context.storage.n or 0) + 1
    context.send_egress(
        egress_message_builder(OUT, f"async {context.address.id}:{context.storage.n}", StringType)
    )


MODULE = f"""
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: t/*
  module: {__name__}:functions
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: {OUT}
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: {SIDE}
"""

WORDS = ["a", "b", "boom", "typo", "del", "side", "lost", "later", "cancel", "read"]
TARGETS = ["t/count", "t/count", "t/count", "t/relay", "t/ttl", "t/async"]
IDS = ["x", "y", "z"]
#: one step: send these messages (target, id, word), then let this many ms pass
Step = tuple[list[tuple[str, str, str]], int]
steps = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.sampled_from(TARGETS), st.sampled_from(IDS), st.sampled_from(WORDS)),
            max_size=25,
        ),
        st.integers(0, 6),
    ),
    min_size=1,
    max_size=4,
)


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "module.yaml"
    path.write_text(MODULE, encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def restore_batched() -> Iterator[None]:
    yield
    Dispatcher.batched = True


def _dead_letter(record: dict[str, Any]) -> tuple[Any, ...]:
    return (
        record.get("target"),
        record.get("id"),
        record.get("egress"),
        record.get("reason"),
        record.get("value"),
    )


def _counters(job: JobHarness) -> dict[str, tuple[int, ...]]:
    found: dict[str, tuple[int, ...]] = {}
    for function in job._job.functions.known():
        stats = function.stats
        found[function.typename] = (
            stats.invocations,
            stats.messages_out,
            stats.failures_terminal,
            stats.failures_retryable,
            stats.batches,
        )
    return found


def run(
    module: Path,
    workload: list[Step],
    *,
    batched: bool,
    slice_size: int,
    crash_after: int | None = None,
    backend: str = "memory",
) -> dict[str, Any]:
    """Everything observable of ``workload`` run by a job (``crash_after``: a checkpoint after
    that step, more steps, then a crash and a restore before the last step's time passes)."""
    Dispatcher.batched = batched
    overrides = {
        "remote_failure_policy": "dead-letter",
        "dispatcher_slice": slice_size,
        "state_backend": backend,
    }
    with JobHarness(module, overrides=overrides, checkpoints=crash_after is not None) as job:
        for index, (messages, ms) in enumerate(workload):
            for target, id_, word in messages:
                job.send(target, id_, word)
            job.run_until_idle()
            if index == crash_after:
                job.checkpoint()
            job.advance(timedelta(milliseconds=ms))
        if crash_after is not None:
            job.crash_and_restore()
        job.advance(timedelta(milliseconds=20))
        job.run_until_idle()
        assert all(not d.inbox for d in job._job.dispatchers)
        return {
            "out": job.egress(OUT).records,
            "side": job.egress(SIDE).records,
            "state": {
                (typename, id_): job.state(typename, id_)
                for typename in ("t/count", "t/relay", "t/ttl", "t/async")
                for id_ in IDS
            },
            "dead letters": [_dead_letter(r) for r in job.dead_letters],
            "counters": _counters(job) if crash_after is None else None,
        }


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(workload=steps, slice_size=st.sampled_from([1, 3, 512]))
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_the_slice_loop_does_what_the_per_message_path_does(
    module: Path, backend: str, workload: list[Step], slice_size: int
) -> None:
    per_message = run(module, workload, batched=False, slice_size=slice_size, backend=backend)
    sliced = run(module, workload, batched=True, slice_size=slice_size, backend=backend)
    assert sliced == per_message


@settings(max_examples=60, deadline=None)
@given(
    messages=st.lists(
        st.tuples(st.sampled_from(["t/count", "t/relay"]), st.sampled_from(IDS)), max_size=40
    ),
    limit=st.integers(1, 50),
)
def test_one_slice_takes_what_a_queue_would_and_leaves_the_rest_in_order(
    messages: list[tuple[str, str]], limit: int
) -> None:
    """One slice against a FIFO queue: it takes messages from the head until ``limit`` of them
    finished, sees the ones its invocations send to its own inbox meanwhile (a relay sends
    two: to t/count, and to t/nobody, which no endpoint serves: a dead letter, finished too),
    and leaves the rest in the inbox, in order."""
    endpoints = tuple(
        EmbeddedEndpointSpec(FunctionTarget("t", name), f"{__name__}:functions")
        for name in ("count", "relay")
    )
    with tempfile.TemporaryDirectory() as folder:
        given = {"parallelism": "1", "dead_letter_path": f"{folder}/dead-letters.jsonl"}
        job = Job(ModuleSpec(endpoints=endpoints), Settings.load(given, environ={}), sources=[])
        (dispatcher,) = job.dispatchers
        queue = [(typename, id_) for typename, id_ in messages]
        for typename, id_ in messages:
            job.send(Envelope(typename, id_, to_typed_value(StringType, "a"), None))
        finished = 0
        while queue and finished < limit:
            typename, id_ = queue.pop(0)
            if typename == "t/relay":
                queue += [("t/count", id_), ("t/nobody", id_)]
            finished += 1
        with mock.patch("statefun.runtime._batch.SLICE_SECONDS", 3600.0):  # (no time limit)
            assert dispatcher._run_slice(dispatcher.inbox, limit) == finished
    assert [(envelope.typename, envelope.id) for envelope, _, _ in dispatcher.inbox] == queue
    assert [key for _, _, key in dispatcher.inbox] == queue
    assert job.pending == len(queue)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(workload=steps.filter(lambda w: len(w) >= 2), data=st.data())
def test_the_same_after_a_crash_restored_from_a_checkpoint(
    module: Path, workload: list[Step], data: st.DataObject
) -> None:
    crash_after = data.draw(st.integers(0, len(workload) - 2))
    per_message = run(module, workload, batched=False, slice_size=512, crash_after=crash_after)
    sliced = run(module, workload, batched=True, slice_size=512, crash_after=crash_after)
    # Dead letters of different addresses after a restore come in no fixed order (either path
    # alone, run twice, orders them differently now and then): the same ones, each once.
    for result in (per_message, sliced):
        result["dead letters"] = sorted(result["dead letters"], key=repr)
    assert sliced == per_message


def test_a_run_to_one_address_and_a_failure_inside_it(module: Path) -> None:
    """One slice: four messages to one address, the third raising; the others count on."""
    workload: list[Step] = [([("t/count", "x", w) for w in ("a", "b", "boom", "a", "del", "b")], 0)]
    sliced = run(module, workload, batched=True, slice_size=512)
    assert sliced == run(module, workload, batched=False, slice_size=512)
    assert sliced["out"] == ["x:1:a", "x:2:b", "x:3:a", "x:None:del", "x:1:b"]
    assert sliced["state"][("t/count", "x")] == {"count": 1, "last": "b"}
    assert [d[3].split(":")[0] for d in sliced["dead letters"]] == [
        "function t/count failed on 'x'"
    ]
    assert sliced["counters"]["t/count"][:3] == (5, 0, 1)


def test_an_unregistered_state_fails_with_the_registered_names(module: Path) -> None:
    """Reading a state no ValueSpec declares fails the invocation; the dead letter names the
    registered states."""
    workload: list[Step] = [([("t/count", "x", "typo"), ("t/count", "x", "a")], 0)]
    sliced = run(module, workload, batched=True, slice_size=512)
    assert sliced == run(module, workload, batched=False, slice_size=512)
    assert sliced["out"] == ["x:1:a"]
    assert [d[3] for d in sliced["dead letters"]] == [
        "function t/count failed on 'x': AttributeError: 'Storage[t/count]' object has no "
        "attribute 'cuont' ('cuont' is not a registered ValueSpec; registered: ['count', 'last'])"
    ]


@pytest.mark.parametrize("batched", [True, False])
def test_a_message_to_an_empty_id_fails_as_its_message_cannot_be_built(
    module: Path, batched: bool
) -> None:
    """No ingress sends an empty id, but a restored or hand-made envelope may: the function's
    Message refuses it, so the invocation fails (dead letter), in a slice as per message."""
    Dispatcher.batched = batched
    with JobHarness(module, overrides={"remote_failure_policy": "dead-letter"}) as job:
        for id_ in ("", "x"):
            job._job.send(Envelope("t/count", id_, to_typed_value(StringType, "a"), None))
        job.run_until_idle()
        assert job.egress(OUT).records == ["x:1:a"]
        assert [r["reason"] for r in job.dead_letters] == [
            "function t/count failed on '': ValueError: target_id can not be missing"
        ]


def _sink_writes(job: JobHarness) -> list[int]:
    """The sizes of the writes to OUT's sink from now on."""
    writes: list[int] = []
    (sink,) = [s for s in job._job.sinks.values() if s.egress_id == OUT]
    write_many = sink.write_many

    def counted(values: list[Any]) -> None:
        writes.append(len(values))
        write_many(values)

    sink.write_many = counted  # type: ignore[method-assign]
    return writes


def test_a_slice_ends_after_its_time_however_few_messages_it_handled(module: Path) -> None:
    """Fairness: slow invocations end a slice after SLICE_SECONDS (each slice writes once)."""
    with JobHarness(module, overrides={"parallelism": 1}) as job:
        writes = _sink_writes(job)
        for _ in range(100):
            job.send("t/slow", "one", "a")
        job.run_until_idle()
        assert len(job.egress(OUT).records) == 100
    assert sum(writes) == 100
    assert len(writes) >= 3, writes  # 0.5 ms each: a slice of 512 would have been one write


def test_egress_records_reach_the_sink_once_per_slice(module: Path) -> None:
    """The slice hands its records to the sink in one write per egress id, in order."""
    with JobHarness(module) as job:
        writes = _sink_writes(job)
        for index in range(40):
            job.send("t/count", f"id-{index}", "a")
        job.run_until_idle()
        assert len(job.egress(OUT).records) == 40
        dispatchers = len(job._job.dispatchers)
    assert sum(writes) == 40
    assert len(writes) <= dispatchers


def test_an_address_the_timeline_records_is_recorded_while_the_others_run_in_slices(
    module: Path,
) -> None:
    """With the admin port's timeline on, a looked-up address takes the per-message path (its
    invocations are recorded), the others stay in the slice loop; the outputs do not change."""
    workload: list[Step] = [([("t/count", id_, w) for w in ("a", "b", "side") for id_ in IDS], 0)]
    expected = run(module, workload, batched=True, slice_size=512)
    overrides = {"remote_failure_policy": "dead-letter"}
    with JobHarness(module, overrides=overrides) as job:
        # the harness opens no admin port, so it keeps no timeline: its dispatchers get one
        timeline = Timeline(per_address=50, addresses=10)
        for dispatcher in job._job.dispatchers:
            dispatcher._timeline = timeline
            dispatcher._recorded = timeline.recorded
        timeline.look_up(("t/count", "y"))
        writes = _sink_writes(job)
        for target, id_, word in workload[0][0]:
            job.send(target, id_, word)
        job.run_until_idle()
        assert job.egress(OUT).records == expected["out"]
        assert job.egress(SIDE).records == expected["side"]
        assert [job.state("t/count", id_) for id_ in IDS] == [
            expected["state"][("t/count", id_)] for id_ in IDS
        ]
        recorded = timeline.entries(("t/count", "y"))
        assert [e["messages_in"][0]["preview"] for e in recorded] == ["a", "b", "side"]
        assert timeline.entries(("t/count", "x")) == []
    assert len(writes) > 1  # y's records went out on their own, between the slices' writes


kept: list[Context] = []


#: the storage of an earlier invocation of t/late, kept past its call
late_storage: list[Any] = []


@functions.bind(typename="t/late", specs=[ValueSpec(name="n", type=IntType)])
def late(context: Context, message: Message) -> None:
    """``keep``: writes n = 1 and keeps the storage; ``late``: writes n = 99 through the
    storage kept (after its invocation ended: that write must change no state)."""
    if message.as_string() == "keep":
        context.storage.n = 1
        late_storage.append(context.storage)
    else:
        late_storage[0].n = 99
        late_storage[0].n = 98  # (a second write: no longer the first)
        context.storage.n = (context.storage.n or 0) + 10


@pytest.mark.parametrize("batched", [True, False])
def test_a_storage_kept_past_its_call_changes_no_state(module: Path, batched: bool) -> None:
    Dispatcher.batched = batched
    late_storage.clear()
    with JobHarness(module, checkpoints=True) as job:
        job.send("t/late", "a", "keep")
        job.send("t/late", "a", "late")  # the same address, in the same slice
        job.send("t/late", "b", "late")
        job.run_until_idle()
        assert job.state("t/late", "a") == {"n": 11}
        assert job.state("t/late", "b") == {"n": 10}
        job.checkpoint()
        late_storage[0].n = 7  # between invocations, then a crash: the checkpoint holds 11
        job.crash_and_restore()
        assert job.state("t/late", "a") == {"n": 11}


#: what t/hold kept of its invocations: (what, the object, what it showed then)
held: list[tuple[str, Any, Any]] = []


@functions.bind(typename="t/hold", specs=[ValueSpec(name="n", type=IntType)])
def hold(context: Context, message: Message) -> None:
    """Counts, then keeps what the message names: the context, the storage or the message
    (the slice loop may reuse an invocation's objects only when nothing else holds them)."""
    word = message.as_string() or ""
    n = context.storage.n = (context.storage.n or 0) + 1
    context.send_egress(egress_message_builder(OUT, f"{word}{n}", StringType))
    if word == "context":
        held.append((word, context, (context.address.id, n, len(context.egress))))
    elif word == "storage":
        held.append((word, context.storage, n))
    elif word == "message":
        held.append((word, message, (message.target_id, message.as_string())))


def _showing(what: str, kept: Any) -> Any:
    if what == "context":
        return (kept.address.id, kept.storage.n, len(kept.egress))
    if what == "storage":
        return kept.n
    return (kept.target_id, kept.as_string())


@pytest.mark.parametrize("batched", [True, False])
def test_what_a_function_keeps_of_an_invocation_stays_as_it_was(
    module: Path, batched: bool
) -> None:
    Dispatcher.batched = batched
    held.clear()
    with JobHarness(module) as job:
        for round_ in range(3):
            for id_ in ("a", "b", "c"):
                for word in ("context", "x", "storage", "y", "message", "z"):
                    job.send("t/hold", f"{id_}{round_ % 2}", word)
            job.run_until_idle()
    assert len(held) == 27
    for what, kept, then in held:
        assert _showing(what, kept) == then, what


@functions.bind(typename="t/keep", specs=[ValueSpec(name="n", type=IntType)])
def keep(context: Context, message: Message) -> None:
    kept.append(context)


def _fields(obj: object) -> dict[str, Any]:
    """Every slot of ``obj`` that is set, by name: its value (a fresh container: its type)."""
    names = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]
    fields: dict[str, Any] = {}
    for name in names:
        if hasattr(obj, name):
            value = getattr(obj, name)
            fields[name] = (type(value), value) if type(value) in (dict, list) else value
    return fields


def test_the_slice_loop_makes_the_context_and_storage_their_init_makes(module: Path) -> None:
    """The slice loop builds both without calling ``__init__``: every field alike."""
    kept.clear()
    with JobHarness(module) as job:
        job.send("t/keep", "k", "a")
        job.run_until_idle()
    (context,) = kept
    assert isinstance(context, InvocationContext)
    storage = context.storage
    made = InvocationContext(context._address, storage, context.caller)
    assert _fields(context) == _fields(made)
    assert _fields(storage) == _fields(type(storage)("t/keep", dict(storage._values)))
    assert context.egress is made.egress and context.messages is made.messages


@functions.bind(typename="t/add", specs=[ValueSpec(name="n", type=IntType)])
def add(context: Context, message: Message) -> None:
    context.storage.n = (context.storage.n or 0) + 1


def test_a_snapshot_keeps_its_cut_while_the_slice_loop_writes_on() -> None:
    """The slice loop writes the memory backend's dicts itself while no snapshot shares
    them, and through ``put`` (which copies a shared group first) while one does."""
    endpoint = EmbeddedEndpointSpec(FunctionTarget("t", "add"), f"{__name__}:functions")
    job = Job(ModuleSpec(endpoints=(endpoint,)), Settings.load({}, environ={}), sources=[])
    ids = [f"k{i}" for i in range(50)]

    def send_all() -> None:
        for id_ in ids:
            job.send(Envelope("t/add", id_, to_typed_value(StringType, "x"), None))
        for dispatcher in job.dispatchers:
            while dispatcher.inbox:
                dispatcher._run_slice(dispatcher.inbox, 7)

    def counts(groups: Any) -> list[int | None]:
        found = []
        for id_ in ids:
            group = groups(key_group_for("t/add", id_, job.settings.max_parallelism))
            values = (group or {}).get(("t/add", id_))
            found.append(
                None if values is None else IntType.serializer().deserialize(values["n"].value)
            )
        return found

    send_all()
    snapshot = job.state.snapshot()
    send_all()
    send_all()
    assert counts(snapshot._groups.get) == [1] * len(ids)  # the cut
    assert counts(job.state._groups.get) == [3] * len(ids)
    snapshot.release()
    send_all()
    assert counts(job.state._groups.get) == [4] * len(ids)


def test_each_snapshot_file_has_what_the_slice_loop_wrote_into_the_state_itself(
    tmp_path: Path,
) -> None:
    """A memory snapshot writes again the sections of key groups nothing wrote since the
    previous one: the slice loop's own writes into the backend's dicts count as writes."""
    endpoint = EmbeddedEndpointSpec(FunctionTarget("t", "add"), f"{__name__}:functions")
    job = Job(ModuleSpec(endpoints=(endpoint,)), Settings.load({}, environ={}), sources=[])
    ids = [f"k{i}" for i in range(50)]
    for round_ in range(1, 4):
        assert job.state.unshared_groups() is not None  # (no snapshot shares them)
        for id_ in ids[: 50 // round_]:
            job.send(Envelope("t/add", id_, to_typed_value(StringType, "x"), None))
        for dispatcher in job.dispatchers:
            while dispatcher.inbox:
                dispatcher._run_slice(dispatcher.inbox, 7)
        snapshot = job.state.snapshot()
        manifest = snapshot.write(tmp_path / str(round_))
        snapshot.release()
        counts = {
            key[1]: IntType.serializer().deserialize(values["n"].value)
            for _, key, values in read_memory_snapshot(tmp_path / str(round_), manifest, None)
        }
        assert counts == {
            id_: sum(1 for r in range(1, round_ + 1) if index < 50 // r)
            for index, id_ in enumerate(ids)
        }


@functions.bind(typename="t/swap", specs=[ValueSpec(name="n", type=IntType)])
def swap(context: Context, message: Message) -> None:
    context.storage.n = (context.storage.n or 0) + 1
    context.storage = None  # type: ignore[misc]  # (its own view: the write still counts)


@pytest.mark.parametrize("batched", [True, False])
def test_a_function_that_rebinds_context_storage_still_has_its_writes_applied(
    module: Path, batched: bool
) -> None:
    Dispatcher.batched = batched
    with JobHarness(module) as job:
        for _ in range(3):
            job.send("t/swap", "a", "x")
        job.run_until_idle()
        assert job.state("t/swap", "a") == {"n": 3}
