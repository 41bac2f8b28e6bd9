"""The clustered job's record encodings on the hot path: exchange messages gathered into
records, and changelog cut records left out when unchanged."""

from __future__ import annotations

import msgpack

from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.checkpoint._codec import envelope_row
from statefun.cluster._changelog import AddressPartitions, TrackedMemoryState, changelog_rows
from statefun.cluster._config import ClusterConfig, cluster_config
from statefun.cluster._exchange import (
    EXCHANGE_BATCH_BYTES,
    ExchangeBatches,
    decode_exchange,
    exchange_row,
    partition_in_key,
)
from statefun.runtime._envelope import Envelope
from statefun.sdk._spec import SdkAddress
from statefun.sdk._types import TypedValue


def _config() -> ClusterConfig:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": "127.0.0.1:9",
            "cluster.job_id": "codec",
            "cluster.worker_id": "w",
            "cluster.partitions": "8",
        },
        environ={},
    )
    config = cluster_config(settings)
    assert config is not None
    return config


def _message(n: int, caller: bool) -> Envelope:
    address = SdkAddress("ns", "from", f"c{n}", "ns/from") if caller else None
    value = TypedValue("io.statefun.types/int", bytes([n % 256]) * (n % 7)) if n % 5 else None
    return Envelope("ns/to", f"id-{n}", value or TypedValue("t/none", None), address)


def test_exchange_batches_keep_each_partitions_messages_in_order() -> None:
    config = _config()  # 8 partitions of 128 key groups
    batches = ExchangeBatches(config)
    sent: dict[int, list[str]] = {}
    for n in range(300):
        key_group = (n * 37) % config.max_parallelism
        assert batches.add(key_group, _message(n, n % 2 == 0)) is None  # (small: none full)
        sent.setdefault(config.partition_of(key_group), []).append(repr(_message(n, n % 2 == 0)))
    rows = batches.rows()
    assert batches.rows() == []  # taken
    assert sorted(key for _, key, _, _ in rows) == sorted(f"{p}:m" for p in sent)
    for topic, key, value, headers in rows:
        assert topic == config.exchange_topic and headers is None
        assert [repr(m) for m in decode_exchange(value)] == sent[partition_in_key(key.encode())]


def test_a_full_exchange_batch_is_a_record_of_its_own() -> None:
    config = _config()
    batches = ExchangeBatches(config)
    value = TypedValue("t/b", b"v" * 1000)
    full = []
    for n in range(200):  # ~1 kB each: 64 kB fill a record
        row = batches.add(0, Envelope("ns/to", f"id-{n}", value, None))
        if row is not None:
            full.append(row)
    assert full and all(len(row[2]) <= EXCHANGE_BATCH_BYTES for row in full)
    ids = [m.id for row in [*full, *batches.rows()] for m in decode_exchange(row[2])]
    assert ids == [f"id-{n}" for n in range(200)]
    big = Envelope("ns/to", "x", TypedValue("t/b", b"x" * 3_000_000), None)
    assert batches.add(0, big) is None
    (alone,) = batches.rows()
    assert decode_exchange(alone[2])[0].value.value == b"x" * 3_000_000


def test_an_exchange_record_of_one_bare_message_is_read() -> None:
    message = _message(3, True)
    bare = msgpack.packb(envelope_row(message), use_bin_type=True)
    assert [repr(m) for m in decode_exchange(bare)] == [repr(message)]


def test_exchange_row_names_the_partition_of_its_key_group() -> None:
    config = _config()
    for key_group in range(config.max_parallelism):
        topic, key, value, _ = exchange_row(config, key_group, _message(1, True))
        assert topic == config.exchange_topic
        assert key == f"{config.partition_of(key_group)}:m"
        assert [repr(m) for m in decode_exchange(value)] == [repr(_message(1, True))]


def _cuts(rows: list[tuple[str, str, bytes, object]]) -> dict[str, bytes]:
    return {key: value for _, key, value, _ in rows if key.endswith(":c")}


def test_an_unchanged_cut_is_not_written_again() -> None:
    config = _config()
    state = TrackedMemoryState()
    owned = [0, 1, 2]
    last: dict[int, bytes] = {}
    first = changelog_rows(config, state, set(), [], [], owned, last)
    assert sorted(_cuts(first)) == ["0:c", "1:c", "2:c"]
    assert changelog_rows(config, state, set(), [], [], owned, last) == []
    # a message in flight in key group 20 (partition 1): only that partition's cut changes
    message = Envelope("ns/to", "a", TypedValue("t/v", b"1"), None)
    partition = config.partition_of(key_group_for("ns/to", "a", config.max_parallelism))
    if partition not in owned:
        owned.append(partition)
    rows = changelog_rows(config, state, set(), [message], [], owned, last)
    cuts = _cuts(rows)
    assert list(cuts) == [f"{partition}:c"]
    assert msgpack.unpackb(cuts[f"{partition}:c"])[0] != msgpack.unpackb(first[0][2])[0]
    # the message gone: its partition's cut is written again (empty), the others not
    rows = changelog_rows(config, state, set(), [], [], owned, last)
    assert list(_cuts(rows)) == [f"{partition}:c"]
    # without last_cuts every owned partition's cut is written, every time
    assert len(_cuts(changelog_rows(config, state, set(), [], [], owned))) == len(set(owned))


def test_changed_state_is_written_with_the_addresses_values() -> None:
    config = _config()
    state = TrackedMemoryState()
    value = {"count": TypedValue("io.statefun.types/int", b"\x08\x01")}
    state.put(3, ("ns/to", "a"), value)
    state.put(100, ("ns/to", "b"), value)
    state.put(3, ("ns/to", "c"), {})
    rows = changelog_rows(config, state, state.take_changed(), [], [], [0], {})
    states = {key: v for _, key, v, _ in rows if ":s:" in key}
    assert set(states) == {"0:s:3:ns/to\x1fa", "0:s:3:ns/to\x1fc"}  # partition 6 not owned
    assert states["0:s:3:ns/to\x1fc"] is None  # a tombstone: compaction deletes the key
    assert state.take_changed() == set()


def test_address_partitions_are_the_key_groups_partitions() -> None:
    config = _config()
    addresses = AddressPartitions(config, limit=50)  # forgotten twice over
    for n in [*range(120), *range(120)]:
        expected = config.partition_of(key_group_for("ns/to", f"id-{n}", config.max_parallelism))
        assert addresses.of("ns/to", f"id-{n}") == expected
