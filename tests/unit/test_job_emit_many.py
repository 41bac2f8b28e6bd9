"""``Job.emit_many`` (the Kafka ingress's hot path) against ``has_room()`` then ``emit()`` for
each message, on twin jobs that do not run: the same messages in the same dispatcher inboxes
and mailboxes, the same counts of messages in flight, the same place where the room ends."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from typing import Any

import pytest

from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.module._specs import FunctionTarget, HttpEndpointSpec, ModuleSpec
from statefun.runtime import Job
from statefun.runtime._job import REPLY_TYPENAME
from statefun.sdk import TypedValue

REMOTE = ("test/a", "test/b")
UNKNOWN = "elsewhere/c"  # no endpoint: an embedded-style message that ends as a dead letter


def new_job(settings: Settings) -> Job:
    # (batches of at most 5: a mailbox fills past its limit within a run)
    endpoint = HttpEndpointSpec(
        FunctionTarget("test", None), "http://127.0.0.1:1/statefun", max_num_batch_requests=5
    )
    return Job(ModuleSpec(endpoints=(endpoint,)), settings)


def seen(job: Job) -> Any:
    """What the job holds: per dispatcher its inbox (every field of each envelope: emit_many
    makes them without ``Envelope.__init__``) and busy mailboxes, and the counters."""
    return (
        [
            (
                [
                    (type(e), e.typename, e.id, e.value.value, e.caller, e.wire, kg, key)
                    for e, kg, key in d.inbox
                ],
                {
                    k: [(type(e), e.typename, e.id, e.value.value, e.caller, e.wire) for e in m]
                    for k, m in d.busy.items()
                },
                d.mailbox_max,
            )
            for d in job.dispatchers
        ],
        job.pending,
        job.pending_remote,
        job.has_room(),
    )


@pytest.mark.parametrize("seed", range(60))
async def test_emit_many_is_has_room_then_emit_for_each(seed: int) -> None:
    rng = random.Random(seed)
    settings = Settings(
        max_in_flight_messages=rng.randint(1, 40), max_in_flight_remote_messages=rng.randint(1, 40)
    )
    fast, slow = new_job(settings), new_job(settings)
    for job in (fast, slow):  # most addresses have a batch in flight: a mailbox each
        for typename in REMOTE:
            for id_ in ("k0", "k1", "k2", "k3", "k4"):
                key = (typename, id_)
                dispatcher = job._subtask_of[key_group_for(*key, settings.max_parallelism)]
                dispatcher.busy[key] = deque()
                if id_ != "k4":  # (the messages in a remote function's mailbox are encoded)
                    dispatcher._encode_ahead[key] = 5
    for _ in range(rng.randint(1, 8)):
        typename = rng.choice([*REMOTE, UNKNOWN])
        ids: list[str] = []  # runs of one id (one hot key) as well as ids in turn
        for _ in range(rng.randint(0, 30)):
            ids.append(ids[-1] if ids and rng.random() < 0.6 else f"k{rng.randrange(6)}")
        messages = [(id_, TypedValue("test/v", b"%d" % rng.randrange(100))) for id_ in ids]
        start = rng.randint(0, len(messages))
        stopped = fast.emit_many(typename, messages, start)
        expected = len(messages)
        for index in range(start, len(messages)):
            if not slow.has_room():
                expected = index
                break
            slow.emit(typename, *messages[index])
        assert stopped == expected
        assert seen(fast) == seen(slow)
        if rng.random() < 0.5:  # some messages finish: room again
            for job in (fast, slow):
                for dispatcher in job.dispatchers:
                    dispatcher.inbox.clear()
                job.pending = job.pending_remote = 0
                job._overfull_mailboxes.clear()
                job._room.set()


async def test_a_reply_goes_to_its_caller() -> None:
    job = new_job(Settings())
    waiting = asyncio.get_running_loop().create_future()
    job.replies["request-1"] = waiting
    value = TypedValue("test/v", b"done")
    assert job.emit_many(REPLY_TYPENAME, [("request-1", value)]) == 1
    assert waiting.result() is value
