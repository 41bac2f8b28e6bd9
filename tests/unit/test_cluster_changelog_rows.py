"""The changelog's records without a broker: an address without state any more is a tombstone
(value None, which compaction deletes), and reading the last records back treats a tombstone
(and the empty value older workers wrote) as no state."""

from __future__ import annotations

from statefun._keygroups import key_group_for
from statefun.cluster._changelog import TrackedMemoryState, changelog_rows, decode_records
from statefun.runtime._envelope import Envelope
from tests.unit._cluster import FN, int_value, small_config


def test_a_cleared_address_is_a_tombstone_and_restores_as_no_state() -> None:
    config = small_config()
    state = TrackedMemoryState()
    kg = {id_: key_group_for(FN, id_, config.max_parallelism) for id_ in ("a", "b")}
    state.put(kg["a"], (FN, "a"), {"n": int_value(1)})
    state.put(kg["b"], (FN, "b"), {"n": int_value(2)})
    partitions = range(config.partitions)
    first = changelog_rows(config, state, state.take_changed(), [], [], partitions)
    state.put(kg["b"], (FN, "b"), {})
    second = changelog_rows(config, state, state.take_changed(), [], [], partitions)
    state_rows = [row for row in second if ":s:" in str(row[1])]
    assert len(state_rows) == 1
    _, key, value, _ = state_rows[0]
    assert key == f"{config.partition_of(kg['b'])}:s:{kg['b']}:{FN}\x1fb"
    assert value is None  # a tombstone, not b""
    # the last record of each key, as a compacted read gives it
    latest: dict[bytes, bytes | None] = {}
    for _, key, value, _ in [*first, *second]:
        assert key is not None
        latest[key.encode()] = value
    restored = decode_records(latest)
    assert [(k, v["n"].value) for _, k, v in restored.state] == [((FN, "a"), bytes([8, 1]))]
    # an empty value (written by earlier versions) is no state either
    latest[f"{config.partition_of(kg['b'])}:s:{kg['b']}:{FN}\x1fb".encode()] = b""
    assert [k for _, k, _ in decode_records(latest).state] == [(FN, "a")]


def test_cut_records_and_unknown_kinds() -> None:
    config = small_config()
    message = Envelope(FN, "k1", int_value(7), None)
    rows = changelog_rows(
        config, TrackedMemoryState(), set(), [message], [], range(config.partitions)
    )
    latest: dict[bytes, bytes | None] = {str(k).encode(): v for _, k, v, _ in rows}
    latest[b"0:seed"] = b'{"savepoint": "x"}'  # not state: skipped
    restored = decode_records(latest)
    assert [(m.id, m.value.value) for m in restored.messages] == [("k1", bytes([8, 7]))]
    assert restored.state == [] and restored.timers == []
