"""The failure journal behind quarantine: same failure, narrowing, persistence, damage."""

from __future__ import annotations

from pathlib import Path

from statefun.runtime._envelope import Envelope
from statefun.runtime._quarantine import Quarantine, fingerprint, signature
from statefun.sdk import StringType, TypedValue
from statefun.sdk._spec import SdkAddress


def message(text: str, id_: str = "a") -> Envelope:
    value = TypedValue(StringType.typename, StringType.serializer().serialize(text))
    return Envelope("test/counter", id_, value, None)


HOW = signature("test/counter", ValueError("attempt 3 failed after 1200 ms"))


def test_signatures_ignore_numbers_and_fingerprints_see_the_whole_message() -> None:
    assert signature("test/counter", ValueError("attempt 7 failed after 30000 ms")) == HOW
    assert signature("test/counter", KeyError("attempt 3 failed after 1200 ms")) != HOW
    assert fingerprint(message("x")) == fingerprint(message("x"))
    assert fingerprint(message("x")) != fingerprint(message("x", "b"))
    caller = SdkAddress("test", "other", "z", "test/other")
    called = Envelope("test/counter", "a", message("x").value, caller)
    assert fingerprint(called) != fingerprint(message("x"))


def test_the_suspects_narrow_to_the_message_in_every_failing_batch(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    one, bad, two = message("one"), message("bad"), message("two")
    assert Quarantine(path, 3).failed([one, bad], HOW) == []
    # a new process (a restart) reads the journal; batches are cut differently
    assert Quarantine(path, 3).failed([bad, two], HOW) == []
    again = [message("one"), message("bad"), message("two")]
    assert Quarantine(path, 3).failed(again, HOW) == [again[1]]
    # replayed after a crash that came before a checkpoint covered the quarantine: at once
    replayed = [message("bad"), message("two")]
    assert Quarantine(path, 3).failed(replayed, HOW) == [replayed[0]]
    (suspect,) = Quarantine(path, 3).suspects
    assert suspect["messages"] == {fingerprint(bad): 1}


def test_another_failure_does_not_count_for_the_first(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    bad = message("bad")
    other = signature("test/counter", RuntimeError("different"))
    quarantine = Quarantine(path, 2)
    assert quarantine.failed([bad], HOW) == []
    assert quarantine.failed([bad], other) == []
    assert quarantine.failed([message("unrelated")], HOW) == []
    assert quarantine.failed([bad], HOW) == [bad]


def test_identical_messages_are_each_sent_alone_then_quarantined(tmp_path: Path) -> None:
    quarantine = Quarantine(tmp_path / "quarantine.json", 1)
    batch = [message("same"), message("same")]
    assert quarantine.failed(batch, HOW) == batch  # two suspects: both sent again, alone
    assert quarantine.failed([batch[0]], HOW) == [batch[0]]
    assert quarantine.failed([batch[1]], HOW) == [batch[1]]


def test_a_damaged_journal_is_ignored_and_off_means_off(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    path.write_text('{"suspects": [{"signature": 1}]}')
    assert Quarantine(path, 1).suspects == []
    path.write_text("not json")
    quarantine = Quarantine(path, 1)
    assert quarantine.suspects == []
    bad = message("bad")
    assert quarantine.failed([bad], HOW) == [bad]
    assert Quarantine(None, 3).failed([bad], HOW) == []
    assert Quarantine(path, 0).failed([bad], HOW) == []
