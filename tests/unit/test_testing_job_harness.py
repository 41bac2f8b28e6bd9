"""statefun.testing.JobHarness: a module.yaml on the real runtime, in this process, on a virtual
clock, with in-memory ingresses and egresses; checkpoints, crashes and restores."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from statefun import StatefulFunctions
from statefun.testing import FunctionFailedError, JobHarness, KafkaRecord
from tests.unit._testing_fns import functions

EMBEDDED = """
kind: io.pystatefun.endpoints.v1/embedded
spec:
  functions: test/*
  module: tests.unit._testing_fns:functions
---
kind: io.pystatefun.file.v1/ingress
spec:
  id: test/in
  path: in.jsonl
---
kind: io.pystatefun.stdout.v1/egress
spec:
  id: test/events
---
kind: io.pystatefun.file.v1/egress
spec:
  id: test/mail
  path: mail.jsonl
"""

REMOTE = """
kind: io.statefun.endpoints.v2/http
spec:
  functions: test/*
  urlPathTemplate: http://127.0.0.1:1/statefun
---
kind: io.statefun.kafka.v1/ingress
spec:
  id: test/kafka
  address: 127.0.0.1:1
  topics:
    - topic: counts
      valueType: io.statefun.types/string
      targets: [test/counter]
    - topic: reminders
      valueType: test/Reminder
      targets: [test/reminder]
---
kind: io.statefun.kafka.v1/egress
spec:
  id: test/mail
  address: 127.0.0.1:1
  deliverySemantic:
    type: exactly-once
    transactionTimeout: 1min
---
kind: io.statefun.kafka.v1/egress
spec:
  id: test/events
  address: 127.0.0.1:1
  deliverySemantic:
    type: at-least-once
"""


def module(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "module.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[JobHarness]:
    with JobHarness(module(tmp_path, EMBEDDED), checkpoints=True) as harness:
        yield harness


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[JobHarness]:
    with JobHarness(module(tmp_path, REMOTE), functions=functions, checkpoints=True) as harness:
        yield harness


def test_an_embedded_module_runs_with_its_connectors_swapped(embedded: JobHarness) -> None:
    ingress = embedded.ingress("test/in")
    ingress.send("a", "hello", target="test/counter")
    ingress.send("a", 7, target="test/counter")
    assert embedded.state("test/counter", "a") == {}  # nothing runs before it is asked to
    embedded.run_until_idle()
    assert embedded.state("test/counter", "a") == {"count": 2, "last": "7"}
    # stdout is at-least-once: its records show once the job flushed them
    assert embedded.egress("test/events").records == [{"counted": 1}, {"counted": 2}]


def test_a_remote_endpoint_calls_in_process_functions(remote: JobHarness) -> None:
    remote.ingress("test/kafka").send("a", "hello", topic="counts")
    remote.run_until_idle()
    assert remote.state("test/counter", "a") == {"count": 1, "last": "hello"}
    assert remote.egress("test/events").records == [{"counted": 1}]


def test_delayed_messages_wait_for_the_virtual_clock(remote: JobHarness) -> None:
    start = remote.now
    remote.ingress("test/kafka").send("ada", {"days": 30}, topic="reminders")
    remote.run_until_idle()
    remote.advance(timedelta(days=1) - timedelta(milliseconds=1))
    assert remote.state("test/reminder", "ada") == {}
    remote.advance(timedelta(milliseconds=1))
    assert remote.state("test/reminder", "ada") == {"sent": 1}
    remote.advance(timedelta(days=30))
    assert remote.state("test/reminder", "ada") == {"sent": 30}
    assert remote.now == start + timedelta(days=31)
    remote.checkpoint()  # the mail egress is exactly-once: visible once committed
    mail = remote.egress("test/mail").records
    assert mail[0] == KafkaRecord("mail", "ada", b"day 1") and len(mail) == 30


def test_state_expires_on_the_virtual_clock(embedded: JobHarness) -> None:
    embedded.send("test/session", "s", "visit")
    embedded.run_until_idle()
    assert embedded.state("test/session", "s") == {"seen": 1}
    embedded.advance(timedelta(minutes=29))
    assert embedded.state("test/session", "s") == {"seen": 1}
    embedded.advance(timedelta(minutes=1))
    assert embedded.state("test/session", "s") == {}


def test_an_exactly_once_egress_shows_records_once_a_checkpoint_commits(
    remote: JobHarness,
) -> None:
    remote.ingress("test/kafka").send("ada", {"days": 2}, topic="reminders")
    remote.advance(timedelta(days=1))
    mail = remote.egress("test/mail")
    assert mail.records == []
    remote.checkpoint()
    assert mail.records == [KafkaRecord("mail", "ada", b"day 1")]


def test_checkpoints_come_at_their_interval_on_the_virtual_clock(tmp_path: Path) -> None:
    every = timedelta(hours=7)  # checkpoints at 7, 14, 21, 28 h
    with JobHarness(
        module(tmp_path, REMOTE), functions=functions, checkpoint_interval=every
    ) as harness:
        harness.ingress("test/kafka").send("ada", {"days": 1}, topic="reminders")
        harness.advance(timedelta(days=1))
        assert harness.egress("test/mail").records == []  # day 1 came at 24 h
        harness.advance(every)
        assert harness.egress("test/mail").records == [KafkaRecord("mail", "ada", b"day 1")]


def test_crash_and_restore_redelivers_what_no_checkpoint_covered(remote: JobHarness) -> None:
    counts = remote.ingress("test/kafka")
    counts.send("a", "one", topic="counts")
    remote.run_until_idle()
    remote.checkpoint()
    counts.send("a", "two", topic="counts")
    remote.run_until_idle()
    assert remote.state("test/counter", "a") == {"count": 2, "last": "two"}
    remote.crash_and_restore()
    # the state is the checkpoint's; "two" came again from the ingress's restored position
    assert remote.state("test/counter", "a") == {"count": 2, "last": "two"}
    assert remote.restarts == 1
    # at-least-once: what the job had flushed before the crash, and again after it
    assert remote.egress("test/events").records == [{"counted": 1}, {"counted": 2}] * 1 + [
        {"counted": 2}
    ]


def test_a_crash_drops_exactly_once_output_no_checkpoint_committed(remote: JobHarness) -> None:
    remote.ingress("test/kafka").send("ada", {"days": 3}, topic="reminders")
    remote.advance(timedelta(days=1))
    remote.checkpoint()
    mail = remote.egress("test/mail")
    assert [r.value for r in mail.records] == [b"day 1"]
    remote.advance(timedelta(days=1))  # day 2 is written, in no committed transaction
    remote.crash_and_restore()
    assert [r.value for r in mail.records] == [b"day 1"]
    # the checkpoint's timer for day 2 is overdue on restore: it fired again at once
    assert remote.state("test/reminder", "ada") == {"sent": 2}
    remote.advance(timedelta(days=5))
    remote.checkpoint()
    assert [r.value for r in mail.records] == [b"day 1", b"day 2", b"day 3"]


def test_without_a_checkpoint_a_crash_starts_from_the_beginning(remote: JobHarness) -> None:
    remote.ingress("test/kafka").send("a", "one", topic="counts")
    remote.run_until_idle()
    remote.crash_and_restore()
    assert remote.state("test/counter", "a") == {"count": 1, "last": "one"}


def test_a_function_error_names_the_address_and_the_message(embedded: JobHarness) -> None:
    embedded.ingress("test/in").send("p", "boom", target="test/fails")
    with pytest.raises(FunctionFailedError) as failed:
        embedded.run_until_idle()
    text = str(failed.value)
    assert "function test/fails/p raised KeyError" in text
    assert "no such thing: boom" in text and "'boom'" in text
    assert isinstance(failed.value.__cause__, KeyError)
    with pytest.raises(RuntimeError, match=r"crash_and_restore\(\) restarts it"):
        embedded.run_until_idle()


def test_a_remote_function_error_names_the_address_and_the_message(remote: JobHarness) -> None:
    remote.send("test/fails", "q", "bang")
    with pytest.raises(FunctionFailedError, match=r"function test/fails/q raised .*bang"):
        remote.run_until_idle()


def test_a_failed_job_restarts_from_its_checkpoint(embedded: JobHarness) -> None:
    ingress = embedded.ingress("test/in")
    ingress.send("a", "one", target="test/counter")
    embedded.run_until_idle()
    embedded.checkpoint()
    ingress.send("p", "boom", target="test/fails")
    with pytest.raises(FunctionFailedError):
        embedded.run_until_idle()
    with pytest.raises(FunctionFailedError):  # the same input fails again after the restart
        embedded.crash_and_restore()
    assert embedded.restarts == 1


def test_async_embedded_functions_run_on_the_harness_loop(embedded: JobHarness) -> None:
    embedded.send("test/ping", "x", 3)
    embedded.run_until_idle()
    assert embedded.state("test/ping", "x") == {"hits": 4}  # 3, 2, 1, 0
    assert embedded.state("test/pong", "x") == {"hits": 3}
    # test/outside is served by no endpoint: a dead letter
    assert [d["target"] for d in embedded.dead_letters] == ["test/outside"]


def test_bad_input_is_a_one_line_error(tmp_path: Path, remote: JobHarness) -> None:
    path = module(tmp_path, REMOTE)
    with pytest.raises(ValueError, match=r"remote endpoint test/\* .* has no in-process functions"):
        JobHarness(path)
    with pytest.raises(ValueError, match=r"no remote endpoint of the module serves 'shop/\*'"):
        JobHarness(path, functions={"shop/*": functions})
    with pytest.raises(TypeError, match=r"expected a statefun\.StatefulFunctions"):
        JobHarness(path, functions={"test/*": object()})  # type: ignore[dict-item]
    with pytest.raises(KeyError, match="no ingress 'nope'; it has: test/kafka"):
        remote.ingress("nope")
    with pytest.raises(KeyError, match="no egress 'nope'; it has: test/mail, test/events"):
        remote.egress("nope")
    kafka = remote.ingress("test/kafka")
    with pytest.raises(ValueError, match="reads topics counts, reminders: say which"):
        kafka.send("a", "x")
    with pytest.raises(ValueError, match="reads no topic 'other'"):
        kafka.send("a", "x", topic="other")
    with pytest.raises(ValueError, match="non-empty str"):
        kafka.send("", "x", topic="counts")
    with pytest.raises(ValueError, match="unknown setting 'paralellism'"):
        JobHarness(path, functions=functions, overrides={"paralellism": 2})


def test_without_checkpoints_exactly_once_output_commits_at_once(tmp_path: Path) -> None:
    with JobHarness(module(tmp_path, REMOTE), functions=StatefulFunctions()) as harness:
        with pytest.raises(RuntimeError, match="needs checkpoints"):
            harness.crash_and_restore()
        with pytest.raises(RuntimeError, match="no checkpoints"):
            harness.checkpoint()
    with JobHarness(
        module(tmp_path, REMOTE), functions={"test/*": functions}, overrides={"parallelism": 1}
    ) as harness:
        harness.ingress("test/kafka").send("ada", {"days": 1}, topic="reminders")
        harness.advance(timedelta(days=1))
        assert harness.egress("test/mail").records == [KafkaRecord("mail", "ada", b"day 1")]
        assert harness.settings.parallelism == 1
    with pytest.raises(RuntimeError, match="closed"):
        harness.run_until_idle()


def test_sent_messages_come_again_after_a_crash(embedded: JobHarness) -> None:
    embedded.send("test/counter", "a", "one")
    embedded.run_until_idle()
    embedded.crash_and_restore()  # no checkpoint: the harness's own ingress is read again
    assert embedded.state("test/counter", "a") == {"count": 1, "last": "one"}
    embedded.checkpoint()
    embedded.send("test/counter", "a", "two")
    embedded.run_until_idle()
    embedded.crash_and_restore()
    assert embedded.state("test/counter", "a") == {"count": 2, "last": "two"}


def test_a_call_gets_the_functions_reply(embedded: JobHarness, remote: JobHarness) -> None:
    # with checkpoints a reply is released by the checkpoint that covers it (one is taken)
    assert embedded.call("test/counter", "a", "x") == 1
    assert embedded.call("test/counter", "a", "y") == 2
    assert remote.call("test/counter", "b", "x") == 1
    with pytest.raises(RuntimeError, match="test/session/s sent no reply to its caller"):
        embedded.call("test/session", "s", "visit")


def test_a_call_without_checkpoints_is_answered_at_once(tmp_path: Path) -> None:
    with JobHarness(module(tmp_path, EMBEDDED)) as harness:
        assert harness.call("test/counter", "a", "x") == 1


def test_inside_a_running_event_loop_it_says_why_not(tmp_path: Path) -> None:
    async def inside() -> None:
        JobHarness(module(tmp_path, EMBEDDED))

    with pytest.raises(RuntimeError, match=r"use it from a plain \(def\) test"):
        asyncio.run(inside())


def test_crash_and_restore_with_the_rocksdb_backend(tmp_path: Path) -> None:
    path = module(tmp_path, EMBEDDED)
    with JobHarness(path, checkpoints=True, overrides={"state_backend": "rocksdb"}) as harness:
        harness.send("test/counter", "a", "x")
        harness.run_until_idle()
        harness.checkpoint()
        harness.send("test/counter", "a", "y")
        harness.run_until_idle()
        harness.crash_and_restore()
        assert harness.state("test/counter", "a") == {"count": 2, "last": "y"}
        assert harness.settings.state_backend == "rocksdb"
