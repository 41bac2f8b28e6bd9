"""How long and how many idempotency keys a clustered job keeps: per key group, oldest first.

The keys are the state of ``pystatefun.http/idempotency`` addresses (``_keys.py``), so each
lives in its key group and moves with it. ``KeyRetention`` indexes, per key group, the keys the
worker's job holds (key id -> when first seen, bytes of its recorded reply), in the order they
were first seen. Each time the key function runs for a key it updates the key's entry
(``seen``) and then deletes, in that key group, the keys whose retention ended and the oldest
past the key group's share of the bounds (``http_idempotency_max_keys`` and
``http_idempotency_max_reply_bytes`` divided by ``max_parallelism``, rounded up). A deletion is
a ``put`` of no values: the next checkpoint writes the tombstone into the changelog, so
compaction drops the key from Kafka too.

A key group's index is built from the state when the key function first runs in it, or when
the sweep reaches it (after an assignment the state is the changelog's or the carried cut's);
the deleted keys are other addresses than the one the function runs for, and embedded
functions run one at a time on the event loop, so no invocation of theirs is in flight.

Expiry needs no traffic: ``sweep(now_ms, budget)`` goes round the key groups the worker owns
(``key_groups``), from where the previous sweep stopped, and deletes their expired keys, oldest
first, at most ``budget`` units of work (an address read to index a key group, a key deleted;
a key group is indexed whole, so one larger than the budget costs its size once). The index
keeps each key group's keys oldest first, so an indexed key group with nothing expired costs
one look. ``KeySweep`` runs it every ``interval_ms`` of the job's clock on the event loop
(between two loop steps, so never inside an invocation); the deletions are state changes like
the key function's, so the next checkpoint's transaction writes their tombstones: a sweep is
exactly-once with the checkpoint, and one lost with a worker is done again by the key group's
next owner. A request for an expired key the sweep has not reached finds it expired all the
same (``decide`` checks).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from statefun._keygroups import key_group_for
from statefun.cluster._keys import KEY_TYPENAME, KeyMessageError, Record, decode_record

__all__ = ["SWEEP_BUDGET", "SWEEP_INTERVAL_MS", "KeyRetention", "KeySweep"]

log = logging.getLogger(__name__)

#: how often a worker sweeps its key groups for expired keys, and the work of one sweep
SWEEP_INTERVAL_MS = 1_000
SWEEP_BUDGET = 2_000


class _State(Protocol):
    def put(self, key_group: int, key: tuple[str, str], values: Any) -> None: ...
    def items(self, key_group: int) -> Any: ...


class _Group:
    __slots__ = ("bytes", "keys")

    def __init__(self) -> None:
        #: key id -> (first seen ms, reply bytes), first seen first
        self.keys: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.bytes = 0


def _size(record: Record) -> int:
    result = record.result
    return len(result[2]) if isinstance(result, tuple) else 0


class KeyRetention:
    """The keys of one job, per key group (see the module)."""

    def __init__(
        self,
        state: _State,
        max_parallelism: int,
        retention_ms: int,
        max_keys: int,
        max_reply_bytes: int,
        key_groups: Sequence[int] = (),
    ) -> None:
        self._state = state
        self._max_p = max_parallelism
        #: the key groups the sweep goes round (the worker's), and where it goes on
        self.key_groups = list(key_groups)
        self._cursor = 0
        self.retention_ms = retention_ms
        #: each key group's share of the bounds
        self.max_keys = max(1, -(-max_keys // max_parallelism))
        self.max_reply_bytes = max(1, -(-max_reply_bytes // max_parallelism))
        self._groups: dict[int, _Group] = {}
        #: keys deleted: their retention ended / past a bound
        self.expired = 0
        self.evicted = 0

    def seen(self, key_id: str, record: Record | None, now_ms: int) -> None:
        """The key function decided about ``key_id``: its record is ``record`` now (None:
        none). Then the key group's expired keys and those past its bounds are deleted."""
        key_group = key_group_for(KEY_TYPENAME, key_id, self._max_p)
        group = self._groups.get(key_group)
        if group is None:
            group = self._groups[key_group] = self._scan(key_group)[0]
        keys = group.keys
        old = keys.get(key_id)
        if old is not None:
            group.bytes -= old[1]
        if record is None:
            keys.pop(key_id, None)
        else:
            size = _size(record)
            keys[key_id] = (record.accepted_ms, size)
            group.bytes += size
            if old is not None and old[0] != record.accepted_ms:
                keys.move_to_end(key_id)  # seen anew after it expired
        self._trim(key_group, group, key_id, now_ms - self.retention_ms)

    def sweep(self, now_ms: int, budget: int = SWEEP_BUDGET) -> int:
        """Delete expired keys of the owned key groups, round from where the last sweep
        stopped, within ``budget`` (see the module); how many were deleted."""
        owned = self.key_groups
        cutoff = now_ms - self.retention_ms
        work = deleted = 0
        for _ in range(len(owned)):
            if work >= budget:
                break
            key_group = owned[self._cursor]
            group = self._groups.get(key_group)
            if group is None:
                group, scanned = self._scan(key_group)
                self._groups[key_group] = group
                work += scanned
            keys = group.keys
            while keys and work < budget:
                oldest, (first_ms, size) = next(iter(keys.items()))
                if first_ms > cutoff:
                    break
                self._delete(key_group, group, oldest, size)
                self.expired += 1
                deleted += 1
                work += 1
            if keys and work >= budget and next(iter(keys.values()))[0] <= cutoff:
                break  # (more expired here: the next sweep starts with this key group)
            self._cursor = (self._cursor + 1) % len(owned)
        return deleted

    def _delete(self, key_group: int, group: _Group, key: str, size: int) -> None:
        del group.keys[key]
        group.bytes -= size
        self._state.put(key_group, (KEY_TYPENAME, key), {})

    def _trim(self, key_group: int, group: _Group, current: str, cutoff_ms: int) -> None:
        keys = group.keys
        while keys:
            oldest, (first_ms, size) = next(iter(keys.items()))
            if oldest == current:
                break  # (the function is writing its record: never deleted under it)
            if first_ms > cutoff_ms:
                if len(keys) <= self.max_keys and group.bytes <= self.max_reply_bytes:
                    break
                self.evicted += 1
            else:
                self.expired += 1
            self._delete(key_group, group, oldest, size)

    def _scan(self, key_group: int) -> tuple[_Group, int]:
        """The index of ``key_group`` from its state (an unreadable record: oldest of all),
        and how many addresses were read."""
        found: list[tuple[int, str, int]] = []
        read = 0
        for (typename, id_), values in self._state.items(key_group):
            read += 1
            if typename != KEY_TYPENAME:
                continue
            stored: Any = values.get("record") if values else None
            try:
                record = decode_record(bytes(stored.value))
            except (KeyMessageError, AttributeError, TypeError):
                found.append((0, id_, 0))
                continue
            found.append((record.accepted_ms, id_, _size(record)))
        group = _Group()
        for first_ms, id_, size in sorted(found):
            group.keys[id_] = (first_ms, size)
            group.bytes += size
        return group, read

    def __len__(self) -> int:
        return sum(len(group.keys) for group in self._groups.values())


class KeySweep:
    """``retention.sweep`` every ``interval_ms`` of ``clock`` (ms), from ``tick`` (see the
    module); ``run`` ticks on the event loop until cancelled."""

    def __init__(
        self,
        retention: KeyRetention,
        clock: Callable[[], int],
        interval_ms: int = SWEEP_INTERVAL_MS,
        budget: int = SWEEP_BUDGET,
    ) -> None:
        self.retention = retention
        self._clock = clock
        self.interval_ms = interval_ms
        self.budget = budget
        self._next_ms = clock() + interval_ms
        self.deleted = 0

    def tick(self) -> int:
        """Sweep when due; how many keys were deleted."""
        now = self._clock()
        if now < self._next_ms:
            return 0
        self._next_ms = now + self.interval_ms
        deleted = self.retention.sweep(now, self.budget)
        self.deleted += deleted
        if deleted:
            log.debug("idempotency keys: %d expired key(s) deleted", deleted)
        return deleted

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            self.tick()
