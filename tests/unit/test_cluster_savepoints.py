"""Savepoints and the changelog without a broker: a savepoint's contents become changelog
records that restore the same state, messages in flight and delayed messages (each in the
partition of its key group); a savepoint folder written from the changelog's contents reads
back as the single-process runtime reads one; input positions become the group's offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from statefun._exceptions import ConfigurationError
from statefun._keygroups import key_group_for
from statefun.checkpoint.storage import read_checkpoint
from statefun.checkpoint.verify import verify_files
from statefun.cluster._changelog import Restored, decode_records
from statefun.cluster._config import ClusterConfig
from statefun.cluster._exchange import partition_in_key
from statefun.cluster._savepoint_export import _positions, _write
from statefun.cluster._savepoints import (
    SEED_KEY,
    SavepointContents,
    input_offsets,
    read_savepoint,
    seed_rows,
)
from statefun.module._specs import (
    FunctionTarget,
    HttpEndpointSpec,
    KafkaIngressSpec,
    KafkaTopicSpec,
    ModuleSpec,
)
from statefun.runtime._envelope import Envelope
from tests.unit._cluster import FN, int_value, small_config, small_settings


def _contents(config: ClusterConfig) -> SavepointContents:
    kg = {i: key_group_for(FN, f"k{i}", config.max_parallelism) for i in range(6)}
    return SavepointContents(
        Path("sp"),
        state=[(kg[i], (FN, f"k{i}"), {"n": int_value(i)}) for i in range(6)],
        messages=[Envelope(FN, "k1", int_value(n), None) for n in range(3)]
        + [Envelope(FN, "k4", int_value(9), None)],
        timers=[(5_000, (FN, "k3"), "tok", Envelope(FN, "k2", int_value(7), None))],
        identity={"id": 3, "created_ms": 10, "metadata_crc32c": 11, "path": "sp"},
    )


def test_seed_rows_restore_the_savepoint_each_in_its_partition() -> None:
    config = small_config()
    contents = _contents(config)
    rows = seed_rows(config, contents)
    assert rows[0][1] == SEED_KEY  # first of partition 0
    assert {row[0] for row in rows} == {config.changelog_topic}
    for _, key, value, _ in rows[1:]:
        assert key is not None and value is not None
        parts = key.split(":")
        if parts[1] == "s":
            assert partition_in_key(key.encode()) == config.partition_of(int(parts[2]))
    restored = decode_records({str(k).encode(): v for _, k, v, _ in rows})
    assert sorted((key, values["n"].value) for _, key, values in restored.state) == sorted(
        ((FN, f"k{i}"), bytes([8, i])) for i in range(6)
    )
    # per address in order; k1's three before... whatever partition order, k1's stay in order
    assert [m.value.value for m in restored.messages if m.id == "k1"] == [
        bytes([8, n]) for n in range(3)
    ]
    assert sorted(m.id for m in restored.messages) == ["k1", "k1", "k1", "k4"]
    [(deadline, sender, token, envelope)] = restored.timers
    assert (deadline, sender, token, envelope.id) == (5_000, (FN, "k3"), "tok", "k2")


def test_a_written_savepoint_reads_back_as_one(tmp_path: Path) -> None:
    config = small_config()
    contents = _contents(config)
    restored = Restored(state=contents.state, messages=contents.messages, timers=contents.timers)
    module = ModuleSpec(
        endpoints=(
            HttpEndpointSpec(FunctionTarget("example", None), "http://127.0.0.1:1/{function.name}"),
        )
    )
    path = _write(small_settings(), restored, {"in": {"t:0": 5}}, tmp_path)
    assert path.parent == tmp_path and path.name.startswith("sp-")
    checkpoint = read_checkpoint(path)
    assert checkpoint.is_savepoint and verify_files(checkpoint) > 0
    back = read_savepoint(path, module, small_settings())
    assert sorted(back.state) == sorted(contents.state)
    assert [(m.id, m.value.value) for m in back.messages] == [
        (m.id, m.value.value) for m in contents.messages
    ]
    assert [(d, s, t, e.id) for d, s, t, e in back.timers] == [(5_000, (FN, "k3"), "tok", "k2")]
    assert back.positions == {"in": {"t:0": 5}}
    # state of a function type the module lost: refused unless dropped
    other = ModuleSpec(
        endpoints=(
            HttpEndpointSpec(
                FunctionTarget("elsewhere", None), "http://127.0.0.1:1/{function.name}"
            ),
        )
    )
    with pytest.raises(ConfigurationError, match=r"example/counter \(6 address\(es\)\)"):
        read_savepoint(path, other, small_settings())
    assert read_savepoint(path, other, small_settings(), allow_dropping_state=True).state == []


def _ingress(ingress_id: str, topic: str, startup: str = "earliest") -> KafkaIngressSpec:
    return KafkaIngressSpec(
        id=ingress_id,
        address="127.0.0.1:1",
        consumer_group_id="",
        topics=(KafkaTopicSpec(topic, "io.statefun.types/string", (FN,)),),
        startup_position=startup,  # type: ignore[arg-type]
    )


def test_positions_become_offsets_and_back() -> None:
    module = ModuleSpec(ingresses=(_ingress("a", "t"), _ingress("b", "u", "latest")))
    offsets = input_offsets(module, {"a": {"t:0": 4}, "b": {"u:1": 9}}, {"t": [0, 1], "u": [1]})
    assert offsets == {("t", 0): 4, ("t", 1): None, ("u", 1): 9}
    ends = {("t", 0): (0, 10), ("t", 1): (2, 10), ("u", 1): (0, 30), ("u", 2): (0, 40)}
    positions = _positions(module, {("t", 0): 4, ("u", 1): 9}, ends)
    # without a committed offset: the startup position (earliest: beginning; latest: end)
    assert positions == {"a": {"t:0": 4, "t:1": 2}, "b": {"u:1": 9, "u:2": 40}}
    twice = ModuleSpec(ingresses=(_ingress("a", "t"), _ingress("c", "t")))
    with pytest.raises(ConfigurationError, match="two positions for t:0"):
        input_offsets(twice, {"a": {"t:0": 4}, "c": {"t:0": 5}}, {"t": [0]})
