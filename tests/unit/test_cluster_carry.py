"""The cut a worker keeps across a rebalance: copied at the cut (later writes do not reach it),
messages and delayed messages by partition, and a partition taken from it only while its
changelog end offset is the one read after the cut committed."""

from __future__ import annotations

from statefun._keygroups import key_group_for
from statefun.cluster._carry import Carried, carry_cut
from statefun.cluster._changelog import TrackedMemoryState
from statefun.runtime._envelope import Envelope
from statefun.runtime._timers import DelayedEntry
from tests.unit._cluster import FN, int_value, small_config


def test_the_cut_is_copied_and_split_by_partition() -> None:
    config = small_config()
    state = TrackedMemoryState()
    ids = [f"k{i}" for i in range(20)]
    kg = {id_: key_group_for(FN, id_, config.max_parallelism) for id_ in ids}
    for id_ in ids:
        state.put(kg[id_], (FN, id_), {"n": int_value(1)})
    owned = [0, 1]
    messages = [Envelope(FN, id_, int_value(2), None) for id_ in ids]
    timers = [
        DelayedEntry(9, n, Envelope(FN, "k0", int_value(3), None), (FN, id_), "t")
        for n, id_ in enumerate(ids)
    ]
    carried = carry_cut(config, state.group, owned, messages, timers, 7)
    assert carried.generation == 7
    mine = {id_ for id_ in ids if config.partition_of(kg[id_]) in owned}
    assert 0 < len(mine) < len(ids)
    # written after the cut: not in it
    for id_ in ids:
        state.put(kg[id_], (FN, id_), {"n": int_value(5)})
    got = {key[1]: values["n"].value for g in carried.groups.values() for key, values in g.items()}
    assert got == dict.fromkeys(mine, bytes([8, 1]))
    assert set(carried.messages) == set(owned) == set(carried.timers)
    for partition in owned:
        assert [m.id for m in carried.messages[partition]] == [
            id_ for id_ in ids if config.partition_of(kg[id_]) == partition
        ]
        assert [e.sender[1] for e in carried.timers[partition]] == [
            id_ for id_ in ids if config.partition_of(kg[id_]) == partition
        ]


def test_only_partitions_whose_changelog_did_not_move_are_usable() -> None:
    carried = Carried(ends={0: 10, 1: 20, 2: 30})
    assert carried.usable([0, 1, 2, 3], {0: 10, 1: 21, 2: 30, 3: 0}) == [0, 2]
    assert carried.usable([1, 3], {1: 20}) == [1]
    assert carried.usable([0], {}) == []
