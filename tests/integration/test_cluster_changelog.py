"""The changelog on a real broker: what committed checkpoints wrote comes back, the latest
record of each address and each partition's latest cut; an aborted checkpoint's records and
other partitions' do not."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest

from statefun._keygroups import key_group_for
from statefun._settings import Settings
from statefun.cluster import ClusterConfig, cluster_config, ensure_topics
from statefun.cluster._carry import Carried
from statefun.cluster._changelog import (
    TrackedMemoryState,
    changelog_rows,
    read_changelog,
    restore_partitions,
)
from statefun.cluster._exchange import WorkerTransactions
from statefun.runtime._envelope import Envelope
from statefun.runtime._timers import DelayedEntry
from statefun.sdk._types import TypedValue

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]
FN = "example/counter"


@pytest.fixture
def config(bootstrap: str) -> ClusterConfig:
    settings = Settings.load(
        {
            "cluster.bootstrap_servers": bootstrap,
            "cluster.job_id": f"changelog-{uuid.uuid4().hex[:8]}",
            "cluster.worker_id": "w0",
            "cluster.partitions": "4",
            "max_parallelism": "8",
        },
        environ={},
    )
    made = cluster_config(settings)
    assert made is not None
    ensure_topics(made)
    return made


def _int(n: int) -> TypedValue:
    return TypedValue("io.statefun.types/int", bytes([8, n]))


def _kg(id_: str, config: ClusterConfig) -> int:
    return key_group_for(FN, id_, config.max_parallelism)


def test_committed_checkpoints_come_back_aborted_ones_do_not(config: ClusterConfig) -> None:
    ids = [f"k{i}" for i in range(12)]
    partitions = list(range(config.partitions))
    state = TrackedMemoryState()
    message = Envelope(FN, "k1", _int(7), None)
    timer = DelayedEntry(1_000, 0, Envelope(FN, "k2", _int(9), None), (FN, "k3"), "t")

    async def scenario() -> None:
        tx = WorkerTransactions(config)
        await tx.start()
        try:
            for id_ in ids:
                state.put(_kg(id_, config), (FN, id_), {"n": _int(1)})
            rows = changelog_rows(
                config, state, state.take_changed(), [message], [timer], partitions
            )
            tx.write_rows(rows)
            assert tx.seal(1, {}, None)
            await tx.commit(1)
            # checkpoint 2: k0 changes, k1 loses its state, the cut is empty
            state.put(_kg("k0", config), (FN, "k0"), {"n": _int(2)})
            state.put(_kg("k1", config), (FN, "k1"), {})
            rows = changelog_rows(config, state, state.take_changed(), [], [], partitions)
            assert len(rows) == 2 + config.partitions
            tx.write_rows(rows)
            assert tx.seal(2, {}, None)
            await tx.commit(2)
            # checkpoint 3 never commits
            state.put(_kg("k0", config), (FN, "k0"), {"n": _int(3)})
            tx.write_rows(
                changelog_rows(config, state, state.take_changed(), [message], [], partitions)
            )
            await tx.flush()
        finally:
            await tx.close()  # aborts checkpoint 3's transaction

    asyncio.run(scenario())
    restored = restore_partitions(config, partitions)
    got = {key: values["n"].value for _, key, values in restored.state}
    assert got == {(FN, id_): bytes([8, 2 if id_ == "k0" else 1]) for id_ in ids if id_ != "k1"}
    assert all(kg == _kg(key[1], config) for kg, key, _ in restored.state)
    assert restored.messages == [] and restored.timers == []

    # k1's state is gone as a Kafka tombstone (value None), which compaction deletes
    k1 = f"{config.partition_of(_kg('k1', config))}:s:{_kg('k1', config)}:{FN}\x1fk1".encode()
    latest, _ = read_changelog(config, partitions)
    assert k1 in latest and latest[k1] is None

    # only the partitions asked for
    one = config.partition_of(_kg("k0", config))
    only = restore_partitions(config, [one])
    assert {key for _, key, _ in only.state} == {
        (FN, id_) for id_ in ids if id_ != "k1" and config.partition_of(_kg(id_, config)) == one
    }


def test_the_cut_keeps_messages_and_timers_by_partition(config: ClusterConfig) -> None:
    state = TrackedMemoryState()
    messages = [Envelope(FN, "k1", _int(n), None) for n in range(3)]
    timer = DelayedEntry(1_000, 0, Envelope(FN, "k2", _int(9), None), (FN, "k3"), "tok")
    partitions = list(range(config.partitions))

    async def scenario() -> None:
        tx = WorkerTransactions(config)
        await tx.start()
        try:
            tx.write_rows(changelog_rows(config, state, set(), messages, [timer], partitions))
            assert tx.seal(1, {}, None)
            await tx.commit(1)
        finally:
            await tx.close()

    asyncio.run(scenario())
    restored = restore_partitions(config, partitions)
    assert [(m.id, m.value.value) for m in restored.messages] == [
        ("k1", bytes([8, n])) for n in range(3)
    ]
    assert [(d, s, t, e.id) for d, s, t, e in restored.timers] == [(1_000, (FN, "k3"), "tok", "k2")]
    sender_partition = config.partition_of(_kg("k3", config))
    others = [p for p in partitions if p != sender_partition]
    assert restore_partitions(config, others).timers == []
    assert restore_partitions(config, [sender_partition]).timers != []


def test_a_kept_partition_is_read_again_once_its_changelog_moved(config: ClusterConfig) -> None:
    """A worker takes a partition from its carried cut only while the changelog partition's
    end offset (read_committed) is the one read after the cut: a commit or an abort by anyone
    since moves it."""
    from statefun.cluster._carry import changelog_ends
    from statefun.cluster._worker import Epoch
    from statefun.module._specs import ModuleSpec

    partitions = list(range(config.partitions))
    carried = Carried(ends=changelog_ends(config, partitions), generation=4)
    member = SimpleNamespace(generation=5)  # the next generation
    epoch = Epoch(ModuleSpec(), Settings(), config, member, partitions, [], carried)  # type: ignore[arg-type]

    async def write(commit: bool, partition: int) -> None:
        tx = WorkerTransactions(config)
        await tx.start()
        try:
            state = TrackedMemoryState()
            tx.write_rows(changelog_rows(config, state, set(), [], [], [partition]))
            # sealed: its records acknowledged, so its transaction holds the partition (a
            # transaction aborted before its records were sent may never have touched it)
            assert tx.seal(1, {}, None)
            if commit:
                await tx.commit(1)
        finally:
            await tx.close()  # aborts what did not commit (after the seal's acknowledgements)

    assert asyncio.run(epoch._kept()) == partitions
    asyncio.run(write(True, 1))
    asyncio.run(write(False, 2))
    # (the broker writes the transactions' markers after; on a loaded machine the abort at
    # close can take seconds)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ends = changelog_ends(config, [1, 2])
        if ends[1] != carried.ends[1] and ends[2] != carried.ends[2]:
            break
        time.sleep(0.1)
    assert asyncio.run(epoch._kept()) == [p for p in partitions if p not in (1, 2)]
    # a generation went by without this worker: nothing is taken from memory
    epoch.generation = 6
    assert asyncio.run(epoch._kept()) == []
