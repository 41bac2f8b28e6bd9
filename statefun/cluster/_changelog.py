"""The changelog: a clustered job's durable state, per partition of its internal topics.

Each checkpoint of a worker writes, in its transaction (``_exchange.WorkerTransactions``), for
every partition it owns:

* one record per address whose state changed since the previous checkpoint: key
  ``<partition>:s:<key group>:<typename>\\x1f<id>``, value the address's values
  (``state/_codec.py``'s encoding), or a tombstone (value None) when the address has no state
  any more, so that compaction deletes the key (an empty value, written before, still reads as
  no state);
* one *cut* record, key ``<partition>:c``: the partition's messages in flight at the cut
  (per address in processing order) and its pending delayed messages (kept with the sender's
  key group: a cancellation comes from the sender, which runs where its key group is); left
  out when it is the one the worker wrote at its previous checkpoint (so a partition where
  nothing happened is not in the transaction, and gets no commit marker).

The topic is compacted, so it keeps the latest record of each key: the latest state of each
address and the latest cut of each partition. A worker that is assigned a partition reads it
from the beginning to its end (``read_committed``: the end is the last stable offset, so no
record of an open transaction is taken) with ``restore_partitions``; the last record of each
key wins. ``TrackedMemoryState`` is the memory backend that remembers which addresses changed
(its ``put`` adds one set insertion; only clustered jobs use it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from statefun._kafka import import_kafka
from statefun._keygroups import key_group_for
from statefun.checkpoint._codec import (
    decode_envelopes,
    decode_timers,
    encode_envelopes,
    encode_timers,
)
from statefun.cluster._config import ClusterConfig
from statefun.egress.kafka import Row
from statefun.runtime._envelope import Envelope
from statefun.runtime._timers import DelayedEntry
from statefun.state._codec import decode_values, values_to_wire
from statefun.state.base import AddressKey, StateValues
from statefun.state.memory import MemoryStateBackend

__all__ = [
    "AddressPartitions",
    "Restored",
    "TrackedMemoryState",
    "TrackedState",
    "changelog_reader",
    "changelog_rows",
    "decode_records",
    "read_changelog",
    "restore_partitions",
]

_SEPARATOR = "\x1f"
_memory_put = MemoryStateBackend.put
#: one packer for the event loop's encodings (``packb`` makes a packer per call)
_PACK = msgpack.Packer(use_bin_type=True).pack


class TrackedMemoryState(MemoryStateBackend):
    """The memory backend, remembering the addresses written since ``take_changed``."""

    def __init__(self) -> None:
        super().__init__()
        self._changed: set[tuple[int, AddressKey]] = set()

    def put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        _memory_put(self, key_group, key, values)
        self._changed.add((key_group, key))

    def restore_put(self, key_group: int, key: AddressKey, values: StateValues) -> None:
        """``put`` of a restored value: not a change to write to the changelog again."""
        MemoryStateBackend.put(self, key_group, key, values)

    def group(self, key_group: int) -> Mapping[AddressKey, StateValues]:
        """The addresses of ``key_group`` and their values, as held now (read, do not keep:
        the next ``put`` may change it)."""
        return self._groups.get(key_group) or {}

    def take_changed(self) -> set[tuple[int, AddressKey]]:
        """The (key group, address) pairs written since the last call; forgets them."""
        changed, self._changed = self._changed, set()
        return changed

    def drop_key_groups(self, key_groups: Iterable[int]) -> None:
        """Forget the state of ``key_groups`` (their partition went to another worker)."""
        for key_group in key_groups:
            for key, _ in self.items(key_group):
                MemoryStateBackend.put(self, key_group, key, {})
            self._changed = {c for c in self._changed if c[0] != key_group}


class AddressPartitions:
    """The internal topics' partition of each address, computed once per address (a cut
    places every message in flight by its address; under load most addresses come again at
    the next cut). Bounded: forgotten whole when full, as the router's cache of key groups."""

    def __init__(self, config: ClusterConfig, limit: int = 100_000) -> None:
        self._parts, self._max_p = config.partitions, config.max_parallelism
        self._limit = limit
        self._known: dict[tuple[str, str], int] = {}

    def of(self, typename: str, id_: str) -> int:
        address = (typename, id_)
        partition = self._known.get(address)
        if partition is None:
            if len(self._known) >= self._limit:
                self._known.clear()
            key_group = key_group_for(typename, id_, self._max_p)
            partition = self._known[address] = key_group * self._parts // self._max_p
        return partition


class TrackedState(Protocol):
    """What ``changelog_rows`` reads of a state that remembers the addresses it wrote."""

    def get(self, key_group: int, key: AddressKey) -> StateValues | None: ...


