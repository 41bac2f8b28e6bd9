"""Partitions a worker keeps across a rebalance: taken from memory instead of the changelog.

The group's eager protocol revokes every partition of a worker at each rebalance; the worker
checkpoints (commits) and drops its epoch, and the next assignment often gives some of the same
partitions back. Their state then needs no read of the changelog: the revoke's cut is what the
changelog holds for them - if nothing was written to their changelog partitions since.

``Carried`` is that cut: per key group the addresses' values (shallow copies of the key
groups' dicts at the cut: values dicts are replaced, never changed in place), per partition
its messages in flight and delayed messages, the group generation of the epoch, and the
changelog partitions' end offsets (``read_committed``) read after the revoke's checkpoint. At
the next assignment, a partition is taken from it only if both hold:

* the new assignment's generation is the next one: no generation went by without this
  worker (one does when its session expired, a paused worker's), in which another worker may
  have owned the partition. Within the cut's generation the worker alone owned it: its epoch
  started from the changelog after any older owner's transaction was resolved (the committed
  offset fetch waits for it), an older owner cannot commit in this generation (KIP-447), and
  the revoke's own cut is what the worker's last commit wrote, or what it held unchanged since;
* the changelog partition's end offset is still the carried one: any commit or abort on it
  since moves it (defence in depth; also when the revoke's own commit marker was not written
  yet as the ends were read, which costs a read of the changelog, not correctness).

Every other partition is read from the changelog as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from statefun._kafka import import_kafka
from statefun._keygroups import key_group_for
from statefun.cluster._config import ClusterConfig
from statefun.runtime._envelope import Envelope
from statefun.runtime._timers import DelayedEntry
from statefun.state.base import AddressKey, StateValues

__all__ = ["Carried", "carry_cut", "changelog_ends"]

log = logging.getLogger(__name__)


@dataclass
class Carried:
    """An epoch's last cut, for partitions the worker may be assigned again."""

    #: key group -> {address: values} at the cut
    groups: dict[int, dict[AddressKey, StateValues]] = field(default_factory=dict)
    #: partition -> its messages in flight at the cut, per address in processing order
    messages: dict[int, list[Envelope]] = field(default_factory=dict)
    #: partition -> the delayed messages its key groups sent, pending at the cut
    timers: dict[int, list[DelayedEntry]] = field(default_factory=dict)
    #: partition -> the changelog's end offset (``read_committed``) after the cut committed
    ends: dict[int, int] = field(default_factory=dict)
    #: the group generation the cut was taken in
    generation: int = -1

    def usable(self, partitions: Iterable[int], ends: dict[int, int]) -> list[int]:
        """Of ``partitions``, those whose changelog end offset is still the carried one (the
        caller checks the generation)."""
        return sorted(p for p in partitions if p in self.ends and ends.get(p) == self.ends[p])


def carry_cut(
    config: ClusterConfig,
    group: Callable[[int], Mapping[AddressKey, StateValues]],
    partitions: Iterable[int],
    messages: Iterable[Envelope],
    timers: Iterable[DelayedEntry],
    generation: int,
) -> Carried:
    """The cut of ``partitions`` (``group``: a key group's addresses, as the state holds them
    now; copied here, at the cut)."""
    owned = set(partitions)
    carried = Carried(
        messages={p: [] for p in owned}, timers={p: [] for p in owned}, generation=generation
    )
    for partition in owned:
        for key_group in config.key_groups_of(partition):
            addresses = group(key_group)
            if addresses:
                carried.groups[key_group] = dict(addresses)
    max_p = config.max_parallelism
    for envelope in messages:
        partition = config.partition_of(key_group_for(envelope.typename, envelope.id, max_p))
        if partition in owned:
            carried.messages[partition].append(envelope)
    for entry in timers:
        partition = config.partition_of(key_group_for(*entry.sender, max_p))
        if partition in owned:
            carried.timers[partition].append(entry)
    return carried


def changelog_ends(config: ClusterConfig, partitions: Iterable[int]) -> dict[int, int]:
    """The changelog partitions' end offsets as a ``read_committed`` reader sees them
    (blocking: a worker thread)."""
    kafka = import_kafka()
    wanted = [kafka.TopicPartition(config.changelog_topic, p) for p in sorted(set(partitions))]
    if not wanted:
        return {}
    reader = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        client_id=f"pystatefun-{config.worker_id}-ends",
    )
    try:
        return {tp.partition: int(o) for tp, o in reader.end_offsets(wanted).items()}
    finally:
        reader.close(autocommit=False)
