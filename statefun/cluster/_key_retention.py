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

A key group's index is built from the state when the key function first runs in it (after an
assignment the state is the changelog's or the carried cut's); the deleted keys are other
addresses than the one the function runs for, and embedded functions run one at a time on the
event loop, so no invocation of theirs is in flight. An expired key no later request touched
is deleted by the next key function run in its key group (with no traffic at all, it stays,
within the bounds; a request for it finds it expired all the same: ``decide`` checks).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

from statefun._keygroups import key_group_for
from statefun.cluster._keys import KEY_TYPENAME, KeyMessageError, Record, decode_record

__all__ = ["KeyRetention"]


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
    ) -> None:
        self._state = state
        self._max_p = max_parallelism
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
            group = self._groups[key_group] = self._scan(key_group)
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
            del keys[oldest]
            group.bytes -= size
            self._state.put(key_group, (KEY_TYPENAME, oldest), {})

    def _scan(self, key_group: int) -> _Group:
        """The index of ``key_group`` from its state (an unreadable record: oldest of all)."""
        found: list[tuple[int, str, int]] = []
        for (typename, id_), values in self._state.items(key_group):
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
        return group

    def __len__(self) -> int:
        return sum(len(group.keys) for group in self._groups.values())