def changelog_rows(
    config: ClusterConfig,
    state: TrackedState,
    changed: Iterable[tuple[int, AddressKey]],
    messages: Iterable[Envelope],
    timers: Iterable[DelayedEntry],
    partitions: Iterable[int],
    last_cuts: dict[int, bytes] | None = None,
    addresses: AddressPartitions | None = None,
) -> list[Row]:
    """The changelog records of one checkpoint's cut, for the partitions this worker owns:
    the state of the addresses in ``changed`` as it is now, and each partition's cut.

    ``last_cuts`` (partition -> the cut record's value this worker wrote last, kept by the
    caller across its checkpoints): a partition whose cut is the same again gets no new cut
    record (the changelog's latest is that one), so an idle partition is left out of the
    transaction; the dict is updated with the cuts written. ``addresses``: the caller's cache
    of the partitions of addresses, kept across its checkpoints."""
    topic = config.changelog_topic
    owned = set(partitions)
    max_p, parts = config.max_parallelism, config.partitions
    get = state.get
    rows: list[Row] = []
    append = rows.append
    for key_group, key in changed:
        partition = key_group * parts // max_p
        if partition not in owned:
            continue
        values = get(key_group, key)
        name = f"{partition}:s:{key_group}:{key[0]}{_SEPARATOR}{key[1]}"
        append((topic, name, _PACK(values_to_wire(values)) if values else None, None))
    partition_of = (addresses or AddressPartitions(config)).of
    in_flight: dict[int, list[Envelope]] = {p: [] for p in owned}
    for envelope in messages:
        partition = partition_of(envelope.typename, envelope.id)
        if partition in in_flight:
            in_flight[partition].append(envelope)
    delayed: dict[int, list[DelayedEntry]] = {p: [] for p in owned}
    for entry in timers:
        partition = partition_of(*entry.sender)
        if partition in delayed:
            delayed[partition].append(entry)
    for partition in sorted(owned):
        value = _PACK([encode_envelopes(in_flight[partition]), encode_timers(delayed[partition])])
        if last_cuts is not None:
            if last_cuts.get(partition) == value:
                continue
            last_cuts[partition] = value
        append((topic, f"{partition}:c", value, None))
    return rows


@dataclass
class Restored:
    """What the changelog holds for some partitions."""

    #: (key group, address, values) of every address with state
    state: list[tuple[int, AddressKey, dict[str, Any]]] = field(default_factory=list)
    #: the cuts' messages in flight, per address in processing order
    messages: list[Envelope] = field(default_factory=list)
    #: the cuts' delayed messages: (deadline ms, sender, token, message)
    timers: list[tuple[int, AddressKey, str, Envelope]] = field(default_factory=list)
    records: int = 0


def restore_partitions(
    config: ClusterConfig, partitions: Iterable[int], timeout_s: float = 60.0
) -> Restored:
    """Read the changelog of ``partitions`` to its end (blocking: a worker thread)."""
    latest, records = read_changelog(config, partitions, timeout_s)
    restored = decode_records(latest)
    restored.records = records
    return restored


def read_changelog(
    config: ClusterConfig,
    partitions: Iterable[int],
    timeout_s: float = 60.0,
    client: str = "restore",
) -> tuple[dict[bytes, bytes | None], int]:
    """The last record of each key of ``partitions`` (read ``read_committed`` from the
    beginning to the end; blocking) and how many records were read."""
    kafka = import_kafka()
    wanted = [kafka.TopicPartition(config.changelog_topic, p) for p in sorted(set(partitions))]
    latest: dict[bytes, bytes | None] = {}
    if not wanted:
        return latest, 0
    reader = changelog_reader(config, client)
    records = 0
    try:
        reader.assign(wanted)
        reader.seek_to_beginning(*wanted)
        ends = reader.end_offsets(wanted)
        deadline = time.monotonic() + timeout_s
        while any(reader.position(tp) < ends[tp] for tp in wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cluster: the changelog {config.changelog_topic} was not read to its end "
                    f"in {timeout_s:.0f} s"
                )
            for batch in reader.poll(timeout_ms=200, max_records=10_000).values():
                for record in batch:
                    records += 1
                    latest[record.key] = record.value
    finally:
        reader.close(autocommit=False)
    return latest, records


def changelog_reader(config: ClusterConfig, client: str) -> Any:
    """A consumer without a group for reading the changelog (``read_committed``; the caller
    assigns it partitions and closes it)."""
    kafka = import_kafka()
    reader = kafka.KafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id=f"pystatefun-{config.worker_id}-{client}",
    )
    from statefun.ingress._kafka_fetch import install

    install(reader)  # the ingress's lean reader of fetched batches, when it fits
    return reader


def decode_records(latest: Mapping[bytes, bytes | None]) -> Restored:
    """What the last records of changelog keys hold: an address's state (none for a tombstone
    or an empty value), a partition's cut; records of other kinds (``<partition>:seed``, the
    savepoint a job was seeded from) are not the job's state and are skipped."""
    restored = Restored()
    for key, value in latest.items():
        parts = key.decode("utf-8").split(":", 2)
        kind = parts[1]
        if kind == "s":
            if not value:
                continue
            group, address = parts[2].split(":", 1)
            typename, id_ = address.split(_SEPARATOR, 1)
            restored.state.append((int(group), (typename, id_), decode_values(value)))
        elif kind == "c" and value:
            messages, timers = msgpack.unpackb(value, raw=False)
            restored.messages.extend(decode_envelopes(messages))
            restored.timers.extend(decode_timers(timers))
    return restored
